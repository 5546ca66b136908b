"""rlhf_lab.util.validation: fields that declare their constraints, one validator that reads them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

from rlhf_lab.model import ModelConfig
from rlhf_lab.preferences.dpo import DPOConfig
from rlhf_lab.preferences.reward_model import RewardConfig
from rlhf_lab.rl import ALGORITHMS, make_config
from rlhf_lab.sampling import SamplingConfig
from rlhf_lab.sampling.beam import BeamSearchConfig
from rlhf_lab.sft import SFTConfig
from rlhf_lab.util.validation import Validated, constraints, help_text, setting


@dataclass
class Base(Validated):
    count: int = setting(2, ge=1, help="how many")
    rate: float = setting(0.5, gt=0, le=1, help="a share")
    mode: str = setting("a", choices=("a", "b"))
    flag: bool | None = setting(None)
    limit: int = setting(4, ge=0)

    def check(self) -> None:
        if self.count > self.limit:
            raise ValueError(f"count ({self.count}) must be <= limit ({self.limit})")


@dataclass
class Child(Base):
    rate: float = 0.25  # a new default only: the base class's rule still holds
    count: int = setting(3, ge=3, help="at least three here")


@pytest.mark.parametrize("values, message", [
    ({"count": 0}, "count must satisfy 1 <= count, got 0"),
    ({"count": 1.5}, "count must be an integer, got 1.5"),
    ({"count": True}, "count must be an integer, got True"),
    ({"rate": 0}, "rate must satisfy 0 < rate <= 1, got 0"),
    ({"rate": float("nan")}, "rate must be a number, got nan"),
    ({"mode": "c"}, r"mode must be one of \('a', 'b'\), got 'c'"),
    ({"flag": 1}, "flag must be True or False, got 1; None is also allowed"),
    ({"count": 4, "limit": 3}, r"count \(4\) must be <= limit \(3\)"),
])
def test_each_field_is_checked_from_its_declaration(values, message):
    with pytest.raises(ValueError, match=message):
        Base(**values)


def test_an_assignment_is_checked_and_a_refused_one_leaves_the_old_value():
    config = Base()
    config.rate = 1  # an int where a float is declared is a number
    for name, value in (("rate", 2.0), ("count", 5), ("mode", "z")):  # count 5 breaks the rule with limit
        with pytest.raises(ValueError, match=name):
            setattr(config, name, value)
    assert (config.rate, config.count, config.mode) == (1, 2, "a")


def test_a_subclass_keeps_the_base_rule_of_a_field_it_only_gives_a_new_default():
    assert Child().rate == 0.25
    with pytest.raises(ValueError, match="rate must satisfy 0 < rate <= 1"):
        Child(rate=3.0)
    with pytest.raises(ValueError, match="count must satisfy 3 <= count, got 2"):
        Child(count=2)
    assert help_text(Child)["count"] == "at least three here" and help_text(Child)["rate"] == "a share"


CONFIG_CLASSES = [SFTConfig, DPOConfig, RewardConfig, SamplingConfig, BeamSearchConfig, ModelConfig,
                  *(algorithm.config_class for algorithm in ALGORITHMS.values())]


@pytest.mark.parametrize("config_class", CONFIG_CLASSES, ids=lambda c: c.__name__)
def test_every_config_declares_every_field_and_refuses_a_bad_assignment(config_class):
    rules = constraints(config_class)
    undeclared = [f.name for f in dataclasses.fields(config_class) if f.name not in rules]
    assert not undeclared, f"{config_class.__name__}: fields without a setting(): {undeclared}"
    config = config_class()
    numeric = next(name for name, rule in rules.items() if "int" in rule.kinds or "float" in rule.kinds)
    before = getattr(config, numeric)
    with pytest.raises(ValueError, match=numeric):
        setattr(config, numeric, "not a number")
    assert getattr(config, numeric) == before


def test_the_rl_configs_read_as_declarations():
    """RLConfig's own checks are the two rules between fields; the rest is declared with each field."""
    config = make_config("gspo")
    assert constraints(type(config))["epsilon"].lt == 1  # RLConfig's rule...
    assert config.epsilon == 3e-4  # ...for GSPO's default
    with pytest.raises(ValueError, match="num_minibatches \\(3\\) must divide"):
        config.num_minibatches = 3
    with pytest.raises(ValueError, match="num_generations must satisfy 2 <= num_generations"):
        make_config("grpo", num_generations=1)
    assert make_config("ppo", num_generations=1).num_generations == 1  # PPO needs no group
