"""Advantages: how much better than expected was each completion (or each token)?

Critic-free methods score whole completions and compare them with a baseline built from other
samples of the same prompt:

    group_advantages     GRPO (DeepSeekMath), Dr. GRPO, GSPO      A_i = (r_i - mean_group) / (std + eps)
    rloo_advantages      RLOO (arXiv 2402.14740)                  A_i = r_i - mean_{j != i} r_j
    remax_advantages     ReMax (arXiv 2310.10505)                 A_i = r_i - r(greedy)
    reinforce_advantages REINFORCE, optionally minus the batch mean

PPO learns a critic V and turns per-token rewards into per-token advantages with GAE
(Schulman et al. 2015, arXiv 1506.02438):

    ppo_token_rewards -> gae -> whiten

Layout: completions of the same prompt are contiguous rows, N = num_prompts * num_generations
(TRL's GRPOTrainer layout). Per-token tensors are (batch, seq), right-padded, with a 0/1 mask.
"""

from __future__ import annotations

import torch

from rlhf_lab.rl.kl import kl_estimate
from rlhf_lab.rl.losses import masked_mean, masked_var

SCALE_REWARDS = ("group", "batch", "none")
REINFORCE_BASELINES = ("none", "mean")


def _check_groups(rewards: torch.Tensor, num_generations: int) -> None:
    if num_generations < 2:
        raise ValueError(f"num_generations must be >= 2 (a group needs a baseline), got {num_generations}")
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D (num_prompts * G,), got shape {tuple(rewards.shape)}")
    if rewards.numel() % num_generations != 0:
        raise ValueError(
            f"len(rewards) must be a multiple of num_generations, got {rewards.numel()} rewards "
            f"and num_generations={num_generations}"
        )


# ----------------------------------------------------------------------------------------------
# outcome advantages (one value per completion)


def group_advantages(
    rewards: torch.Tensor, num_generations: int, scale_rewards: str = "group", eps: float = 1e-4
) -> torch.Tensor:
    """GRPO's group-relative advantage, TRL conventions. rewards: (N,) -> advantages: (N,).

        A_i = (r_i - mean_{group}(r)) / (std + eps)

    scale_rewards:
      "group"  std of the completion's own group (DeepSeekMath).
      "batch"  one std over the whole batch; the mean stays per group (TRL's option; Dr. GRPO
               argues the per-group std over-weights near-uniform groups: "question-difficulty bias").
      "none"   no division at all: A_i = r_i - mean (Dr. GRPO, arXiv 2503.20783).
    std is the sample std (divides by n - 1), and eps is added to the std, both as TRL does. A group
    whose rewards are all equal gets A = 0: it carries no learning signal.
    """
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards must be one of {SCALE_REWARDS}, got {scale_rewards!r}")
    rewards = rewards.float()
    _check_groups(rewards, num_generations)
    grouped = rewards.view(-1, num_generations)  # (num_prompts, G)
    group_mean = grouped.mean(dim=1).repeat_interleave(num_generations)  # mean_j r_j, per row
    advantages = rewards - group_mean  # r_i - mean
    if scale_rewards == "group":
        std = grouped.std(dim=1).repeat_interleave(num_generations)  # sqrt(sum (r - mean)^2 / (G - 1))
        advantages = advantages / (std + eps)  # / (std_group + eps)
    elif scale_rewards == "batch":
        advantages = advantages / (rewards.std() + eps)  # / (std_batch + eps)
    return advantages


