"""Unit tests for the RL math: advantages, KL estimators, loss pieces.

Every numeric test vector here comes from the papers or from TRL's conventions (DeepSeekMath,
Dr. GRPO, DAPO, GSPO, RLOO, ReMax, Ziegler et al. 2019). TRL is not a dependency: where we check
against TRL, its formulas are transcribed below from trl/trainer/grpo_trainer.py
(GRPOTrainer._generate_and_score_completions and GRPOTrainer._compute_loss).
"""

from __future__ import annotations

import math

import pytest
import torch

from rlhf_lab.rl.advantages import (
    gae,
    group_advantages,
    ppo_token_rewards,
    reinforce_advantages,
    remax_advantages,
    rloo_advantages,
    whiten,
)
from rlhf_lab.rl.dapo import overlong_soft_penalty
from rlhf_lab.rl.kl import AdaptiveKLController, FixedKLController, kl_estimate, kl_k1, kl_k2, kl_k3
from rlhf_lab.rl.losses import (
    LOSS_TYPES,
    aggregate,
    clipped_surrogate,
    clipped_value_loss,
    entropy_from_logits,
    explained_variance,
    gspo_ratio,
    masked_mean,
    masked_sum,
    selective_log_softmax,
    sequence_log_ratio,
    token_log_ratio,
)


