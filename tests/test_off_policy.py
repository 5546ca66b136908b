"""The corrections for stale or mismatched rollouts (rlhf_lab.rl.off_policy): hand-checked spec vectors,
the losses they give, and the reduction to the plain loss when the behaviour policy is the learner's."""

from __future__ import annotations

import math

import pytest
import torch

from rlhf_lab.rl import GRPO, PPO, Rollout, Trainer, make_config
from rlhf_lab.rl.off_policy import (
    CORRECTIONS,
    behaviour_log_ratio,
    correct,
    corrected_minibatch,
    importance_weights,
    level_log_ratio,
)
from rlhf_lab.rl.rollout import PolicyOutput

# Two completions: the second has a padded third position. pi_prox and mu per token:
#   row 0: pi_prox = 0.5, 0.2, 0.4  mu = 0.25, 0.4, 0.4  -> r = 2, 0.5, 1  (product 1, geometric 1)
#   row 1: pi_prox = 0.3, 0.3, pad  mu = 0.1,  0.6, pad  -> r = 3, 0.5     (product 1.5, geometric 1.5**0.5)
PROX = torch.log(torch.tensor([[0.5, 0.2, 0.4], [0.3, 0.3, 1.0]]))
MU = torch.log(torch.tensor([[0.25, 0.4, 0.4], [0.1, 0.6, 1.0]]))
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def weights(correction, level="token", cap=2.0):
    weight, kept = importance_weights(behaviour_log_ratio(PROX, MU), MASK, correction, level, cap)
    return (None if weight is None else weight.tolist()), kept.tolist()


def close(actual, expected):
    assert len(actual) == len(expected)
    for a_row, e_row in zip(actual, expected):
        assert a_row == pytest.approx(e_row, rel=1e-6, abs=1e-6)


def test_behaviour_ratio_and_levels_spec_vector():
    log_r = behaviour_log_ratio(PROX, MU)
    close(torch.exp(log_r * MASK).tolist(), [[2.0, 0.5, 1.0], [3.0, 0.5, 1.0]])
    close(torch.exp(level_log_ratio(log_r, MASK, "sequence")).tolist(), [[1.0] * 3, [1.5] * 3])
    close(torch.exp(level_log_ratio(log_r, MASK, "geometric")).tolist(), [[1.0] * 3, [math.sqrt(1.5)] * 3])
    with pytest.raises(ValueError, match="off_policy_level must be one of"):
        level_log_ratio(log_r, MASK, "batch")


