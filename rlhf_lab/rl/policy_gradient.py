"""The critic-free policy gradient that REINFORCE, RLOO, ReMax, GRPO, DAPO and GSPO share.

Each of them scores a whole completion, turns the scores into one advantage A_i per completion
(that is all that tells them apart: `outcome_advantages`), gives every token of o_i that A_i, and
minimises the same surrogate. With r_i the reward of completion o_i and rho the importance ratio:

    rho_it  = pi(o_it) / pi_old(o_it)                                 `importance_ratio` (GSPO: s_i)
    loss_it = -min(rho_it A_i, clip(rho_it, 1 - eps, 1 + eps_high) A_i)    clip = True
            = -rho_it A_i                                                clip = False (REINFORCE)
            + beta * k3_it                                               beta > 0: KL to pi_ref in the loss
    loss    = aggregate(loss_it)      loss_type: grpo (token mean per sequence, then mean) | bnpo
                                                 | dr_grpo | dapo

On-policy (one pass, one minibatch) the policy that sampled is the one being updated, so
pi_old = pi_theta.detach(): rho is exactly 1 with a live gradient, the clip never acts, and the
gradient is -(1/N) sum_i A_i (1/|o_i|) sum_t grad log pi(o_it): REINFORCE, the same gradient as the
loss -A_i log pi(o_it) has.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass

import torch

from ..util.validation import setting
from .algorithm import Algorithm, LossInfo, broadcast_to_tokens
from .config import RLConfig
from .kl import kl_k3
from .losses import LOSS_TYPES, aggregate, clipped_surrogate, token_log_ratio


@dataclass
class PolicyGradientConfig(RLConfig):
    loss_type: str = setting("grpo", choices=LOSS_TYPES, help="how per-token losses are averaged")
    clip: bool = setting(True, help="False: the plain importance-weighted policy gradient -rho * A")
    beta: float = setting(0.0, ge=0, help="weight of the k3 KL to the reference in the loss")


class PolicyGradient(Algorithm):
    """One advantage per completion, broadcast to its tokens; the surrogate above."""

    config_class = PolicyGradientConfig

    @abstractmethod
    def outcome_advantages(self, rollout) -> torch.Tensor:
        """(N,) one advantage per completion, from rollout.rewards (and the baseline of the method)."""

    def compute_advantages(self, rollout) -> None:
        rollout.advantages = broadcast_to_tokens(self.outcome_advantages(rollout), rollout.completion_mask)

    def old_logprobs(self, minibatch, policy) -> torch.Tensor:
        """log pi_old (N, T): stored at rollout time when the update goes off-policy; on-policy the
        policy being updated is the one that sampled, so pi_old = pi_theta.detach() (as TRL does)."""
        return policy.logprobs.detach() if minibatch.old_logprobs is None else minibatch.old_logprobs

    def importance_ratio(self, logprobs, old_logprobs, mask) -> torch.Tensor:
        """Token-level: every token has its own ratio rho = pi / pi_old. (N, T)."""
        return torch.exp(token_log_ratio(logprobs, old_logprobs))

    def loss(self, minibatch, policy):
        c, mask, advantages = self.config, minibatch.completion_mask, minibatch.advantages
        old_logprobs = self.old_logprobs(minibatch, policy)
        ratio = self.importance_ratio(policy.logprobs, old_logprobs, mask)
        if c.clip:
            per_token, clipped_low, clipped_high = clipped_surrogate(ratio, advantages, c.eps_low, c.eps_high)
        else:  # same value as -A on-policy, gradient A * grad log pi (REINFORCE)
            per_token = -ratio * advantages
            clipped_low = clipped_high = torch.zeros_like(mask, dtype=torch.bool)
        # Dr. GRPO's constant: the generation budget
        length = minibatch.max_completion_length or mask.shape[1]
        policy_loss = aggregate(per_token, mask, c.loss_type, max_completion_length=length)
        loss, kl_loss = policy_loss, torch.zeros(())
        if c.beta > 0:  # the KL in the loss (k3, always >= 0), not in the reward as PPO does
            kl = kl_k3(policy.logprobs, minibatch.ref_logprobs)
            kl_loss = aggregate(c.beta * kl, mask, c.loss_type, max_completion_length=length)
            loss = policy_loss + kl_loss
        report = LossInfo.of(policy_loss, ratio, clipped_low, clipped_high, old_logprobs, minibatch, policy,
                             kl_penalty=kl_loss.item())
        return loss, report

    @property
    def needs_reference_logprobs(self) -> bool:
        """Only the beta * k3 term reads log pi_ref: at beta = 0 (TRL's default) the reference forward
        would feed nothing but the KL metrics."""
        return self.config.beta > 0

    @property
    def kl_coefficient(self) -> float:
        return self.config.beta
