"""DAPO — Decoupled Clip and Dynamic sAmpling Policy Optimization (ByteDance Seed, arXiv 2503.14476).

GRPO (grpo.py) with four changes. Two are settings of the shared loss, two change the batch:

    clip-higher        eps_high = 0.28 > eps_low = 0.2: a rare token may grow further (epsilon_high)
    token-level loss   every token of the batch weighs the same (loss_type="dapo")
    dynamic sampling   a group whose G rewards are all equal has A = 0 and no gradient: drop it and
                       draw new prompts until the batch is full (dynamic_sampling)
    overlong shaping   an answer cut off at the length limit gets no gradient
                       (mask_truncated_completions), or a reward penalty that grows near the limit,
                       eq. 13 (overlong_buffer = L_cache):
                           0                                    if |y| <= L_max - L_cache
                           ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
                           -1                                   if |y| > L_max

The paper drops the KL term (beta = 0, the default here). TRL puts the same options on its
GRPOConfig; here they live with the method that introduced them. The paper's overlong buffer is 4,096
tokens of a 20,480 budget; at the lab's budget of a few tokens any buffer also penalises ordinary
answers, so it is off by default (0).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..util.validation import setting
from .grpo import GRPO, GRPOConfig
from .rollout import Rollout


@dataclass
class DAPOConfig(GRPOConfig):
    algo: str = "dapo"
    epsilon_high: float | None = 0.28  # clip-higher
    loss_type: str = "dapo"  # token-level: every token of the batch weighs the same
    dynamic_sampling: bool = setting(True, help="drop groups whose rewards are all equal, refill the batch")
    max_resample_rounds: int = setting(4, ge=0, help="dynamic sampling gives up after this many extra draws")
    mask_truncated_completions: bool = setting(False, help="truncated completions do not enter the loss")
    overlong_buffer: int = setting(0, ge=0, help="L_cache of the soft overlong penalty (0 = off)")

    def check(self) -> None:
        super().check()
        if self.max_completion_length is not None:
            check_overlong_buffer(self.overlong_buffer, self.max_completion_length)


def check_overlong_buffer(overlong_buffer: int, max_completion_length: int) -> None:
    """The soft penalty's zone lies inside the generation budget: overlong_buffer <= max_completion_length."""
    if overlong_buffer > max_completion_length:
        raise ValueError(f"overlong_buffer must satisfy 0 <= overlong_buffer <= {max_completion_length} (the "
                         f"max_completion_length, within which its penalty zone lies), got {overlong_buffer}")


class DAPO(GRPO):
    name = "dapo"
    config_class = DAPOConfig

    def __init__(self, config: DAPOConfig) -> None:
        super().__init__(config)
        self.shaping: dict = {}  # what shape_rollout did at the last step (metrics)

    def check_budget(self, max_completion_length: int) -> None:
        check_overlong_buffer(self.config.overlong_buffer, max_completion_length)

    def shape_rollout(self, rollout, sampler):
        """DAPO's changes to the batch, each one a setting."""
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


def overlong_soft_penalty(lengths: torch.Tensor, max_len: int, cache_len: int) -> torch.Tensor:
    """DAPO's soft overlong punishment (eq. 13), added to the task reward. (N,) -> (N,).

        0                                    if |y| <= L_max - L_cache
        ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max   (linear from 0 to -1)
        -1                                   if |y| > L_max
    """
    if not 0 < cache_len <= max_len:
        raise ValueError(f"cache_len must be in (0, max_len={max_len}], got {cache_len}")
    lengths = lengths.float()
    soft_start = max_len - cache_len  # L_max - L_cache
    penalty = (soft_start - lengths) / cache_len  # ((L_max - L_cache) - |y|) / L_cache
    penalty = torch.where(lengths <= soft_start, torch.zeros_like(penalty), penalty)
    return torch.where(lengths > max_len, torch.full_like(penalty, -1.0), penalty)
