"""GRPO really learns: a few CPU-seconds of steps from the shipped checkpoint lift held-out accuracy.

This can fail: with a broken advantage sign, a zero learning rate, a detached log-prob or a wrong
ratio, accuracy stays where it started (or drops).
"""

from __future__ import annotations

import pytest

from rlhf_lab.checkpoints import load_checkpoint
from rlhf_lab.rl import GRPO, Trainer, make_config


class FlippedGRPO(GRPO):
    """GRPO with the sign of every advantage flipped: pushes down what was rewarded."""

    def compute_advantages(self, rollout):
        super().compute_advantages(rollout)
        rollout.advantages = -rollout.advantages


@pytest.mark.slow
def test_grpo_lifts_heldout_accuracy_from_the_shipped_checkpoint():
    model, tokenizer, meta = load_checkpoint("addition_rl_start")
    config = make_config("grpo", steps=60, eval_every=60, eval_examples=300, seed=0)
    trainer = Trainer(config, model=model, tokenizer=tokenizer)
    history = trainer.train()
    before = history["eval_accuracy"].iloc[0]
    after = history["eval_accuracy"].dropna().iloc[-1]
    print(f"held-out accuracy {before:.3f} -> {after:.3f} in {trainer.train_time:.1f} s of training")
    assert after >= before + 0.08, f"GRPO did not learn: {before:.3f} -> {after:.3f}"
    # the same steps with the advantage sign flipped must not improve: the test can tell learning apart
    model, tokenizer, _ = load_checkpoint("addition_rl_start")
    flipped = Trainer(config, model=model, tokenizer=tokenizer, algorithm=FlippedGRPO(config))
    worse = flipped.train()["eval_accuracy"].dropna().iloc[-1]
    assert worse < before + 0.02, (
        f"accuracy rose even with the advantage sign flipped: {before:.3f} -> {worse:.3f}"
    )