def _t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def _random_batch(seed: int, batch: int = 6, seq: int = 7, vocab: int = 11):
    """Random logits (leaf, requires grad), token ids and a right-padded mask with varied lengths."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, seq, vocab, generator=gen).requires_grad_(True)
    token_ids = torch.randint(0, vocab, (batch, seq), generator=gen)
    lengths = torch.randint(1, seq + 1, (batch,), generator=gen)
    lengths[0] = seq  # at least one full-length row
    mask = (torch.arange(seq).unsqueeze(0) < lengths.unsqueeze(1)).float()
    return logits, token_ids, mask, gen


# ----------------------------------------------------------------------------------------------
# GRPO advantages


def test_group_advantages_spec_vectors():
    advantages = group_advantages(_t([1, 0, 0, 0]), num_generations=4)
    torch.testing.assert_close(advantages, _t([1.4997, -0.4999, -0.4999, -0.4999]), atol=1e-4, rtol=0)
    advantages = group_advantages(_t([0, 1]), num_generations=2)
    torch.testing.assert_close(advantages, _t([-0.7070, 0.7070]), atol=1e-4, rtol=0)


def test_group_advantages_sample_std_not_population_std():
    rewards = _t([1, 0, 0, 0])
    advantages = group_advantages(rewards, num_generations=4)
    centered = rewards - rewards.mean()
    population = centered / (rewards.std(unbiased=False) + 1e-4)
    torch.testing.assert_close(population, _t([1.732, -0.577, -0.577, -0.577]), atol=1e-3, rtol=0)
    assert not torch.allclose(advantages, population, atol=1e-2), "did you use the population std (n)?"
    # the two differ exactly by sqrt((n-1)/n) up to eps
    torch.testing.assert_close(advantages / population, torch.full((4,), math.sqrt(3 / 4)), atol=1e-3, rtol=0)


def test_group_advantages_groups_are_contiguous_and_independent():
    rewards = _t([1, 0, 0, 0, 5, 5, 5, 7])
    advantages = group_advantages(rewards, num_generations=4)
    torch.testing.assert_close(advantages[:4], group_advantages(rewards[:4], 4))
    torch.testing.assert_close(advantages[4:], group_advantages(rewards[4:], 4))
    # an all-equal group gives zero advantage, not nan
    assert torch.equal(group_advantages(_t([3, 3, 3]), 3), torch.zeros(3))


def test_group_advantages_scale_modes():
    rewards = _t([1, 0, 0, 0, 4, 2, 2, 0])
    group_mean = _t([0.25] * 4 + [2.0] * 4)
    torch.testing.assert_close(group_advantages(rewards, 4, scale_rewards="none"), rewards - group_mean)
    batch_std = rewards.std()  # one std over all 8 rewards, the mean stays per group
    torch.testing.assert_close(
        group_advantages(rewards, 4, scale_rewards="batch"), (rewards - group_mean) / (batch_std + 1e-4)
    )
    group_std = _t([0.5] * 4 + [math.sqrt(8 / 3)] * 4)
    torch.testing.assert_close(
        group_advantages(rewards, 4, scale_rewards="group"), (rewards - group_mean) / (group_std + 1e-4)
    )


def test_group_advantages_validation():
    with pytest.raises(ValueError, match="num_generations"):
        group_advantages(_t([1, 0]), num_generations=1)
    with pytest.raises(ValueError, match="multiple of num_generations"):
        group_advantages(_t([1, 0, 0]), num_generations=2)
    with pytest.raises(ValueError, match="scale_rewards"):
        group_advantages(_t([1, 0]), num_generations=2, scale_rewards="std")


def _trl_group_advantages(rewards: torch.Tensor, num_generations: int, scale_rewards: str) -> torch.Tensor:
    """Transcribed from trl/trainer/grpo_trainer.py (_generate_and_score_completions)."""
    mean_grouped = rewards.view(-1, num_generations).mean(dim=1).repeat_interleave(num_generations, dim=0)
    advantages = rewards - mean_grouped
    if scale_rewards in ("group", "none"):
        std = rewards.view(-1, num_generations).std(dim=1).repeat_interleave(num_generations, dim=0)
    else:  # "batch"
        std = rewards.std().expand_as(rewards)
    if scale_rewards != "none":
        advantages = advantages / (std + 1e-4)
    return advantages


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
def test_group_advantages_match_trl_transcription(scale_rewards):
    rewards = torch.randint(0, 3, (24,), generator=torch.Generator().manual_seed(0)).float()
    torch.testing.assert_close(
        group_advantages(rewards, 6, scale_rewards=scale_rewards),
        _trl_group_advantages(rewards, 6, scale_rewards),
    )


# ----------------------------------------------------------------------------------------------
# RLOO, ReMax, REINFORCE, DAPO overlong penalty


def test_rloo_leave_one_out_and_identity():
    rewards = _t([1, 0, 0, 0, 3, 1, 2, 6])
    advantages = rloo_advantages(rewards, num_generations=4)
    torch.testing.assert_close(advantages[:4], _t([1.0, -1 / 3, -1 / 3, -1 / 3]))
    grouped = rewards.view(2, 4)
    centered = (grouped - grouped.mean(dim=1, keepdim=True)).reshape(-1)
    torch.testing.assert_close(advantages, 4 / 3 * centered)  # A_i = G/(G-1) * (r_i - mean)
    with pytest.raises(ValueError, match="num_generations"):
        rloo_advantages(rewards, 1)


def test_remax_and_reinforce():
    advantages = remax_advantages(_t([1, 0, 0.5, 1]), greedy_rewards=_t([0.5, 1.0]), num_generations=2)
    torch.testing.assert_close(advantages, _t([0.5, -0.5, -0.5, 0.0]))
    with pytest.raises(ValueError, match="greedy_rewards"):
        remax_advantages(_t([1, 0, 0.5]), _t([0.5, 1.0]), num_generations=2)
    rewards = _t([1, 0, 0, 3])
    torch.testing.assert_close(reinforce_advantages(rewards), rewards)
    torch.testing.assert_close(reinforce_advantages(rewards, baseline="mean"), _t([0, -1, -1, 2]))
    with pytest.raises(ValueError, match="baseline"):
        reinforce_advantages(rewards, baseline="group")


def test_overlong_soft_penalty_dapo():
    penalty = overlong_soft_penalty(_t([10, 16, 17, 18, 20, 21]), max_len=20, cache_len=4)
    torch.testing.assert_close(penalty, _t([0, 0, -0.25, -0.5, -1.0, -1.0]))
    with pytest.raises(ValueError, match="cache_len"):
        overlong_soft_penalty(_t([1]), max_len=4, cache_len=5)


# ----------------------------------------------------------------------------------------------
# KL estimators and controllers


def test_kl_spec_vector():
    logprobs, ref_logprobs = _t([[-1.0]]), _t([[-1.5]])
    assert kl_k1(logprobs, ref_logprobs).item() == pytest.approx(0.5)
    assert kl_k2(logprobs, ref_logprobs).item() == pytest.approx(0.125)
    assert kl_k3(logprobs, ref_logprobs).item() == pytest.approx(math.exp(-0.5) + 0.5 - 1, abs=1e-6)
    assert kl_k3(logprobs, ref_logprobs).item() == pytest.approx(0.1065, abs=1e-4)
    with pytest.raises(ValueError, match="kl_estimator"):
        kl_estimate(logprobs, ref_logprobs, "k4")


def test_kl_k3_nonnegative_and_matches_trl_formula():
    gen = torch.Generator().manual_seed(0)
    for scale in (1e-7, 1e-4, 1e-2, 1.0, 5.0):
        logprobs = -torch.rand(64, 32, generator=gen) * 5
        ref_logprobs = logprobs + torch.randn(64, 32, generator=gen) * scale
        k3 = kl_k3(logprobs, ref_logprobs)
        assert (k3 >= 0).all(), f"k3 went negative at scale {scale}"
        trl_k3 = torch.exp(ref_logprobs - logprobs) - (ref_logprobs - logprobs) - 1  # grpo_trainer.py
        torch.testing.assert_close(k3, trl_k3, atol=1e-6, rtol=1e-5)
        assert (kl_k2(logprobs, ref_logprobs) >= 0).all()
    assert torch.equal(kl_k3(logprobs, logprobs), torch.zeros_like(logprobs))


def test_kl_k1_and_k3_are_unbiased_for_true_kl():
    # exact KL(p || q) on a small categorical vs. Monte Carlo means of k1 and k3 with samples from p
    gen = torch.Generator().manual_seed(1)
    log_p = torch.log_softmax(torch.randn(5, generator=gen), dim=0)
    log_q = torch.log_softmax(torch.randn(5, generator=gen), dim=0)
    true_kl = (log_p.exp() * (log_p - log_q)).sum()
    samples = torch.multinomial(log_p.exp(), 200_000, replacement=True, generator=gen)
    assert kl_k1(log_p[samples], log_q[samples]).mean().item() == pytest.approx(true_kl.item(), abs=0.01)
    assert kl_k3(log_p[samples], log_q[samples]).mean().item() == pytest.approx(true_kl.item(), abs=0.01)


def test_adaptive_kl_controller_formula():
    controller = AdaptiveKLController(init_kl_coef=0.2, target=6.0, horizon=10000)
    # KL twice the target: error clipped to +0.2
    assert controller.update(12.0, n_steps=256) == pytest.approx(0.2 * (1 + 0.2 * 256 / 10000))
    # KL below the target: error -0.5 clipped to -0.2
    before = controller.value
    assert controller.update(3.0, n_steps=256) == pytest.approx(before * (1 - 0.2 * 256 / 10000))
    # inside the clip: error 0.1
    before = controller.value
    assert controller.update(torch.tensor(6.6), n_steps=64) == pytest.approx(before * (1 + 0.1 * 64 / 10000))
    fixed = FixedKLController(0.05)
    assert fixed.update(100.0, 256) == 0.05 and fixed.value == 0.05
    with pytest.raises(ValueError, match="target"):
        AdaptiveKLController(0.2, target=0.0, horizon=10)


# ----------------------------------------------------------------------------------------------
# PPO: token rewards, GAE, whitening, value loss


def test_gae_spec_vector():
    rewards, values, mask = _t([[0, 0, 1]]), _t([[0.5, 0.5, 0.5]]), torch.ones(1, 3)
    advantages, returns = gae(rewards, values, mask, gamma=1.0, lam=0.95)
    torch.testing.assert_close(advantages, _t([[0.45125, 0.475, 0.5]]))
    torch.testing.assert_close(returns, _t([[0.95125, 0.975, 1.0]]))
    _, returns = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    torch.testing.assert_close(returns, _t([[1.0, 1.0, 1.0]]))  # lambda = 1: Monte Carlo return


def test_gae_right_padding_does_not_leak():
    # row 1 is the spec vector shifted: two real tokens then padding with junk rewards/values
    rewards = _t([[0, 0, 1, 0], [0, 1, 7, 7]])
    values = _t([[0.5, 0.5, 0.5, 9], [0.5, 0.5, 9, 9]])
    mask = _t([[1, 1, 1, 0], [1, 1, 0, 0]])
    advantages, returns = gae(rewards, values, mask, gamma=1.0, lam=0.95)
    torch.testing.assert_close(advantages, _t([[0.45125, 0.475, 0.5, 0], [0.475, 0.5, 0, 0]]))
    torch.testing.assert_close(returns, _t([[0.95125, 0.975, 1.0, 0], [0.975, 1.0, 0, 0]]))
    # gamma < 1 against a hand-written single-sequence recursion
    gamma, lam = 0.9, 0.8
    row_r, row_v = [0.0, 1.0], [0.5, 0.5]
    a1 = row_r[1] - row_v[1]
    a0 = row_r[0] + gamma * row_v[1] - row_v[0] + gamma * lam * a1
    advantages, _ = gae(rewards, values, mask, gamma=gamma, lam=lam)
    torch.testing.assert_close(advantages[1], _t([a0, a1, 0, 0]))


def test_ppo_token_rewards():
    logprobs = _t([[-1.0, -2.0, -1.0], [-1.0, -1.0, -5.0]])
    ref_logprobs = _t([[-1.5, -2.0, -0.5], [-2.0, -1.0, -1.0]])
    mask = _t([[1, 1, 1], [1, 1, 0]])
    rewards, kl = ppo_token_rewards(_t([1.0, 2.0]), logprobs, ref_logprobs, mask, kl_coef=0.1)
    torch.testing.assert_close(kl, _t([[0.5, 0.0, -0.5], [1.0, 0.0, 0.0]]))
    torch.testing.assert_close(rewards, _t([[-0.05, 0.0, 0.05 + 1.0], [-0.1, 0.0 + 2.0, 0.0]]))
    _, kl3 = ppo_token_rewards(_t([1.0, 2.0]), logprobs, ref_logprobs, mask, 0.1, kl_estimator="k3")
    torch.testing.assert_close(kl3, kl_k3(logprobs, ref_logprobs) * mask)


def test_whiten_mean_zero_std_one():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(8, 10, generator=gen) * 3 + 5
    mask = (torch.rand(8, 10, generator=gen) > 0.3).float()
    whitened = whiten(x, mask)
    real = whitened[mask.bool()]
    assert real.mean().item() == pytest.approx(0.0, abs=1e-5)
    assert real.std().item() == pytest.approx(1.0, abs=1e-4)  # unbiased, like TRL's masked_whiten
    assert torch.equal(whitened[~mask.bool()], torch.zeros(int((mask == 0).sum())))
    population = whiten(x, mask, unbiased=False)[mask.bool()]
    assert population.std(unbiased=False).item() == pytest.approx(1.0, abs=1e-4)
    kept_mean = whiten(x, mask, shift_mean=False)[mask.bool()]
    assert kept_mean.mean().item() == pytest.approx(x[mask.bool()].mean().item(), abs=1e-4)
    assert whiten(x).mean().item() == pytest.approx(0.0, abs=1e-5)


def test_clipped_value_loss():
    values = _t([[1.0, 0.0, 0.6, 50.0]])
    old_values = _t([[0.5, 0.5, 0.5, 0.0]])
    returns = _t([[2.0, 0.0, 1.0, -50.0]])
    mask = _t([[1, 1, 1, 0]])
    loss, clip_fraction = clipped_value_loss(values, old_values, returns, mask, clip_range_value=0.2)
    # V_clip = [0.7, 0.3, 0.6]; max errors = [1.69, 0.09, 0.16]
    assert loss.item() == pytest.approx(0.5 * (1.69 + 0.09 + 0.16) / 3, abs=1e-6)
    assert clip_fraction.item() == pytest.approx(2 / 3)
    # without the clip the first element would give 1.0: the clip made the loss larger (pessimistic)
    unclipped, _ = clipped_value_loss(values, old_values, returns, mask, clip_range_value=10.0)
    assert unclipped.item() == pytest.approx(0.5 * (1.0 + 0.0 + 0.16) / 3, abs=1e-6)


def test_explained_variance():
    returns = _t([[1.0, 2.0, 3.0, 100.0]])
    mask = _t([[1, 1, 1, 0]])
    assert explained_variance(returns, returns, mask).item() == pytest.approx(1.0)
    assert explained_variance(torch.full_like(returns, 2.0), returns, mask).item() == pytest.approx(0.0)
    residual_explained = explained_variance(_t([[1.0, 2.0, 4.0, 0.0]]), returns, mask)
    assert residual_explained.item() == pytest.approx(1 - (2 / 9) / (2 / 3))  # 1 - Var[R-V] / Var[R]
    assert math.isnan(explained_variance(returns, torch.ones_like(returns), mask).item())


# ----------------------------------------------------------------------------------------------
# masked reductions and aggregation


def test_masked_reductions():
    x = _t([[1, 2, float("-inf")], [4, float("nan"), 6]])
    mask = _t([[1, 1, 0], [1, 0, 1]])
    assert masked_sum(x, mask).item() == 13.0
    torch.testing.assert_close(masked_mean(x, mask, dim=-1), _t([1.5, 5.0]))
    assert masked_mean(x, mask).item() == pytest.approx(13 / 4)
    assert masked_mean(_t([[3.0]]), _t([[0.0]]), dim=-1).item() == 0.0  # empty row: 0, not nan


def test_aggregate_loss_types_differ_as_documented():
    per_token_loss = _t([[1, 1, 1, 1], [5, 100, 100, 100]])  # the 100s are padding
    mask = _t([[1, 1, 1, 1], [1, 0, 0, 0]])
    assert aggregate(per_token_loss, mask, "grpo").item() == pytest.approx((4 / 4 + 5 / 1) / 2)  # 3.0
    assert aggregate(per_token_loss, mask, "bnpo").item() == pytest.approx(9 / 5)
    assert aggregate(per_token_loss, mask, "dr_grpo", max_completion_length=8).item() == pytest.approx(9 / 16)
    assert aggregate(per_token_loss, mask, "dapo", num_items_in_batch=10).item() == pytest.approx(9 / 10)
    assert aggregate(per_token_loss, mask, "dapo").item() == pytest.approx(9 / 5)  # defaults to bnpo
    with pytest.raises(ValueError, match="loss_type"):
        aggregate(per_token_loss, mask, "token_mean")
    with pytest.raises(ValueError, match="max_completion_length"):
        aggregate(per_token_loss, mask, "dr_grpo")


def test_dapo_accumulates_to_a_global_token_mean():
    logits, _, mask, gen = _random_batch(3)
    per_token_loss = torch.randn(mask.shape, generator=gen)
    total_tokens = mask.sum()
    halves = [
        aggregate(per_token_loss[:3], mask[:3], "dapo", num_items_in_batch=total_tokens),
        aggregate(per_token_loss[3:], mask[3:], "dapo", num_items_in_batch=total_tokens),
    ]
    torch.testing.assert_close(sum(halves), aggregate(per_token_loss, mask, "bnpo"))


# ----------------------------------------------------------------------------------------------
# clipped surrogate, ratios, GSPO


def test_clipped_surrogate_values_and_indicators():
    ratio = _t([[0.5, 0.5, 1.5, 1.5, 1.0, 1.25, 1.3]])
    advantages = _t([[-1, 1, 1, -1, 1, 1, 1]])
    loss, low, high = clipped_surrogate(ratio, advantages, eps_low=0.2, eps_high=0.28)
    torch.testing.assert_close(loss, _t([[0.8, -0.5, -1.28, 1.5, -1.0, -1.25, -1.28]]))
    assert low.tolist() == [[True, False, False, False, False, False, False]]
    assert high.tolist() == [[False, False, True, False, False, False, True]]
    # eps_high defaults to eps_low, and (batch,) advantages broadcast over tokens
    loss_sym, _, high_sym = clipped_surrogate(_t([[1.25, 0.9]]), _t([2.0]), eps_low=0.2)
    torch.testing.assert_close(loss_sym, _t([[-2.4, -1.8]]))
    assert high_sym.tolist() == [[True, False]]


def test_on_policy_ratio_is_one_loss_is_minus_mean_advantage_gradient_nonzero():
    logits, token_ids, mask, _ = _random_batch(0)
    logprobs = selective_log_softmax(logits, token_ids)
    advantages = group_advantages(_t([1, 0, 0, 1, 1, 0]), num_generations=3)
    ratio = torch.exp(token_log_ratio(logprobs, logprobs.detach()))
    assert torch.equal(ratio.detach(), torch.ones_like(ratio))
    per_token_loss, low, high = clipped_surrogate(ratio, advantages, eps_low=0.2)
    assert not (low | high).any()
    loss = aggregate(per_token_loss, mask, "grpo")
    assert loss.item() == pytest.approx(-advantages.mean().item(), abs=1e-6)
    assert loss.item() == pytest.approx(0.0, abs=1e-6)  # group-normalised advantages sum to 0
    loss.backward()
    assert logits.grad.abs().max() > 1e-3, "zero loss, but the gradient must not be zero"
    # token_log_ratio detaches old_logprobs itself, so passing the live tensor is safe
    assert torch.equal(token_log_ratio(logprobs, logprobs), torch.zeros_like(logprobs))


def test_gspo_spec_vector():
    logprobs = _t([[-1.0, -2.0, -0.5]])
    old_logprobs = logprobs - _t([[0.1, -0.2, 0.4]])
    assert sequence_log_ratio(logprobs, old_logprobs, torch.ones(1, 3)).item() == pytest.approx(0.1, abs=1e-6)
    ratio = gspo_ratio(logprobs, old_logprobs, torch.ones(1, 3))
    torch.testing.assert_close(ratio, torch.full((1, 3), math.exp(0.1)))
    assert ratio[0, 0].item() == pytest.approx(1.1052, abs=1e-4)
    loss, low, high = clipped_surrogate(ratio, _t([1.0]), eps_low=3e-4, eps_high=4e-4)
    torch.testing.assert_close(loss, torch.full((1, 3), -1.0004))  # clipped to 1 + 4e-4
    assert high.all() and not low.any()
    loss, low, high = clipped_surrogate(ratio, _t([-1.0]), eps_low=3e-4, eps_high=4e-4)
    torch.testing.assert_close(loss, torch.full((1, 3), math.exp(0.1)))  # A < 0: min picks the unclipped
    assert not (low | high).any()


def _grad_of(loss_fn, seed: int) -> torch.Tensor:
    logits, token_ids, mask, gen = _random_batch(seed)
    loss = loss_fn(logits, token_ids, mask, gen)
    (grad,) = torch.autograd.grad(loss, logits)
    return loss.detach(), grad


def test_on_policy_gspo_gradient_equals_grpo_gradient():
    advantages = torch.randn(6, generator=torch.Generator().manual_seed(5))

    def grpo(logits, token_ids, mask, gen):
        logprobs = selective_log_softmax(logits, token_ids)
        ratio = torch.exp(token_log_ratio(logprobs, logprobs.detach()))
        return aggregate(clipped_surrogate(ratio, advantages, 0.2)[0], mask, "grpo")

    def gspo(logits, token_ids, mask, gen):
        logprobs = selective_log_softmax(logits, token_ids)
        ratio = gspo_ratio(logprobs, logprobs.detach(), mask)
        return aggregate(clipped_surrogate(ratio, advantages, 3e-4, 4e-4)[0], mask, "grpo")

    for seed in (0, 1, 2):
        grpo_loss, grpo_grad = _grad_of(grpo, seed)
        gspo_loss, gspo_grad = _grad_of(gspo, seed)
        torch.testing.assert_close(gspo_loss, grpo_loss)
        torch.testing.assert_close(gspo_grad, grpo_grad)
        assert grpo_grad.abs().max() > 1e-3


def test_off_policy_gspo_and_grpo_gradients_differ():
    advantages = torch.randn(6, generator=torch.Generator().manual_seed(5))

    def make(level):
        def loss_fn(logits, token_ids, mask, gen):
            logprobs = selective_log_softmax(logits, token_ids)
            old_logprobs = logprobs.detach() + 0.05 * torch.randn(logprobs.shape, generator=gen)
            if level == "token":
                ratio = torch.exp(token_log_ratio(logprobs, old_logprobs))
            else:
                ratio = gspo_ratio(logprobs, old_logprobs, mask)
            return aggregate(clipped_surrogate(ratio, advantages, 10.0)[0], mask, "grpo")  # no clipping

        return loss_fn

    _, grpo_grad = _grad_of(make("token"), 0)
    _, gspo_grad = _grad_of(make("sequence"), 0)
    assert not torch.allclose(grpo_grad, gspo_grad, atol=1e-5)


@pytest.mark.parametrize("eps", [10.0, 0.02])  # unclipped, and a range that clips some sequences
def test_gspo_token_equals_gspo_when_advantages_are_per_sequence(eps):
    advantages = torch.randn(6, generator=torch.Generator().manual_seed(7))

    def make(token_level):
        def loss_fn(logits, token_ids, mask, gen):
            logprobs = selective_log_softmax(logits, token_ids)
            old_logprobs = logprobs.detach() + 0.1 * torch.randn(logprobs.shape, generator=gen)
            ratio = gspo_ratio(logprobs, old_logprobs, mask, token_level=token_level)
            per_token_advantages = advantages.unsqueeze(1).expand_as(logprobs)  # A_it = A_i
            return aggregate(clipped_surrogate(ratio, per_token_advantages, eps)[0], mask, "grpo")

        return loss_fn

    seq_loss, seq_grad = _grad_of(make(False), 4)
    tok_loss, tok_grad = _grad_of(make(True), 4)
    torch.testing.assert_close(tok_loss, seq_loss)
    torch.testing.assert_close(tok_grad, seq_grad)
    assert seq_grad.abs().max() > 1e-4


def test_gspo_token_gradient_flows_per_token():
    logprobs = _t([[-1.0, -2.0, -0.5]]).requires_grad_(True)
    old_logprobs = logprobs.detach() - _t([[0.1, -0.2, 0.4]])
    ratio = gspo_ratio(logprobs, old_logprobs, torch.ones(1, 3), token_level=True)
    torch.testing.assert_close(ratio.detach(), torch.full((1, 3), math.exp(0.1)))
    ratio[0, 1].backward()  # d s_it / d log pi_t' = s_i if t' = t else 0
    torch.testing.assert_close(logprobs.grad, _t([[0.0, math.exp(0.1), 0.0]]))


# ----------------------------------------------------------------------------------------------
# the whole GRPO/GSPO loss against TRL's _compute_loss, transcribed


def _trl_compute_loss(
    per_token_logps, old_per_token_logps, ref_per_token_logps, advantages, completion_mask,
    epsilon_low, epsilon_high, beta, loss_type, importance_sampling_level, max_completion_length,
):
    """Transcribed from trl/trainer/grpo_trainer.py, GRPOTrainer._compute_loss (single process)."""
    ref_minus_logp = ref_per_token_logps - per_token_logps
    per_token_kl = torch.exp(ref_minus_logp) - ref_minus_logp - 1
    log_ratio = per_token_logps - old_per_token_logps
    if importance_sampling_level == "token":
        log_importance_weights = log_ratio
    else:
        lengths = completion_mask.sum(-1).clamp(min=1.0)
        log_importance_weights = (log_ratio * completion_mask).sum(-1) / lengths
        log_importance_weights = log_importance_weights.unsqueeze(-1)
    coef_1 = torch.exp(log_importance_weights)
    coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
    per_token_loss = -torch.min(coef_1 * advantages.unsqueeze(1), coef_2 * advantages.unsqueeze(1))
    per_token_loss = per_token_loss + beta * per_token_kl
    if loss_type == "grpo":
        return ((per_token_loss * completion_mask).sum(-1) / completion_mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "bnpo":
        return (per_token_loss * completion_mask).sum() / completion_mask.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":
        return (per_token_loss * completion_mask).sum() / (per_token_loss.size(0) * max_completion_length)
    return (per_token_loss * completion_mask).sum() / completion_mask.sum()  # dapo, num_items_in_batch


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_loss_matches_trl_transcription(loss_type, level):
    epsilon_low, epsilon_high, beta, max_len = 0.2, 0.28, 0.04, 9

    def ours(logits, token_ids, mask, gen):
        logprobs = selective_log_softmax(logits, token_ids)
        old_logprobs = logprobs.detach() + 0.3 * torch.randn(logprobs.shape, generator=gen)
        ref_logprobs = logprobs.detach() + 0.3 * torch.randn(logprobs.shape, generator=gen)
        advantages = group_advantages(torch.randint(0, 2, (6,), generator=gen).float(), 3)
        if level == "token":
            ratio = torch.exp(token_log_ratio(logprobs, old_logprobs))
        else:
            ratio = gspo_ratio(logprobs, old_logprobs, mask)
        per_token_loss = clipped_surrogate(ratio, advantages, epsilon_low, epsilon_high)[0]
        per_token_loss = per_token_loss + beta * kl_k3(logprobs, ref_logprobs)
        return aggregate(per_token_loss, mask, loss_type, max_completion_length=max_len)

    def trl(logits, token_ids, mask, gen):
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, token_ids.unsqueeze(-1)).squeeze(-1)
        old_logprobs = logprobs.detach() + 0.3 * torch.randn(logprobs.shape, generator=gen)
        ref_logprobs = logprobs.detach() + 0.3 * torch.randn(logprobs.shape, generator=gen)
        advantages = _trl_group_advantages(torch.randint(0, 2, (6,), generator=gen).float(), 3, "group")
        return _trl_compute_loss(
            logprobs, old_logprobs, ref_logprobs, advantages, mask,
            epsilon_low, epsilon_high, beta, loss_type, level, max_len,
        )

    our_loss, our_grad = _grad_of(ours, 11)
    trl_loss, trl_grad = _grad_of(trl, 11)
    torch.testing.assert_close(our_loss, trl_loss)
    torch.testing.assert_close(our_grad, trl_grad)


# ----------------------------------------------------------------------------------------------
# from logits


def test_selective_log_softmax_and_entropy():
    logits, token_ids, _, _ = _random_batch(2)
    expected = torch.log_softmax(logits, dim=-1).gather(-1, token_ids.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(selective_log_softmax(logits, token_ids), expected)
    low_precision = selective_log_softmax(logits.detach().bfloat16(), token_ids)
    assert low_precision.dtype == torch.float32
    torch.testing.assert_close(low_precision, expected.detach(), atol=0.05, rtol=0)
    entropy = entropy_from_logits(torch.zeros(2, 3, 16))
    torch.testing.assert_close(entropy, torch.full((2, 3), math.log(16)))  # uniform: log V
    peaked = torch.zeros(1, 1, 16)
    peaked[..., 0] = 100.0
    assert entropy_from_logits(peaked).item() == pytest.approx(0.0, abs=1e-6)
    probs = torch.softmax(logits.detach(), -1)
    torch.testing.assert_close(entropy_from_logits(logits.detach()), -(probs * probs.log()).sum(-1))
