"""The baselines of the story: REINFORCE (with and without a mean baseline), RLOO and ReMax.

They share the policy-gradient loss (ratio, optional clip, aggregation: policy_gradient.py) and
differ only in the advantage, i.e. in the baseline subtracted from each completion's reward:

    REINFORCE        A_i = r_i                               (Williams 1992)
    REINFORCE+mean   A_i = r_i - mean(r over the batch)
    RLOO             A_i = r_i - mean_{j != i} r_j  = G/(G-1) (r_i - mean r_group)   (arXiv 2402.14740)
    ReMax            A_i = r_i - r(greedy completion of the same prompt)             (arXiv 2310.10505)
"""

from __future__ import annotations

from dataclasses import dataclass

from ..util.validation import setting
from .advantages import REINFORCE_BASELINES, reinforce_advantages, remax_advantages, rloo_advantages
from .policy_gradient import PolicyGradient, PolicyGradientConfig


@dataclass
class ReinforceConfig(PolicyGradientConfig):
    algo: str = "reinforce"
    baseline: str = setting("none", choices=REINFORCE_BASELINES, help="none | mean")
    clip: bool = False


@dataclass
class RLOOConfig(PolicyGradientConfig):
    algo: str = "rloo"
    num_generations: int = setting(8, ge=2, help="G per prompt: the others are the baseline")


@dataclass
class ReMaxConfig(PolicyGradientConfig):
    algo: str = "remax"


class Reinforce(PolicyGradient):
    name = "reinforce"
    config_class = ReinforceConfig

    def outcome_advantages(self, rollout):
        return reinforce_advantages(rollout.rewards, self.config.baseline)


class RLOO(PolicyGradient):
    name = "rloo"
    config_class = RLOOConfig

    def outcome_advantages(self, rollout):
        return rloo_advantages(rollout.rewards, self.config.num_generations)


class ReMax(PolicyGradient):
    name = "remax"
    config_class = ReMaxConfig

    def shape_rollout(self, rollout, sampler):
        """Score one greedy answer per prompt: the baseline of its G samples."""
        prompts = rollout.examples[:: rollout.num_generations]
        rollout.greedy_rewards = sampler.greedy_rewards(prompts)
        return rollout

    def outcome_advantages(self, rollout):
        return remax_advantages(rollout.rewards, rollout.greedy_rewards, self.config.num_generations)
