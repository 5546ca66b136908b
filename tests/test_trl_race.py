"""bench/trl_race.py: the pieces that make the race against TRL fair, tested without TRL, and the
step-1 check itself where trl is installed (`pip install -e .[bench]`; CI does not install it)."""

from __future__ import annotations

import argparse

import pytest
import torch


@pytest.fixture(scope="module")
def trl_race(bench_script):
    return bench_script("trl_race")


def test_trl_side_sees_the_labs_reward_and_tokens(trl_race):
    """TRL hands a reward function the completion ids cut after EOS; wrapped, the lab's reward must give
    each completion the reward the lab's own rollout gave it, and the lab must rebuild the same batch
    from those ids (what --check scores)."""
    from rlhf_lab.rl import Trainer

    trainer = Trainer(trl_race.lab_config(seed=0, prompts_per_step=4))
    rollout = trainer.collect_rollout()
    mask = rollout.completion_mask.bool()
    ids = [row[keep].tolist() for row, keep in zip(rollout.completion_ids, mask)]  # TRL's completion_ids
    prompts = [e.prompt for e in rollout.examples]
    reward = trl_race.RecordedReward(trainer.reward_fn, trainer.tokenizer)
    values = reward(prompts=prompts, completions=["unused"] * len(ids), completion_ids=ids,
                    answer=[e.answer for e in rollout.examples])
    assert values == rollout.rewards.tolist()  # same function on the same text: exactly equal
    assert 0 < sum(values) < len(values), (
        "a batch where every reward is equal cannot tell a wrong wrapper apart"
    )

    prompt_ids = [trainer.tokenizer.encode(p, add_bos=True) for p in prompts]
    rebuilt = trl_race.rollout_from_ids(prompt_ids, ids, reward.last["rewards"], rollout.num_generations,
                                        trainer.tokenizer, trainer.max_completion_length)
    width = rebuilt.completion_ids.shape[1]
    assert torch.equal(rebuilt.completion_mask.bool(), mask[:, :width]) and not mask[:, width:].any()
    assert torch.equal(rebuilt.completion_ids[mask[:, :width]], rollout.completion_ids[mask])
    assert torch.equal(
        rebuilt.input_ids[:, : rebuilt.prompt_width], rollout.input_ids[:, : rollout.prompt_width])
    assert torch.equal(rebuilt.finished, rollout.finished)
    trainer.algorithm.compute_advantages(rollout)
    trainer.algorithm.compute_advantages(rebuilt)
    assert torch.equal(rebuilt.advantages[:, 0], rollout.advantages[:, 0])


@pytest.mark.slow
def test_first_step_matches_trl(trl_race):
    """~20 s: TRL samples a batch and takes step 1; the lab's rewards, advantages, loss and gradient
    norm on that batch agree within the tolerances the script derives from float32 rounding."""
    pytest.importorskip("trl", reason="trl is the optional 'bench' extra: pip install -e .[bench]")
    assert trl_race.check(argparse.Namespace(threads=1, seed=0))


def test_matched_lab_differs_from_the_default_only_by_its_kl_metric(trl_race):
    """--lab-without-kl-metric: the same config but kl_metric_samples=0, and then the step runs no
    reference forward (TRL at beta = 0 builds no reference model)."""
    from rlhf_lab.rl import Trainer

    default = trl_race.lab_config(seed=0).to_dict()
    matched = trl_race.lab_config(seed=0, **trl_race.LAB_VARIANTS["lab-no-kl"]).to_dict()
    assert {k for k in default if default[k] != matched[k]} == {"kl_metric_samples"}
    assert matched["kl_metric_samples"] == 0 and default["kl_metric_samples"] > 0
    trainer = Trainer(trl_race.lab_config(seed=0, prompts_per_step=4, **trl_race.LAB_VARIANTS["lab-no-kl"]))
    calls = []
    trainer.ref_model.register_forward_pre_hook(lambda module, args: calls.append(args[0].shape))
    trainer.train_step()
    assert calls == []