def rloo_advantages(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    """REINFORCE Leave-One-Out (Ahmadian et al. 2024, arXiv 2402.14740). (N,) -> (N,).

        A_i = r_i - (1/(G-1)) sum_{j != i} r_j  =  G/(G-1) * (r_i - mean_j r_j)

    The baseline excludes the sample itself, so it is independent of it and the gradient estimate
    stays unbiased (GRPO's mean includes r_i).
    """
    rewards = rewards.float()
    _check_groups(rewards, num_generations)
    grouped = rewards.view(-1, num_generations)  # (num_prompts, G)
    group_sum = grouped.sum(dim=1, keepdim=True)  # S = sum_j r_j
    leave_one_out_mean = (group_sum - grouped) / (num_generations - 1)  # (S - r_i) / (G - 1)
    return (grouped - leave_one_out_mean).reshape(-1)  # r_i - mean_{j != i} r_j


def remax_advantages(
    rewards: torch.Tensor, greedy_rewards: torch.Tensor, num_generations: int
) -> torch.Tensor:
    """ReMax (Li et al. 2023, arXiv 2310.10505): the baseline is the reward of a greedy decode.

    rewards: (num_prompts * G,) sampled completions; greedy_rewards: (num_prompts,) one greedy
    completion per prompt. Returns (N,):  A_i = r(x, y_i) - r(x, y_greedy).
    num_generations may be 1 here (ReMax samples one completion per prompt).
    """
    rewards = rewards.float()
    greedy_rewards = greedy_rewards.float()
    if num_generations < 1 or rewards.numel() != greedy_rewards.numel() * num_generations:
        raise ValueError(
            f"len(rewards) must equal len(greedy_rewards) * num_generations, got {rewards.numel()}, "
            f"{greedy_rewards.numel()} and num_generations={num_generations}"
        )
    return rewards - greedy_rewards.repeat_interleave(num_generations)  # r_i - r_greedy


def reinforce_advantages(rewards: torch.Tensor, baseline: str = "none") -> torch.Tensor:
    """Vanilla REINFORCE (Williams 1992). (N,) -> (N,).

    baseline="none": A_i = r_i (every sampled completion is pushed up by its raw reward).
    baseline="mean": A_i = r_i - mean over the WHOLE batch (all prompts together). Simple, but the
    baseline ignores how hard each prompt is; the group baselines above fix that.
    """
    if baseline not in REINFORCE_BASELINES:
        raise ValueError(f"baseline must be one of {REINFORCE_BASELINES}, got {baseline!r}")
    rewards = rewards.float()
    if baseline == "mean":
        return rewards - rewards.mean()  # r_i - mean_batch(r)
    return rewards.clone()  # r_i


# ----------------------------------------------------------------------------------------------
# PPO: per-token rewards, GAE, whitening


def ppo_token_rewards(
    score: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    kl_coef: float,
    kl_estimator: str = "k1",
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO-RLHF per-token reward (Ziegler et al. 2019; Ouyang et al. 2022). Returns (rewards, kl).

    score: (batch,) reward-model/task score; logprobs, ref_logprobs, mask: (batch, seq); outputs
    (batch, seq).

        r_t = -kl_coef * kl_t                    every real token pays for drifting from pi_ref
        r_T += score                             the score arrives on the last real token

    (OpenRLHF's placement; TRL puts it one position past EOS. The two agree only when
    gamma = lambda = 1.) kl_t uses `kl_estimator` ("k1" = log pi - log pi_ref, the classic choice).
    Padded positions get reward 0 and kl 0. A row with no real token gets its score at position 0.
    """
    mask = mask.float()
    kl = kl_estimate(logprobs.detach(), ref_logprobs.detach(), kl_estimator) * mask  # kl_t, 0 on padding
    rewards = -kl_coef * kl  # r_t = -beta * kl_t
    positions = torch.arange(mask.shape[1], device=mask.device)
    last_index = (positions * mask).argmax(dim=1)  # index of the last real token per row
    rewards[torch.arange(mask.shape[0], device=mask.device), last_index] += score.float()  # r_T += score
    return rewards, kl


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised Advantage Estimation over right-padded completions. Returns (advantages, returns).

    rewards, values, mask: (batch, seq); mask is 1 on real tokens. The episode ends at the last real
    token, so the value after it is 0 (no bootstrap past the end), and nothing flows back from
    padding. With not_done_t = mask_{t+1} (1 while a real token follows):

        delta_t = r_t + gamma * V_{t+1} * not_done_t - V_t
        A_t     = delta_t + gamma * lam * not_done_t * A_{t+1}
        R_t     = A_t + V_t                      (the value head's regression target)

    Padded positions get A = R = 0. gamma = 1, lam = 0.95 are the usual RLHF settings.
    """
    rewards, values, mask = rewards.float().detach(), values.float().detach(), mask.float()
    batch, seq_len = rewards.shape
    advantages = torch.zeros_like(rewards)
    next_advantage = torch.zeros(batch, dtype=torch.float32, device=rewards.device)
    next_value = torch.zeros(batch, dtype=torch.float32, device=rewards.device)
    not_done = torch.zeros(batch, dtype=torch.float32, device=rewards.device)
    for t in reversed(range(seq_len)):
        delta = rewards[:, t] + gamma * next_value * not_done - values[:, t]  # r + gamma V' (1-done) - V
        next_advantage = (delta + gamma * lam * not_done * next_advantage) * mask[:, t]  # A_t
        advantages[:, t] = next_advantage
        next_value, not_done = values[:, t], mask[:, t]  # step back: t becomes t+1
    returns = (advantages + values) * mask  # R_t = A_t + V_t
    return advantages, returns


def whiten(
    values: torch.Tensor,
    mask: torch.Tensor | None = None,
    shift_mean: bool = True,
    eps: float = 1e-8,
    unbiased: bool = True,
) -> torch.Tensor:
    """Normalise to mean 0 and std 1 over the real positions (TRL's `masked_whiten`). Same shape out.

        x_hat = (x - mean) / sqrt(var + eps)        (+ mean back if shift_mean=False)

    shift_mean=False only rescales (used to whiten rewards without moving their sign).
    Variance is unbiased (n - 1) by default, like TRL, so `x_hat[mask].std()` (torch's default, also
    n - 1) is 1; unbiased=False uses n (the population variance). Statistics are over the whole
    batch, not per row. Masked-out positions are set to 0 in the output.
    """
    values = values.float()
    if mask is None:
        mask = torch.ones_like(values)
    mean = masked_mean(values, mask)  # mu over real tokens
    variance = masked_var(values, mask, unbiased=unbiased)  # sigma^2 over real tokens
    whitened = (values - mean) * torch.rsqrt(variance + eps)  # (x - mu) / sqrt(sigma^2 + eps)
    if not shift_mean:
        whitened = whitened + mean  # keep the original mean
    return torch.where(mask.bool(), whitened, torch.zeros_like(whitened))
