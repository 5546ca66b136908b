"""GRPO — Group Relative Policy Optimization (DeepSeekMath, arXiv 2402.03300), with TRL's knobs.

    A_i     = (r_i - mean(r_group)) / (std(r_group) + 1e-4)      same A for every token of o_i
    r_it    = pi(o_it) / pi_old(o_it)                              token-level importance ratio
    loss_it = -min(r_it A_i, clip(r_it, 1 - eps, 1 + eps_high) A_i) + beta * k3_it
    loss    = aggregate(loss_it)   grpo: token mean per sequence, then mean | bnpo | dr_grpo | dapo

No critic: the G completions of the same prompt are each other's baseline.
Variants: Dr. GRPO (scale_rewards="none", loss_type="dr_grpo"), DAPO (epsilon_high=0.28,
loss_type="dapo", dynamic_sampling, overlong penalty).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .advantages import SCALE_REWARDS, group_advantages
from .algorithm import Algorithm, LossInfo, broadcast_to_tokens
from .config import RLConfig, check_choice, check_number
from .kl import kl_k3
from .losses import LOSS_TYPES, aggregate, clipped_surrogate, sequence_log_ratio, token_log_ratio


@dataclass
class GRPOConfig(RLConfig):
    algo: str = "grpo"
    loss_type: str = "grpo"  # grpo | bnpo | dr_grpo | dapo
    scale_rewards: str = "group"  # group | batch | none (Dr. GRPO)
    dynamic_sampling: bool = False  # DAPO: drop groups whose rewards are all equal, refill the batch
    max_resample_rounds: int = 4  # dynamic sampling gives up refilling after this many extra draws
    mask_truncated_completions: bool = False  # DAPO: truncated completions do not enter the loss
    overlong_buffer: int = 0  # DAPO soft overlong penalty: length of the buffer zone (0 = off)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_number("num_generations", self.num_generations, low=2, integer=True)
        check_choice("loss_type", self.loss_type, LOSS_TYPES)
        check_choice("scale_rewards", self.scale_rewards, SCALE_REWARDS)
        check_number("max_resample_rounds", self.max_resample_rounds, low=0, integer=True)
        check_number("overlong_buffer", self.overlong_buffer, low=0, integer=True)


class GRPO(Algorithm):
    name = "grpo"
    config_class = GRPOConfig
    group_based = True

    def compute_advantages(self, rollout):
        c = self.config
        advantages = group_advantages(rollout.rewards, c.num_generations, c.scale_rewards)  # (N,)
        rollout.advantages = broadcast_to_tokens(advantages, rollout.completion_mask)

    def importance_ratio(self, logprobs, old_logprobs, mask):
        """Token-level: every token has its own ratio pi / pi_old."""
        return torch.exp(token_log_ratio(logprobs, old_logprobs))

    def loss(self, minibatch, policy):
        c, mask = self.config, minibatch.completion_mask
        ratio = self.importance_ratio(policy.logprobs, minibatch.old_logprobs, mask)
        per_token, clipped_low, clipped_high = clipped_surrogate(ratio, minibatch.advantages, c.eps_low, c.eps_high)
        policy_loss = aggregate(per_token, mask, c.loss_type, max_completion_length=self.length_constant(mask))
        loss, kl_loss = policy_loss, torch.zeros(())
        if c.beta > 0:  # GRPO puts the KL in the loss (k3, always >= 0), not in the reward
            kl = kl_k3(policy.logprobs, minibatch.ref_logprobs)
            kl_loss = aggregate(c.beta * kl, mask, c.loss_type, max_completion_length=self.length_constant(mask))
            loss = policy_loss + kl_loss
        info = LossInfo(
            policy_loss=policy_loss.item(),
            ratio=ratio.detach(),
            clipped_low=clipped_low,
            clipped_high=clipped_high,
            sequence_ratio=torch.exp(sequence_log_ratio(policy.logprobs.detach(), minibatch.old_logprobs, mask)),
            token_ratio=torch.exp(token_log_ratio(policy.logprobs.detach(), minibatch.old_logprobs)),
            kl_penalty=kl_loss.item(),
        )
        return loss, info
