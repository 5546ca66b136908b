"""The RL loop: determinism, faults, on/off-policy ratios, config validation, every algorithm runs."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from rlhf_lab.model import LlamaModel
from rlhf_lab.rl import ALGORITHMS, Callback, Trainer, make_config
from rlhf_lab.sft import lab_model_config
from rlhf_lab.text.tokenizer import CharTokenizer

TOK = CharTokenizer()
SMALL = dict(prompts_per_step=4, num_generations=4, eval_every=2, eval_examples=16, n_train=200, n_test=40)


def tiny_model(seed: int = 0) -> LlamaModel:
    torch.manual_seed(seed)
    return LlamaModel(lab_model_config(TOK, hidden_size=32, num_hidden_layers=1, intermediate_size=64,
                                       initializer_range=0.5))


def make_trainer(algo: str = "grpo", reward_fn=None, algorithm=None, **overrides) -> Trainer:
    config = make_config(algo, **{**SMALL, "steps": 3, **overrides})
    return Trainer(config, model=tiny_model(), tokenizer=TOK, reward_fn=reward_fn, algorithm=algorithm)


@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_every_algorithm_runs_and_logs_metrics(algo):
    trainer = make_trainer(algo)
    history = trainer.train()
    assert trainer.stop_reason == "steps" and trainer.step == 3
    assert list(history["step"]) == [0, 1, 2, 3]
    last = history.iloc[-1]
    for column in ("reward_mean", "kl_k1", "kl_k3", "entropy", "clip_frac", "ratio_mean", "grad_norm",
                   "completion_len_mean", "truncation_rate", "tokens_per_s", "mem_params_bytes",
                   "mem_optimizer_bytes", "mem_peak_bytes", "eval_accuracy"):
        assert math.isfinite(last[column]), column
    if algo == "ppo":
        assert math.isfinite(last["value_loss"]) and "explained_variance" in history  # NaN when Var(returns) = 0
        assert "params_critic" not in trainer.memory_bytes()  # value head on the policy by default
    assert len(trainer.distributions) == 3


def test_same_seed_same_history():
    a = make_trainer("grpo", num_minibatches=2, num_iterations=2).train()
    b = make_trainer("grpo", num_minibatches=2, num_iterations=2).train()
    timing = [c for c in a.columns if c.endswith("time") or c in ("tokens_per_s", "mem_peak_bytes")]
    pd.testing.assert_frame_equal(a.drop(columns=timing), b.drop(columns=timing))
    c = make_trainer("grpo", num_minibatches=2, num_iterations=2, seed=1).train()
    assert not a["reward_mean"].iloc[1:].equals(c["reward_mean"].iloc[1:]) or not a["entropy"].equals(c["entropy"])


def count_ones_reward(prompt, completion, reference, finished=True):
    """Graded, EOS not required: a random model gets varied rewards (it never answers correctly)."""
    return float(completion.count("1"))


def test_on_policy_ratio_is_exactly_one_and_off_policy_is_not():
    on = make_trainer("grpo").train()
    assert (on["ratio_min"].iloc[1:] == 1.0).all() and (on["ratio_max"].iloc[1:] == 1.0).all()
    assert (on["clip_frac"].iloc[1:] == 0.0).all()
    trainer = make_trainer("grpo", num_minibatches=2, num_iterations=2, learning_rate=3e-3, steps=4, prompts_per_step=8,
                           reward_fn=count_ones_reward)
    off = trainer.train()
    updated = off[off["adv_std"] > 0]  # steps with a learning signal
    assert len(updated) >= 2
    assert ((updated["ratio_max"] > 1.0) | (updated["ratio_min"] < 1.0)).all()


class BreaksAfter:
    """A reward that turns NaN after `calls` completions have been scored (a reward model gone bad)."""

    def __init__(self, calls: int) -> None:
        self.calls = calls

    def __call__(self, prompt, completion, reference, finished=True):
        self.calls -= 1
        return float("nan") if self.calls < 0 else count_ones_reward(prompt, completion, reference, finished)


def test_non_finite_reward_stops_with_message_and_keeps_last_good_weights():
    per_step = SMALL["prompts_per_step"] * SMALL["num_generations"]
    trainer = make_trainer("grpo", steps=5, reward_fn=BreaksAfter(2 * per_step))
    trainer.train(steps=2)
    good = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    rows = len(trainer.rows)
    with pytest.warns(RuntimeWarning, match=r"non-finite .* at step 3"):
        trainer.train(steps=3)
    assert trainer.stop_reason == "non_finite" and trainer.step == 2
    assert len(trainer.rows) == rows
    for name, tensor in trainer.policy.state_dict().items():
        assert torch.equal(tensor, good[name]), name


class _StopAt(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, trainer, metrics, distributions):
        if trainer.step == self.step:
            raise KeyboardInterrupt


def test_keyboard_interrupt_from_callback_leaves_usable_model_and_history():
    trainer = make_trainer("grpo", steps=6)
    trainer.add_callback(_StopAt(2))
    history = trainer.train()
    assert trainer.stop_reason == "interrupted"
    assert list(history["step"]) == [0, 1, 2]
    trainer.callbacks.clear()
    history = trainer.train(steps=2)  # continue where we stopped
    assert list(history["step"]) == [0, 1, 2, 3, 4]
    assert math.isfinite(trainer.evaluate())


def test_keyboard_interrupt_inside_a_step_rolls_the_step_back():
    trainer = make_trainer("grpo", steps=3)
    trainer.train(steps=1)
    before = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    original = trainer.algorithm.loss

    def interrupted_loss(*args, **kwargs):
        loss, info = original(*args, **kwargs)
        trainer.optimizer.step()  # half an update happened...
        raise KeyboardInterrupt  # ...then Stop was pressed

    trainer.algorithm.loss = interrupted_loss
    trainer.train(steps=1)
    assert trainer.stop_reason == "interrupted" and trainer.step == 1
    for name, tensor in trainer.policy.state_dict().items():
        assert torch.equal(tensor, before[name]), name


@pytest.mark.parametrize(
    "algo, field, value",
    [
        ("grpo", "num_generations", 1),
        ("gspo", "num_generations", 1),
        ("rloo", "num_generations", 1),
        ("grpo", "epsilon", 1.0),
        ("grpo", "epsilon", -0.1),
        ("ppo", "lam", 1.5),
        ("ppo", "gamma", -0.1),
        ("grpo", "loss_type", "sum"),
        ("grpo", "scale_rewards", "median"),
        ("gspo", "importance_sampling_level", "token_and_more"),
        ("grpo", "temperature", 0.0),
        ("grpo", "learning_rate", 0.0),
        ("grpo", "steps", -1),
        ("ppo", "critic", "shared"),
        ("reinforce", "baseline", "median"),
        ("grpo", "num_minibatches", 3),
        ("grpo", "task", "chess"),
    ],
)
def test_invalid_config_names_the_field(algo, field, value):
    with pytest.raises(ValueError, match=field):
        make_config(algo, **{field: value})


def test_unknown_algorithm_is_named():
    with pytest.raises(ValueError, match="algo must be one of"):
        make_config("dpo")


def test_ppo_separate_critic_is_counted_in_memory():
    trainer = make_trainer("ppo", critic="separate", steps=1)
    trainer.train()
    memory = trainer.memory_bytes()
    assert memory["params_critic"] > memory["params_policy"] * 0.9
    grpo = make_trainer("grpo", steps=1)
    grpo.train()
    assert trainer.history["mem_params_bytes"].iloc[-1] > grpo.history["mem_params_bytes"].iloc[-1]
    assert trainer.history["mem_optimizer_bytes"].iloc[-1] > 1.9 * grpo.history["mem_optimizer_bytes"].iloc[-1]


def test_dynamic_sampling_keeps_only_informative_groups():
    trainer = make_trainer("dapo", steps=3, max_resample_rounds=3, reward_fn=count_ones_reward)
    history = trainer.train()
    assert (history["num_rollout_rows"].iloc[1:] > 0).all()
    # every kept group has two different rewards, so no zero-std group reaches the loss
    assert (history["frac_zero_std_groups"].iloc[1:].fillna(0) == 0).all()
    # ... while some of the sampled groups were zero-std and were dropped (the metric says how many)
    assert history["sampled_zero_std_frac"].iloc[1:].max() > 0


def test_save_writes_loadable_checkpoint_and_history(tmp_path):
    from rlhf_lab.model import from_pretrained

    trainer = make_trainer("grpo", steps=1)
    trainer.train()
    folder = trainer.save(tmp_path / "out")
    again = from_pretrained(folder)
    ids = torch.tensor([[1, 5, 6]])
    torch.testing.assert_close(again(ids).logits, trainer.policy.eval()(ids).logits)
    assert len(pd.read_csv(folder / "history.csv")) == 2
