"""DPO and IPO: hand-computed vectors, TRL's formulas on the same tensors, the config's checks, the
trainer (a step moves the policy, never the reference; IPO's per-token averaging; online pairs),
and the acceptance test: DPO with the sign of its preference flipped does not improve, the normal
sign does."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from test_sft import (  # the SFT tests' tiny lab model (tests/ is on sys.path under pytest)
    TOKENIZER,
    tiny_model,
)

from rlhf_lab.preferences import (
    DPOConfig,
    DPOTrainer,
    dpo_loss,
    encode_pairs,
    implicit_rewards,
    ipo_loss,
    preference_logits,
    sequence_logprobs,
)

# The spec's vector: beta = 0.1, log pi/pi_ref of y_w = +1.0 and of y_l = -1.0, so h = 2.
# float64 so the only error is the library's last-bit rounding (~1e-16 relative): 1e-12 is far above it.
POLICY_W, POLICY_L = torch.tensor([-2.0], dtype=torch.float64), torch.tensor([-6.0], dtype=torch.float64)
REF_W, REF_L = torch.tensor([-3.0], dtype=torch.float64), torch.tensor([-5.0], dtype=torch.float64)
TOL64 = 1e-12


def test_hand_computed_vectors():
    h = preference_logits(POLICY_W, POLICY_L, REF_W, REF_L)
    assert h.item() == pytest.approx(2.0, abs=TOL64)
    # DPO: -log sigmoid(0.1 * 2) = log(1 + e^-0.2) = 0.59814
    dpo = dpo_loss(POLICY_W, POLICY_L, REF_W, REF_L, beta=0.1)
    assert dpo.item() == pytest.approx(math.log1p(math.exp(-0.2)), abs=TOL64)
    assert dpo.item() == pytest.approx(0.59814, abs=5e-6)  # the spec's rounded value
    # conservative DPO, eps = 0.1: 0.9 log(1 + e^-0.2) + 0.1 log(1 + e^0.2) = 0.61814
    cdpo = dpo_loss(POLICY_W, POLICY_L, REF_W, REF_L, beta=0.1, label_smoothing=0.1)
    assert cdpo.item() == pytest.approx(0.61814, abs=5e-6)
    # IPO: (h - 1 / (2 beta))^2 = (2 - 5)^2 = 9, through both entry points
    assert ipo_loss(POLICY_W, POLICY_L, REF_W, REF_L, beta=0.1).item() == pytest.approx(9.0, abs=TOL64)
    ipo = dpo_loss(POLICY_W, POLICY_L, REF_W, REF_L, beta=0.1, loss_type="ipo")
    assert ipo.item() == pytest.approx(9.0, abs=TOL64)
    # implicit rewards: beta * log-ratio = +0.1 for y_w, -0.1 for y_l; their margin beta * h = 0.2
    assert implicit_rewards(POLICY_W, REF_W, 0.1).item() == pytest.approx(0.1, abs=TOL64)
    assert implicit_rewards(POLICY_L, REF_L, 0.1).item() == pytest.approx(-0.1, abs=TOL64)


def trl_sigmoid_and_ipo(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta,
                        label_smoothing):
    """TRL's definitions, transcribed from `DPOTrainer.dpo_loss` (trl/trainer/dpo_trainer.py, TRL main
    branch, 2025):
    logits = (chosen - rejected) - (ref_chosen - ref_rejected);
    "sigmoid": -logsigmoid(beta logits)(1 - label_smoothing) - logsigmoid(-beta logits) label_smoothing;
    "ipo": (logits - 1 / (2 beta))^2; chosen_rewards = beta (chosen - ref_chosen), likewise rejected."""
    logits = (chosen_logps - rejected_logps) - (ref_chosen_logps - ref_rejected_logps)
    sigmoid = (
        -F.logsigmoid(beta * logits) * (1 - label_smoothing) - F.logsigmoid(-beta * logits) * label_smoothing
    )
    ipo = (logits - 1 / (2 * beta)) ** 2
    return (
        sigmoid, ipo, beta * (chosen_logps - ref_chosen_logps), beta * (rejected_logps - ref_rejected_logps)
    )


@pytest.mark.parametrize("beta,label_smoothing", [(0.1, 0.0), (0.5, 0.2), (0.01, 0.0), (2.0, 0.45)])
def test_losses_equal_trl_formulas(beta, label_smoothing):
    generator = torch.Generator().manual_seed(0)
    # sequence log-probs of a few tens of tokens: tens of nats, negative
    logps = [-30 * torch.rand(64, generator=generator) for _ in range(4)]
    trl_sigmoid, trl_ipo, trl_chosen, trl_rejected = trl_sigmoid_and_ipo(*logps, beta, label_smoothing)
    ours = dpo_loss(*logps, beta=beta, label_smoothing=label_smoothing)
    # Same operations in a different order: a few float32 roundings of values up to ~|beta h| + 1,
    # so 16 ulps of the largest value bounds the difference on any BLAS / CPU.
    scale = float(trl_sigmoid.abs().max()) + 1
    assert torch.allclose(ours, trl_sigmoid, rtol=0, atol=16 * torch.finfo(torch.float32).eps * scale)
    ours_ipo = dpo_loss(*logps, beta=beta, loss_type="ipo")
    scale_ipo = float(trl_ipo.abs().max()) + 1
    assert torch.allclose(ours_ipo, trl_ipo, rtol=0, atol=16 * torch.finfo(torch.float32).eps * scale_ipo)
    assert torch.allclose(implicit_rewards(logps[0], logps[2], beta), trl_chosen, rtol=0,
                          atol=4 * torch.finfo(torch.float32).eps * float(trl_chosen.abs().max() + 1))
    assert torch.allclose(implicit_rewards(logps[1], logps[3], beta), trl_rejected, rtol=0,
                          atol=4 * torch.finfo(torch.float32).eps * float(trl_rejected.abs().max() + 1))


def test_dpo_gradient_raises_chosen_and_lowers_rejected():
    """d loss / d log pi(y_w) = -beta sigmoid(-beta h) < 0 and the opposite for y_l (DPO eq. 7's gradient)."""
    chosen = POLICY_W.clone().requires_grad_(True)
    rejected = POLICY_L.clone().requires_grad_(True)
    dpo_loss(chosen, rejected, REF_W, REF_L, beta=0.1).sum().backward()
    expected = 0.1 * torch.sigmoid(torch.tensor(-0.2, dtype=torch.float64))
    assert chosen.grad.item() == pytest.approx(-expected.item(), abs=TOL64)
    assert rejected.grad.item() == pytest.approx(expected.item(), abs=TOL64)


@pytest.mark.parametrize("field,value,message", [
    ("beta", 0.0, "beta must satisfy 0 < beta"),
    ("loss_type", "hinge", "loss_type must be one of ('sigmoid', 'ipo')"),
    ("label_smoothing", 0.5, "label_smoothing must satisfy 0 <= label_smoothing < 0.5"),
    ("batch_size", 0, "batch_size must satisfy 1 <= batch_size"),
    ("online", 1, "online must be True or False"),
])
def test_config_names_the_bad_field(field, value, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        DPOConfig(**{field: value})


def test_label_smoothing_is_refused_for_ipo():
    with pytest.raises(ValueError, match="label_smoothing must be 0 with loss_type='ipo'"):
        DPOConfig(loss_type="ipo", label_smoothing=0.1)
    with pytest.raises(ValueError, match="label_smoothing"):
        dpo_loss(POLICY_W, POLICY_L, REF_W, REF_L, loss_type="ipo", label_smoothing=0.1)


# ----------------------------------------------------------------------------------------------
# the trainer

PAIRS = [("12+34=", "64", "65"), ("50+21=", "17", "71"), ("99+1=", "001", "0001"), ("7+8=", "51", "5")]


def longer(prompt, completion, answer, finished) -> float:
    """A judge for online DPO that prefers the longer completion (equal lengths tie)."""
    return float(len(completion))


def tiny_trainer(pairs=PAIRS, judge=None, **overrides) -> DPOTrainer:
    model = tiny_model(seed=0)
    settings = dict(task_params={"digits": 2}, n_train=64, n_test=8, eval_examples=8, batch_size=4, steps=1,
                    eval_every=0, learning_rate=1e-3)
    return DPOTrainer(DPOConfig(**(settings | overrides)), model=model, tokenizer=TOKENIZER, pairs=pairs,
                      judge=judge)


def test_a_step_moves_the_policy_not_the_reference():
    trainer = tiny_trainer()
    policy_before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    ref_before = {k: v.clone() for k, v in trainer.ref_model.state_dict().items()}
    ref_logps_before = trainer.pair_ref_logps.clone()
    history = trainer.train(steps=1)
    assert trainer.step == 1 and trainer.stop_reason == "steps"
    moved = [k for k, v in trainer.model.state_dict().items() if not torch.equal(v, policy_before[k])]
    assert moved, "no policy weight changed after a DPO step"
    for name, value in trainer.ref_model.state_dict().items():
        assert torch.equal(value,
                           ref_before[name]), f"the reference's {name} changed: pi_ref must stay frozen"
    assert not any(p.requires_grad for p in trainer.ref_model.parameters())
    assert torch.equal(trainer.pair_ref_logps, ref_logps_before)
    row = history.iloc[-1]
    # Before the step pi = pi_ref: every implicit reward is 0, the loss is log 2 (DPO) and margins 0.
    assert row["loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert row["rewards/chosen"] == pytest.approx(0.0, abs=1e-6)
    for name in ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies",
                 "logps/chosen",
                 "logps/rejected", "grad_norm", "lr", "pairs"):
        assert math.isfinite(row[name]), name


def test_precomputed_reference_logprobs_are_the_reference_models():
    trainer = tiny_trainer()
    trainer.train(steps=2)
    rollout = encode_pairs(TOKENIZER, PAIRS)
    with torch.no_grad():
        fresh = sequence_logprobs(trainer.ref_model, rollout)
        policy_now = sequence_logprobs(trainer.model, rollout)
    # Same model, same inputs, another batch size: float32 sums over <= 6 tokens of ~|2.5| nats each.
    tolerance = 64 * torch.finfo(torch.float32).eps * float(fresh.abs().max() + 1)
    assert torch.allclose(trainer.pair_ref_logps, fresh, rtol=0, atol=tolerance)
    assert not torch.allclose(policy_now, fresh, rtol=0,
                              atol=tolerance), "two steps left the policy at pi_ref"


def test_ipo_averages_log_probs_over_completion_tokens():
    """TRL's "ipo" divides each completion's summed log-prob by its token count (EOS included)."""
    trainer = tiny_trainer(loss_type="ipo", beta=0.5)
    rollout = encode_pairs(TOKENIZER, PAIRS)
    sums = torch.tensor([-4.0, -6.0, -9.0, -2.0, -8.0, -3.0, -12.0, -1.0])
    policy, ref = trainer.loss_inputs(sums, sums - 1.0, rollout.lengths)
    lengths = torch.tensor([len(c) + 1 for c in [p[1] for p in PAIRS] + [p[2] for p in PAIRS]],
                           dtype=torch.float32)
    assert torch.equal(rollout.lengths, lengths)
    assert torch.allclose(policy, sums / lengths) and torch.allclose(ref, (sums - 1.0) / lengths)
    dpo_trainer = tiny_trainer(loss_type="sigmoid")
    assert torch.equal(dpo_trainer.loss_inputs(sums, sums - 1.0, rollout.lengths)[0], sums)  # DPO: sums


def test_online_pairs_are_sampled_and_ordered_by_the_judge():
    """Online DPO: of two samples the judge's higher-scored is the chosen one; equal scores are dropped."""
    with pytest.raises(ValueError, match="judge is required"):
        tiny_trainer(pairs=None, online=True)
    trainer = tiny_trainer(pairs=None, judge=longer, online=True, batch_size=8)
    assert trainer.pair_rollout is None
    batch, ref_logps = trainer.online_batch()
    B = len(batch) // 2
    assert B >= 1 and ref_logps.shape == (2 * B,)
    assert (batch.rewards[:B] > batch.rewards[B:]).all()
    history = trainer.train(steps=2)
    assert trainer.step == 2 and history["pairs"].iloc[-1] >= 0


def test_resume_continues_exactly(tmp_path):
    """DPO saves and resumes like the other trainers: 2 + 2 resumed steps give the 4-step history."""
    drop = ["wall_time", "step_time"]
    straight = tiny_trainer(steps=4, eval_every=2).train().drop(columns=drop, errors="ignore")
    first = tiny_trainer(steps=4, eval_every=2)
    first.train(steps=2)
    first.save_state(tmp_path / "state")
    resumed = tiny_trainer(steps=4, eval_every=2).resume(tmp_path / "state").train(steps=2)
    pd.testing.assert_frame_equal(resumed.drop(columns=drop, errors="ignore"), straight)


def test_optimiser_is_supervised_loops_with_dpos_betas_and_constant_rate():
    """SupervisedLoop's AdamW (no weight decay on 1-D gains) with the RL trainer's betas, and a linear
    warm-up to a constant rate (TRL's default scheduler is linear decay; the lab keeps it constant)."""
    trainer = tiny_trainer(warmup_steps=2, steps=4, weight_decay=0.1)
    assert [group["betas"] for group in trainer.optimizer.param_groups] == [(0.9, 0.99)] * 2
    assert [group["weight_decay"] for group in trainer.optimizer.param_groups] == [0.1, 0.0]
    assert all(p.dim() < 2 for p in trainer.optimizer.param_groups[1]["params"])
    history = trainer.train()
    assert history["lr"].tolist()[1:] == [0.5e-3, 1e-3, 1e-3, 1e-3]


def test_a_non_finite_step_leaves_no_trace(monkeypatch):
    """A NaN loss stops online DPO with the weights, AdamW state and both generators (prompt order and
    online samples) as after the last good step (SupervisedLoop's snapshot); training on then gives the
    uninterrupted run row for row. Fails if a generator the step drew from is not restored."""
    from rlhf_lab.preferences import dpo as dpo_module

    drop = ["wall_time", "step_time"]
    settings = dict(pairs=None, judge=longer, online=True, batch_size=8, steps=4)
    expected = tiny_trainer(**settings).train().drop(columns=drop)
    real_loss, calls = dpo_module.dpo_loss, []

    def explodes_once(*args, **kwargs):
        calls.append(1)
        loss = real_loss(*args, **kwargs)
        return loss * math.nan if len(calls) == 3 else loss

    monkeypatch.setattr(dpo_module, "dpo_loss", explodes_once)
    trainer = tiny_trainer(**settings)
    with pytest.warns(RuntimeWarning, match="DPO loss became nan"):
        trainer.train()
    assert trainer.stop_reason == "non_finite" and trainer.step < 4
    resumed = trainer.train(steps=4 - trainer.step).drop(columns=drop)
    pd.testing.assert_frame_equal(resumed, expected)


def test_trainer_needs_pairs_offline():
    with pytest.raises(ValueError, match="pairs must hold at least one"):
        tiny_trainer(pairs=[])
    with pytest.raises(ValueError, match="a pair must have prompt, chosen and rejected"):
        tiny_trainer(pairs=[("1+1=", "2")])


def test_live_dashboard_draws_the_dpo_panels(tmp_path):
    from rlhf_lab.viz import DPO_DASHBOARD_PANELS, LiveDashboard, plot_dashboard

    dash = LiveDashboard(mode="png", png_dir=tmp_path, raise_errors=True, refresh_every=1, min_interval=0)
    trainer = tiny_trainer(eval_every=1)
    trainer.add_callback(dash)
    history = trainer.train(steps=2)
    assert dash.kind == "dpo" and len(dash.figure.axes) == sum(map(len, DPO_DASHBOARD_PANELS))
    assert dash.figure.get_suptitle().startswith("DPO: step 2")
    assert (tmp_path / "dashboard.png").stat().st_size > 0
    assert len(plot_dashboard(history).axes) == 6  # the kind is read from the columns


def own_sample_pairs(model, tokenizer, task, examples, seed: int) -> list[tuple[str, str, str]]:
    """Preference pairs as the shipped data make them: two samples of the model per prompt, the right
    answer chosen over the wrong one (prompts where both or neither are right give no pair)."""
    from rlhf_lab.rl import sample_and_score
    from rlhf_lab.sampling import SamplingConfig

    sampling = SamplingConfig(do_sample=True, max_new_tokens=6)
    rollout = sample_and_score(model, tokenizer, examples, 2, sampling, task.score, task,
                               torch.Generator().manual_seed(seed))
    texts = [tokenizer.decode_until_eos(row)[0] for row in rollout.completion_ids.tolist()]
    pairs = []
    for b, example in enumerate(examples):
        right = rollout.correct[2 * b: 2 * b + 2]
        if right.sum() == 1:
            w = int(right[1] > right[0])
            pairs.append((example.prompt, texts[2 * b + w], texts[2 * b + 1 - w]))
    return pairs


def test_flipped_dpo_does_not_improve_and_dpo_does():
    """Acceptance: from the shipped RL starting checkpoint (~52% greedy accuracy), 30 DPO steps on its
    own samples (right over wrong) raise held-out greedy accuracy and rank held-out pairs right; the
    same steps with the preference flipped (chosen and rejected swapped: the sign of h, so of the
    gradient) lower both. Fails if the loss pushes the wrong way, if the reference moves with the
    policy (h would stay 0), or if the pairs' completions are mis-aligned with their prompts."""
    from rlhf_lab.checkpoints import load_checkpoint
    from rlhf_lab.tasks import get_task

    task = get_task("addition", digits=3)
    train, _ = task.make_split(0, 20000, 500)
    model, tokenizer, _ = load_checkpoint("addition_rl_start")
    pairs = own_sample_pairs(model, tokenizer, task, train[:1024], seed=0)
    held_out = own_sample_pairs(model, tokenizer, task, train[-512:], seed=1)
    assert len(pairs) > 100 and len(held_out) > 50  # about half the prompts give a pair at ~50% accuracy
    config = DPOConfig(beta=1.0, learning_rate=1e-4, steps=30, eval_every=30, eval_examples=200)
    results = {}
    for name, train_pairs in (("dpo", pairs), ("flipped", [(p, r, c) for p, c, r in pairs])):
        trainer = DPOTrainer(config, model=load_checkpoint("addition_rl_start")[0], tokenizer=tokenizer,
                             pairs=train_pairs, eval_pairs=held_out)
        history = trainer.train()
        assert trainer.stop_reason == "steps"
        results[name] = history.iloc[-1]
        start = history.iloc[0]
    # Before training pi = pi_ref: every implicit reward is 0, every held-out pair a tie (half right).
    assert start["eval_rewards/accuracies"] == pytest.approx(0.5)
    # Measured: DPO 0.535 -> 0.59 greedy accuracy and 0.67 of held-out pairs ranked right; flipped
    # 0.535 -> 0.24 and 0.34. The margins below are several times the 200-problem noise (~0.035).
    dpo, flipped = results["dpo"], results["flipped"]
    assert dpo["eval_rewards/accuracies"] > 0.6, "DPO did not learn to rank held-out pairs"
    assert flipped["eval_rewards/accuracies"] < 0.45, "flipped DPO ranked held-out pairs the right way"
    assert dpo["eval_accuracy"] >= start["eval_accuracy"], "DPO lowered held-out greedy accuracy"
    assert flipped["eval_accuracy"] < start["eval_accuracy"] - 0.1, "flipped DPO did not hurt accuracy"
    assert dpo["eval_accuracy"] > flipped["eval_accuracy"] + 0.2


def test_sampled_kl_and_greedy_scores():
    from rlhf_lab.preferences import greedy_scores, sampled_kl, sequence_kl
    from rlhf_lab.rl import sample_and_score
    from rlhf_lab.sampling import SamplingConfig
    from rlhf_lab.train.evaluate import greedy_accuracy

    trainer = tiny_trainer()
    examples = trainer.eval_examples
    same = sampled_kl(trainer.model, trainer.ref_model, TOKENIZER, trainer.task, examples, num_generations=2)
    assert same.shape == (
        len(examples),) and torch.equal(same, torch.zeros_like(same)), "KL(pi || pi) must be 0"
    trainer.train(steps=2)
    budget = trainer.max_completion_length
    moved = sampled_kl(trainer.model, trainer.ref_model, TOKENIZER, trainer.task, examples, num_generations=2,
                       max_new_tokens=budget, seed=5)
    assert trainer.model.training, "sampled_kl must leave the policy in the mode it found it"
    # One implementation of the KL: the per-prompt mean of sequence_kl on the same seeded samples.
    trainer.model.eval()
    with torch.no_grad():
        rollout = sample_and_score(
            trainer.model,
            TOKENIZER,
            examples,
            2,
            SamplingConfig(max_new_tokens=budget),
            lambda *args: 0.0,
            trainer.task,
            torch.Generator().manual_seed(5),
        )
        expected = sequence_kl(trainer.model, trainer.ref_model, rollout).view(-1, 2).mean(1)
    trainer.model.train()
    assert torch.equal(moved, expected)
    # The exact per-token KL is >= 0; float32 rounding of sum_v p (log p - log q) over a 58-token
    # vocabulary and a few completion tokens can leave a few ulps of a value of order 1 below zero, no more.
    assert (moved >= -64 * torch.finfo(torch.float32).eps).all() and moved.sum() > 0, "two steps moved pi"
    correct, rewards = greedy_scores(trainer.model, TOKENIZER, trainer.task, examples, longer)
    assert correct.shape == rewards.shape == (len(examples),)
    assert trainer.evaluate() == pytest.approx(correct.mean().item())  # the same greedy completions
    _, texts = greedy_accuracy(trainer.model, TOKENIZER, trainer.task, examples, return_completions=True)
    *same_scores, same_texts = greedy_scores(trainer.model, TOKENIZER, trainer.task, examples, longer,
                                             return_completions=True)
    assert same_texts == texts and torch.equal(
        same_scores[0], correct) and torch.equal(same_scores[1], rewards)
    assert torch.equal(rewards, torch.tensor([float(len(t)) for t in texts]))  # each score is its own text's
