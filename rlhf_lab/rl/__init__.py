"""RL fine-tuning on one loop: PPO, GRPO (Dr. GRPO), DAPO, GSPO, RLOO, REINFORCE, ReMax.

    from rlhf_lab.rl import Trainer, make_config
    trainer = Trainer(make_config("grpo", steps=50))
    history = trainer.train()

or one phase at a time (trainer.py explains each):

    rollout = trainer.collect_rollout()
    trainer.algorithm.compute_advantages(rollout)
    stats = trainer.update(rollout)
"""

import dataclasses

from ..train.callbacks import Callback
from ..util.validation import check_known
from .algorithm import Algorithm, LossInfo, broadcast_to_tokens
from .baselines import RLOO, Reinforce, ReinforceConfig, ReMax, ReMaxConfig, RLOOConfig
from .config import RLConfig
from .dapo import DAPO, DAPOConfig
from .grpo import GRPO, GRPOConfig
from .gspo import GSPO, GSPOConfig
from .metrics import StepDistributions
from .policy_gradient import PolicyGradient, PolicyGradientConfig
from .ppo import PPO, PPOConfig
from .rollout import (
    PolicyOutput,
    Rollout,
    RolloutSampler,
    completion_logits,
    encode_rollout,
    next_token_logprobs,
    policy_forward,
    sample_and_score,
    score_completions,
)
from .trainer import LossAndGradient, NonFiniteLossError, Trainer

ALGORITHMS: dict[str, type[Algorithm]] = {
    "ppo": PPO,
    "grpo": GRPO,
    "dapo": DAPO,
    "gspo": GSPO,
    "rloo": RLOO,
    "reinforce": Reinforce,
    "remax": ReMax,
}


def make_config(algo: str, settings: dict | None = None, /, **overrides) -> RLConfig:
    """The config class of `algo` with its defaults, updated with `settings` (a dict shared by several
    runs, e.g. a notebook's budget) and then `overrides`; validated.

        COMMON = dict(steps=60, prompts_per_step=32)
        make_config("grpo", COMMON, num_iterations=2)
    """
    if algo not in ALGORITHMS:
        raise ValueError(f"algo must be one of {tuple(ALGORITHMS)}, got {algo!r}")
    config_class = ALGORITHMS[algo].config_class
    values = {**(settings or {}), **overrides}
    if values.get("algo", algo) != algo:
        raise ValueError(f"algo must be {algo!r} in a {config_class.__name__}, got {values['algo']!r}: the "
                         f"algorithm is chosen by make_config's first argument (the CLI's --algo)")
    check_known(config_class.__name__, values, {f.name for f in dataclasses.fields(config_class)})
    return config_class(**values)


__all__ = [
    "ALGORITHMS",
    "DAPO",
    "GRPO",
    "GSPO",
    "PPO",
    "RLOO",
    "Algorithm",
    "Callback",
    "DAPOConfig",
    "GRPOConfig",
    "GSPOConfig",
    "LossAndGradient",
    "LossInfo",
    "NonFiniteLossError",
    "PPOConfig",
    "PolicyGradient",
    "PolicyGradientConfig",
    "PolicyOutput",
    "RLConfig",
    "RLOOConfig",
    "ReMax",
    "ReMaxConfig",
    "Reinforce",
    "ReinforceConfig",
    "Rollout",
    "RolloutSampler",
    "StepDistributions",
    "Trainer",
    "broadcast_to_tokens",
    "completion_logits",
    "encode_rollout",
    "make_config",
    "next_token_logprobs",
    "policy_forward",
    "sample_and_score",
    "score_completions",
]