def test_decoupled_tis_and_mis_token_level_spec_vectors():
    weight, kept = weights("decoupled")
    close(weight, [[2.0, 0.5, 1.0], [3.0, 0.5, 0.0]])  # w = pi_prox / mu, 0 on padding
    assert kept == MASK.tolist()
    weight, kept = weights("tis", cap=2.0)
    close(weight, [[2.0, 0.5, 1.0], [2.0, 0.5, 0.0]])  # min(r, 2): only the 3 is truncated
    weight, kept = weights("mis", cap=2.5)
    assert weight is None
    assert kept == [[1.0, 1.0, 1.0], [0.0, 1.0, 0.0]]  # r = 3 is outside [0.4, 2.5]; 2 and 0.5 are inside
    weight, kept = weights("mis", cap=1.5)
    assert kept == [[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]  # only r = 1 is inside [2/3, 1.5]


def test_sequence_and_geometric_levels_spec_vectors():
    weight, _ = weights("tis", "sequence", cap=1.2)
    close(weight, [[1.0, 1.0, 1.0], [1.2, 1.2, 0.0]])  # products 1 and 1.5; 1.5 truncated at 1.2
    weight, _ = weights("tis", "geometric", cap=1.2)
    close(weight, [[1.0, 1.0, 1.0], [1.2, 1.2, 0.0]])  # 1.5 ** 0.5 = 1.2247 > 1.2
    _, kept = weights("mis", "sequence", cap=1.4)
    assert kept == [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]  # the whole second completion leaves
    _, kept = weights("mis", "geometric", cap=1.4)
    assert kept == MASK.tolist()  # its geometric mean 1.2247 stays inside [1/1.4, 1.4]


def test_none_and_naive_choose_what_the_ratio_divides_by():
    fix = correct(PROX, MU, MASK, "none")
    assert fix.old_logprobs is PROX and fix.weight is None and fix.mask is MASK
    fix = correct(PROX, None, MASK, "none")  # a synchronous rollout needs no behaviour log-probs
    assert fix.old_logprobs is PROX
    fix = correct(PROX, MU, MASK, "naive")
    assert torch.equal(fix.old_logprobs, MU) and fix.weight is None
    for correction in ("naive", "decoupled", "tis", "mis"):
        with pytest.raises(ValueError, match="sampling_logprobs"):
            correct(PROX, None, MASK, correction)
    with pytest.raises(ValueError, match="off_policy must be one of"):
        importance_weights(behaviour_log_ratio(PROX, MU), MASK, "vtrace")


def test_a_wild_ratio_cannot_overflow():
    huge = torch.tensor([[0.0, -200.0]])  # log mu = -200: r = e^200 unclamped
    log_ratio = behaviour_log_ratio(torch.zeros(1, 2), huge)
    weight, _ = importance_weights(log_ratio, torch.ones(1, 2), "decoupled")
    assert torch.isfinite(weight).all() and weight[0, 1].item() == pytest.approx(math.exp(20), rel=1e-6)


# --- the corrections in front of the losses ---------------------------------------------------------


def corrected_loss(algorithm, rollout, policy):
    """What Trainer.minibatch_step computes: the correction, then the algorithm's own loss."""
    return algorithm.loss(corrected_minibatch(rollout, policy.logprobs, algorithm.config), policy)


def minibatch(advantage: float) -> tuple[Rollout, PolicyOutput]:
    """Row 0 of the spec vector as a one-completion minibatch, trained on-policy from pi_prox:
    pi_theta = pi_prox (with a gradient), mu the behaviour policy."""
    logprobs = PROX[:1].clone().requires_grad_(True)
    n, t = 1, 3
    rollout = Rollout(input_ids=torch.zeros(n, 1 + t, dtype=torch.long), attention_mask=torch.ones(n, 1 + t),
                      prompt_width=1, completion_ids=torch.zeros(n, t, dtype=torch.long),
                      completion_mask=MASK[:1], rewards=torch.zeros(n), correct=torch.zeros(n),
                      finished=torch.ones(n, dtype=torch.bool),
                      num_generations=1, max_completion_length=t, sampling_logprobs=MU[:1],
                      advantages=torch.full((n, t), advantage), old_values=torch.zeros(n, t),
                      returns=torch.zeros(n, t))
    values = torch.zeros(n, t, requires_grad=True)
    return rollout, PolicyOutput(logprobs=logprobs, entropy=None, values=values)


@pytest.mark.parametrize(("correction", "cap", "expected"), [
    ("none", 2.0, -2.0),                         # rho = 1: -A
    ("naive", 2.0, -(1.2 + 0.5 + 1.0) * 2 / 3),  # rho = r = 2, 0.5, 1; the 2 clipped to 1.2
    ("decoupled", 2.0, -(2.0 + 0.5 + 1.0) * 2 / 3),  # rho = 1, w = 2, 0.5, 1
    ("tis", 1.9, -(1.9 + 0.5 + 1.0) * 2 / 3),    # w = min(r, 1.9)
    ("mis", 1.5, -2.0),                          # only the third token (r = 1) stays: its mean is -A
])
def test_grpo_loss_with_each_correction(correction, cap, expected):
    """A = 2 on the three tokens of row 0, loss_type grpo (the completion's token mean), eps = 0.2."""
    algorithm = GRPO(make_config("grpo", off_policy=correction, off_policy_cap=cap))
    rollout, policy = minibatch(2.0)
    loss, info = corrected_loss(algorithm, rollout, policy)
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    loss.backward()
    assert policy.logprobs.grad.abs().sum() > 0 or correction == "naive"


def test_ppo_loss_takes_the_same_corrections():
    rollout, policy = minibatch(2.0)
    rollout.old_logprobs = PROX[:1]  # PPO stores pi_prox at rollout time
    losses = {}
    for correction in ("none", "decoupled", "mis"):
        # critic="head": the values are the policy forward's own (given here), no critic model is built
        algorithm = PPO(make_config("ppo", off_policy=correction, off_policy_cap=1.5, vf_coef=0.0))
        losses[correction] = corrected_loss(algorithm, rollout, policy)[0].item()
    expected = {"none": -2.0, "decoupled": -(2.0 + 0.5 + 1.0) * 2 / 3, "mis": -2.0}
    assert losses == pytest.approx(expected, rel=1e-6)


def test_every_correction_is_the_plain_loss_when_mu_is_the_learner():
    """Staleness 0 in exact arithmetic: mu = pi_prox, r = 1 and every correction gives the same loss
    and gradient as none (the parity the split relies on)."""
    generator = torch.Generator().manual_seed(0)
    prox = torch.log_softmax(torch.randn(4, 5, 7, generator=generator), -1)[..., 0]
    mask = (torch.rand(4, 5, generator=generator) > 0.2).float()
    advantages = torch.randn(4, 1, generator=generator).expand(4, 5) * mask
    results = {}
    for correction in CORRECTIONS:
        logprobs = prox.clone().requires_grad_(True)
        rollout = Rollout(input_ids=torch.zeros(4, 6, dtype=torch.long), attention_mask=torch.ones(4, 6),
                          prompt_width=1, completion_ids=torch.zeros(4, 5, dtype=torch.long),
                          completion_mask=mask, rewards=torch.zeros(4), correct=torch.zeros(4),
                          finished=torch.ones(4, dtype=torch.bool),
                          num_generations=2, max_completion_length=5, sampling_logprobs=prox.clone(),
                          advantages=advantages)
        loss, _ = corrected_loss(GRPO(make_config("grpo", off_policy=correction)), rollout,
                                 PolicyOutput(logprobs=logprobs, entropy=None, values=None))
        loss.backward()
        results[correction] = (loss.detach(), logprobs.grad)
    for correction, (loss, grad) in results.items():
        assert torch.equal(loss, results["none"][0]), correction
        assert torch.equal(grad, results["none"][1]), correction


@pytest.mark.parametrize(("field", "value", "message"), [
    ("off_policy", "vtrace", "off_policy must be one of"),
    ("off_policy_level", "batch", "off_policy_level must be one of"),
    ("off_policy_cap", 1.0, "off_policy_cap must satisfy 1 < off_policy_cap"),
])
def test_bad_correction_settings_name_the_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        make_config("grpo", **{field: value})


def test_the_trainer_corrects_every_minibatch_before_the_loss():
    """With the behaviour log-probs one nat below the learner's (r = e for every token), MIS with C = 2
    masks every token: the trainer's step sees a zero loss and leaves the weights alone; without a
    correction the same step learns."""
    losses = {}
    for correction in ("none", "mis"):
        trainer = Trainer(make_config("grpo", prompts_per_step=4, eval_every=0, off_policy=correction))
        rollout = trainer.collect_rollout(with_reference=False)
        trainer.compute_advantages(rollout)
        rollout.sampling_logprobs = rollout.sampling_logprobs - 1.0
        before = [p.detach().clone() for p in trainer.trainable_parameters()]
        info, grad_norm, _ = trainer.minibatch_step(rollout)
        moved = any(not torch.equal(a, b) for a, b in zip(before, trainer.trainable_parameters()))
        losses[correction] = (info.policy_loss, grad_norm, moved)
    assert losses["mis"] == (0.0, 0.0, False)
    assert losses["none"][1] > 0 and losses["none"][2]
