"""The faster RL step computes what the plain one did: each shared prompt once, no reference forward
the loss does not read, one log-softmax per batch, batch scoring, and the race's early stop."""

from __future__ import annotations

import math

import pytest
import torch
from test_checkpoints import EPS32, SIGMAS, parity_tolerance

import rlhf_lab.rl.losses as losses
from rlhf_lab.rl import Trainer, make_config, policy_forward
from rlhf_lab.rl.metrics import kl_metrics, sampled_kl_metrics
from rlhf_lab.tasks import get_task
from rlhf_lab.util.fast_paths import reference_paths

SMALL = dict(prompts_per_step=4, num_generations=4, eval_every=0, eval_examples=8, n_train=200, n_test=40,
             steps=3)



def trainer_for(algo="grpo", **overrides) -> Trainer:
    return Trainer(make_config(algo, **{**SMALL, **overrides}))  # the shipped RL starting checkpoint


def full_sequence_logprobs(model, rollout):
    """The definition: the whole prompt + completion through the model, logits at P-1 .. P+T-2."""
    P, T = rollout.prompt_width, rollout.completion_ids.shape[1]
    logits = model(rollout.input_ids[:, :-1], attention_mask=rollout.attention_mask[:, :-1]).logits
    logits = logits[:, P - 1 : P - 1 + T]
    return torch.log_softmax(logits, -1).gather(-1, rollout.completion_ids[..., None]).squeeze(-1), logits


def flat_gradient(model, logprobs, mask):
    model.zero_grad(set_to_none=True)
    (logprobs * mask).sum().backward()
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def test_shared_prompt_forward_equals_the_full_sequence():
    trainer = trainer_for()
    rollout = trainer.collect_rollout()
    prompts = rollout.input_ids[:, : rollout.prompt_width]
    assert len(torch.unique(prompts, dim=0)) < len(rollout)  # groups share
    mask = rollout.completion_mask
    shared = policy_forward(trainer.policy, rollout, share_prompts=True).logprobs
    grad_shared = flat_gradient(trainer.policy, shared, mask)
    plain, logits = full_sequence_logprobs(trainer.policy, rollout)
    grad_plain = flat_gradient(trainer.policy, plain, mask)
    # Two fp32 computations of the same function that sum in different orders (see parity_tolerance):
    # a log-prob is a logit minus a logsumexp of logits, so it carries the logits' absolute error.
    atol, _ = parity_tolerance(trainer.policy.config, logits.detach())
    real = mask.bool()
    assert (shared - plain).detach()[real].abs().max() <= 2 * atol
    # Each weight's gradient sums the same per-token terms over the batch, each term with the
    # logits' relative error: the norm of the difference stays within that relative error.
    rtol = SIGMAS * EPS32 * math.sqrt(int(real.sum()))  # plus the sum over the batch's tokens
    _, logit_rtol = parity_tolerance(trainer.policy.config, logits.detach())
    relative = ((grad_shared - grad_plain).norm() / grad_plain.norm()).item()
    assert relative <= 10 * (logit_rtol + rtol), relative


def test_reference_paths_turn_prefix_sharing_off():
    """With the fast paths off (rlhf_lab.util.fast_paths), every row goes through the model whole."""
    trainer = trainer_for()
    rollout = trainer.collect_rollout()
    shapes = []
    trainer.policy.register_forward_pre_hook(lambda module, args: shapes.append(tuple(args[0].shape)))
    with torch.no_grad():
        policy_forward(trainer.policy, rollout, share_prompts=True)
        assert shapes[0][0] < len(rollout)  # the distinct prompts first
        shapes.clear()
        with reference_paths():
            policy_forward(trainer.policy, rollout, share_prompts=True)
    assert shapes == [(len(rollout), rollout.input_ids.shape[1] - 1)]


def test_training_with_shared_prompts_stays_on_the_plain_path():
    """Gradient checkpointing recomputes layers without a cache, so its update takes the plain
    full-sequence forward: the seeded runs sample the same tokens and end within float noise."""
    shared, plain = trainer_for(), trainer_for(gradient_checkpointing=True)
    a, b = shared.train(), plain.train()
    assert a["reward_mean"].iloc[1:].tolist() == b["reward_mean"].iloc[1:].tolist()
    for (name, x), y in zip(shared.policy.state_dict().items(), plain.policy.state_dict().values()):
        # 3 AdamW steps of at most ~lr each; float noise in the gradient moves a weight far less than one step
        assert (x - y).abs().max() <= 0.05 * shared.config.learning_rate, name


