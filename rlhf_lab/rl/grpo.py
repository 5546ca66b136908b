"""GRPO — Group Relative Policy Optimization (DeepSeekMath, arXiv 2402.03300), with TRL's knobs.

With r_i the reward of completion o_i, G completions per prompt and rho the importance ratio:

    A_i     = (r_i - mean(r_group)) / (std(r_group) + 1e-4)       same A for every token of o_i
    rho_it  = pi(o_it) / pi_old(o_it)                              token-level importance ratio
    loss_it = -min(rho_it A_i, clip(rho_it, 1 - eps, 1 + eps_high) A_i) + beta * k3_it
    loss    = aggregate(loss_it)   grpo: token mean per sequence, then mean | bnpo | dr_grpo | dapo

No critic: the G completions of the same prompt are each other's baseline (the mean includes the
completion itself; RLOO's leaves it out). The loss is the shared policy gradient
(policy_gradient.py); this file adds the group advantage. Dr. GRPO (arXiv 2503.20783) is a setting
of it: scale_rewards="none", loss_type="dr_grpo". DAPO changes the batch as well: dapo.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..util.validation import setting
from .advantages import SCALE_REWARDS, group_advantages
from .policy_gradient import PolicyGradient, PolicyGradientConfig


@dataclass
class GRPOConfig(PolicyGradientConfig):
    algo: str = "grpo"
    num_generations: int = setting(8, ge=2, help="G completions per prompt: a group needs two to compare")
    scale_rewards: str = setting("group", choices=SCALE_REWARDS, help="group | batch | none (Dr. GRPO)")


class GRPO(PolicyGradient):
    name = "grpo"
    config_class = GRPOConfig

    def outcome_advantages(self, rollout):
        return group_advantages(rollout.rewards, self.config.num_generations, self.config.scale_rewards)
