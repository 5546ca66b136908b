"""The baselines of the story: REINFORCE (with and without a mean baseline), RLOO and ReMax.

They share GRPO's loss machinery (ratio, optional clip, aggregation) and differ only in the
advantage, i.e. in the baseline subtracted from each completion's reward:

    REINFORCE        A_i = r_i                               (Williams 1992)
    REINFORCE+mean   A_i = r_i - mean(r over the batch)
    RLOO             A_i = r_i - mean_{j != i} r_j  = G/(G-1) (r_i - mean r_group)   (arXiv 2402.14740)
    ReMax            A_i = r_i - r(greedy completion of the same prompt)             (arXiv 2310.10505)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .advantages import REINFORCE_BASELINES, reinforce_advantages, remax_advantages, rloo_advantages
from .algorithm import LossInfo, broadcast_to_tokens
from .config import RLConfig, check_choice, check_number
from .grpo import GRPO
from .losses import LOSS_TYPES, aggregate, sequence_log_ratio


@dataclass
class BaselineConfig(RLConfig):
    loss_type: str = "grpo"
    clip: bool = True  # False: plain importance-weighted policy gradient, -ratio * A
    beta: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("loss_type", self.loss_type, LOSS_TYPES)


@dataclass
class ReinforceConfig(BaselineConfig):
    algo: str = "reinforce"
    baseline: str = "none"  # none | mean
    clip: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("baseline", self.baseline, REINFORCE_BASELINES)


@dataclass
class RLOOConfig(BaselineConfig):
    algo: str = "rloo"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_number("num_generations", self.num_generations, low=2, integer=True)


@dataclass
class ReMaxConfig(BaselineConfig):
    algo: str = "remax"


class _BaselineMethod(GRPO):
    """GRPO's loss with an optional clip; subclasses define only the advantage."""

    group_based = False

    def loss(self, minibatch, policy):
        if self.config.clip:
            return super().loss(minibatch, policy)
        # No clip: -ratio * A. Same value as -A on-policy, gradient A * grad log pi (REINFORCE).
        c, mask = self.config, minibatch.completion_mask
        ratio = self.importance_ratio(policy.logprobs, minibatch.old_logprobs, mask)
        loss = aggregate(-ratio * minibatch.advantages, mask, c.loss_type, max_completion_length=self.length_constant(mask))
        never = torch.zeros_like(mask, dtype=torch.bool)
        return loss, self._info(loss, ratio, never, never, minibatch, policy)

    def _info(self, loss, ratio, low, high, minibatch, policy):
        mask = minibatch.completion_mask
        return LossInfo(policy_loss=loss.item(), ratio=ratio.detach(), clipped_low=low, clipped_high=high,
                        sequence_ratio=torch.exp(sequence_log_ratio(policy.logprobs.detach(), minibatch.old_logprobs, mask)))


class Reinforce(_BaselineMethod):
    name = "reinforce"
    config_class = ReinforceConfig

    def compute_advantages(self, rollout):
        advantages = reinforce_advantages(rollout.rewards, self.config.baseline)
        rollout.advantages = broadcast_to_tokens(advantages, rollout.completion_mask)


class RLOO(_BaselineMethod):
    name = "rloo"
    config_class = RLOOConfig
    group_based = True

    def compute_advantages(self, rollout):
        advantages = rloo_advantages(rollout.rewards, self.config.num_generations)
        rollout.advantages = broadcast_to_tokens(advantages, rollout.completion_mask)


class ReMax(_BaselineMethod):
    name = "remax"
    config_class = ReMaxConfig
    uses_greedy_baseline = True

    def compute_advantages(self, rollout):
        advantages = remax_advantages(rollout.rewards, rollout.greedy_rewards, self.config.num_generations)
        rollout.advantages = broadcast_to_tokens(advantages, rollout.completion_mask)