def count_reference_rows(trainer) -> list[int]:
    rows = []
    trainer.ref_model.register_forward_pre_hook(lambda module, args: rows.append(args[0].shape[0]))
    return rows


def test_no_reference_forward_over_the_batch_when_the_loss_does_not_use_it():
    trainer = trainer_for(kl_metric_samples=4)
    assert not trainer.algorithm.needs_reference_logprobs  # GRPO at beta = 0
    seen = count_reference_rows(trainer)
    row = trainer.train_step()
    assert max(seen) <= 4 and math.isfinite(row["kl_k3"]) and row["kl_k3"] >= 0
    with_kl = trainer_for(beta=0.04)
    assert with_kl.algorithm.needs_reference_logprobs
    seen = count_reference_rows(with_kl)
    with_kl.train_step()
    assert 16 in seen  # the whole batch's completions (its distinct prompts: fewer rows)
    off = trainer_for(kl_metric_samples=0)  # no KL metric: no reference forward at all (TRL at beta = 0)
    seen = count_reference_rows(off)
    row = off.train_step()
    assert seen == [] and math.isnan(row["kl_k1"]) and math.isnan(row["kl_k3"])


def test_kl_metric_sample_of_the_whole_batch_is_the_batch_kl():
    trainer = trainer_for(kl_metric_samples=16)
    trainer.train_step()  # the policy moves away from the reference
    rollout = trainer.collect_rollout()
    with torch.no_grad():
        policy = policy_forward(trainer.policy, rollout)
    expected = kl_metrics(policy.logprobs, rollout.ref_logprobs, rollout.completion_mask)
    with torch.no_grad():  # the sampler's log-probs instead of a forward
        got = sampled_kl_metrics(rollout, trainer.config.kl_metric_samples, trainer.reference_logprobs)
    assert expected["kl_k3"] > 1e-6
    # the sampler's cached decode and the teacher-forced forward round differently: ~eps * |log-prob|
    tolerance = 1e3 * EPS32 * max(1.0, policy.logprobs.abs().max().item())
    for name in ("kl_k1", "kl_k3"):
        assert got[name] == pytest.approx(expected[name], abs=tolerance)


def test_selective_log_softmax_in_chunks_is_exact(monkeypatch):
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(9, 5, 11, generator=generator) * 4
    ids = torch.randint(11, (9, 5), generator=generator)
    whole = losses.selective_log_softmax(logits, ids)
    monkeypatch.setattr(losses, "LOG_SOFTMAX_CHUNK_ELEMENTS", 2 * 5 * 11)  # 2 rows per chunk, 5 chunks
    assert torch.equal(losses.selective_log_softmax(logits, ids), whole)
    expected = torch.log_softmax(logits, -1).gather(-1, ids[..., None]).squeeze(-1)
    assert torch.equal(whole, expected)
    # the entropy from the same log-softmax, chunk by chunk, is the entropy computed on its own
    logprobs, entropy = losses.selective_log_softmax_and_entropy(logits, ids)
    assert torch.equal(logprobs, whole) and torch.equal(entropy, losses.entropy_from_logits(logits))


def test_weighted_reward_scores_a_batch_like_one_by_one():
    task = get_task("addition")
    reward = task.reward_fn({"correct": 1.0, "partial": 0.5, "format": 0.25})
    example = task.make_split(0, 1, 1)[0][0]
    completions = [example.answer, example.answer[::-1], "", "12x", example.answer + "9"]
    finished = [True, True, True, False, True]
    prompts, answers = [example.prompt] * 5, [example.answer] * 5
    one_by_one = [reward(p, c, a, f) for p, c, a, f in zip(prompts, completions, answers, finished)]
    assert reward.score_batch(prompts, completions, answers, finished) == one_by_one
    assert len(set(one_by_one)) > 2


