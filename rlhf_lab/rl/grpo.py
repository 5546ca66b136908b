"""GRPO — Group Relative Policy Optimization (DeepSeekMath, arXiv 2402.03300), with TRL's knobs.

    A_i     = (r_i - mean(r_group)) / (std(r_group) + 1e-4)      same A for every token of o_i
    r_it    = pi(o_it) / pi_old(o_it)                              token-level importance ratio
    loss_it = -min(r_it A_i, clip(r_it, 1 - eps, 1 + eps_high) A_i) + beta * k3_it
    loss    = aggregate(loss_it)   grpo: token mean per sequence, then mean | bnpo | dr_grpo | dapo

No critic: the G completions of the same prompt are each other's baseline. The loss is the shared
policy gradient (policy_gradient.py); this file adds the group advantage and DAPO's batch shaping.
Variants: Dr. GRPO (scale_rewards="none", loss_type="dr_grpo"); DAPO (arXiv 2503.14476:
epsilon_high=0.28, loss_type="dapo", dynamic_sampling, overlong_buffer or mask_truncated_completions).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..util.validation import check_bool, check_choice, check_number
from .advantages import SCALE_REWARDS, group_advantages, overlong_soft_penalty
from .policy_gradient import PolicyGradient, PolicyGradientConfig
from .rollout import Rollout


@dataclass
class GRPOConfig(PolicyGradientConfig):
    algo: str = "grpo"
    scale_rewards: str = "group"  # group | batch | none (Dr. GRPO)
    dynamic_sampling: bool = False  # DAPO: drop groups whose rewards are all equal, refill the batch
    max_resample_rounds: int = 4  # dynamic sampling gives up refilling after this many extra draws
    mask_truncated_completions: bool = False  # DAPO: truncated completions do not enter the loss
    overlong_buffer: int = 0  # DAPO soft overlong penalty: length of the buffer zone (0 = off)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_number("num_generations", self.num_generations, low=2, integer=True)
        check_choice("scale_rewards", self.scale_rewards, SCALE_REWARDS)
        check_bool("dynamic_sampling", self.dynamic_sampling)
        check_number("max_resample_rounds", self.max_resample_rounds, low=0, integer=True)
        check_bool("mask_truncated_completions", self.mask_truncated_completions)
        check_number("overlong_buffer", self.overlong_buffer, low=0, integer=True)


class GRPO(PolicyGradient):
    name = "grpo"
    config_class = GRPOConfig

    def __init__(self, config: GRPOConfig) -> None:
        super().__init__(config)
        self.shaping: dict = {}  # what shape_rollout did at the last step (metrics)

    def outcome_advantages(self, rollout):
        return group_advantages(rollout.rewards, self.config.num_generations, self.config.scale_rewards)

    def shape_rollout(self, rollout, sampler):
        """DAPO's three changes to the batch, each off by default."""
        c = self.config
        if c.dynamic_sampling:
            rollout = self.keep_informative_groups(rollout, sampler)
        if c.overlong_buffer:  # a graded penalty for answers that run into the length limit
            rollout.rewards = rollout.rewards + overlong_soft_penalty(
                rollout.lengths, rollout.max_completion_length, c.overlong_buffer)
        if c.mask_truncated_completions:  # a cut-off answer is not evidence either way: no gradient
            rollout.completion_mask = rollout.completion_mask * rollout.finished[:, None].float()
        return rollout

    def keep_informative_groups(self, rollout: Rollout, sampler) -> Rollout:
        """Dynamic sampling: a group whose G rewards are all equal has A = 0 and gives no gradient.
        Drop such groups and draw new prompts until the batch is full again (or the rounds run out)."""
        c, G = self.config, rollout.num_generations
        parts, kept, seen = [], 0, 0
        for round_ in range(c.max_resample_rounds + 1):
            if round_:
                rollout = sampler(c.prompts_per_step)
            informative = rollout.rewards.view(-1, G).std(1) > 0  # (prompts,)
            parts.append(rollout.select(informative.repeat_interleave(G).nonzero().squeeze(1)))
            kept, seen = kept + int(informative.sum()), seen + len(informative)
            if kept >= c.prompts_per_step:
                break
        self.shaping = {"sampled_groups": seen, "sampled_zero_std_frac": 1 - kept / seen,
                        "resample_rounds": round_}
        if not kept:  # nothing informative at all: keep the last draw (its advantages are all 0)
            return rollout
        full = Rollout.concat(parts)
        return full.select(torch.arange(min(kept, c.prompts_per_step) * G, device=full.rewards.device))

    def after_step(self, metrics):
        metrics.update(self.shaping)