def test_stop_at_accuracy_ends_the_run_at_the_first_evaluation_that_reaches_it():
    trainer = trainer_for(eval_every=1, stop_at_accuracy=0.01, steps=5)  # the checkpoint starts near 50%
    history = trainer.train()
    assert trainer.stop_reason == "stop_at_accuracy" and trainer.step == 1
    assert history["eval_accuracy"].iloc[-1] >= 0.01


@pytest.mark.parametrize("field, value", [("kl_metric_samples", -1), ("kl_metric_samples", 2.5),
                                          ("stop_at_accuracy", 1.5), ("stop_at_accuracy", 0)])
def test_new_settings_are_checked(field, value):
    with pytest.raises(ValueError, match=field):
        make_config("grpo", **{field: value})


def test_distinct_rows_maps_back_to_every_row():
    """distinct_rows against torch.unique(dim=0): the same set of rows, and distinct[inverse] == rows;
    also when two different rows are forced to share a key (the exact check must catch it)."""
    from rlhf_lab.rl.prefix_sharing import distinct_rows

    g = torch.Generator().manual_seed(2)
    base = torch.randint(0, 58, (12, 9), generator=g)
    rows = base[torch.randint(0, 12, (64,), generator=g)]
    distinct, inverse = distinct_rows(rows)
    assert torch.equal(distinct[inverse], rows)
    reference = torch.unique(rows, dim=0)
    assert len(distinct) == len(reference) and torch.equal(torch.unique(distinct, dim=0), reference)
    # rows (w_1, 0) and (0, w_0) share the key w_0 w_1: only the exact check tells them apart
    w = (torch.arange(1, 3) * 2654435761) % (1 << 31) | 1
    clash = torch.tensor([[int(w[1]), 0], [0, int(w[0])], [int(w[1]), 0]])
    distinct, inverse = distinct_rows(clash)
    assert torch.equal(distinct[inverse], clash) and len(distinct) == 2


def test_a_reward_that_is_the_exact_match_is_scored_once():
    """At the default reward (the task's exact match) the accuracy column is the reward, scored once;
    any other reward is scored apart from the exact match."""
    trainer = trainer_for()
    assert trainer.sampler.accuracy_fn is trainer.reward_fn
    rollout = trainer.collect_rollout(with_reference=False)
    assert torch.equal(rollout.correct, rollout.rewards) and rollout.correct is not rollout.rewards
    shaped = trainer_for(reward_weights={"correct": 1.0, "format": 0.5})
    assert shaped.sampler.accuracy_fn is not shaped.reward_fn
    rollout = shaped.collect_rollout(with_reference=False)
    assert set(rollout.correct.tolist()) <= {0.0, 1.0}
    assert not torch.equal(rollout.rewards, rollout.correct)  # the format reward adds to well-formed answers



FAULTS_PER_ROUND = """
import resource, sys, torch, torch.nn.functional as F
from rlhf_lab.util.allocator import keep_freed_memory
torch.set_num_threads(1)
if sys.argv[1] == "keep":
    assert keep_freed_memory()
x, weight = torch.randn(4096, 256, requires_grad=True), torch.ones(256, requires_grad=True)
def one_round():
    F.rms_norm(x, (256,), weight=weight, eps=1e-6).backward(torch.ones(4096, 256))
for _ in range(10):  # the heap grows to its working size
    one_round()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    one_round()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20)
"""


def test_freed_memory_stays_for_the_next_step(monkeypatch):
    """keep_freed_memory (the CLI and bench/ turn it on): with glibc, an RMSNorm forward + backward on 4 MiB
    tensors, repeated, page-faults far less of its memory back in than with glibc's default thresholds
    (measured: 0-100 minor faults per round against 1,500-3,400; at the lab update's own shapes the gap
    is the same but noisier, 0-10 against 20-150); the environment's own MALLOC_* settings win. Each
    variant runs in a fresh process (the thresholds are process-wide)."""
    import platform
    import subprocess
    import sys

    from rlhf_lab.util.allocator import keep_freed_memory

    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    assert keep_freed_memory() is False  # the user's setting is left alone
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_")
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    if not (platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"):
        assert keep_freed_memory() is False
        return
    faults = {mode: float(subprocess.run([sys.executable, "-c", FAULTS_PER_ROUND, mode], capture_output=True,
                                         text=True, check=True).stdout) for mode in ("default", "keep")}
    assert faults["keep"] * 3 < faults["default"], faults
