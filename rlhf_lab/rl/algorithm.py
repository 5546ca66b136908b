"""The contract between the training loop and an algorithm.

An algorithm says two things, and nothing else:
  1. `compute_advantages(rollout)`: how each completion token gets its advantage (fills rollout.advantages);
  2. `loss(minibatch, policy)`: the scalar to minimise, plus the statistics the dashboard shows.
Everything else (sampling, reference model, optimiser, minibatches, metrics) is the loop's job,
so ppo.py, grpo.py and gspo.py can be read side by side and differ only where the methods differ.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from .config import RLConfig
from .rollout import PolicyOutput, Rollout


@dataclass
class LossInfo:
    """What a loss reports besides its value (all detached). Shapes (n, T) unless noted."""

    policy_loss: float
    ratio: torch.Tensor  # importance ratio applied to each token
    clipped_low: torch.Tensor  # bool: the clip at 1 - eps was active
    clipped_high: torch.Tensor  # bool: the clip at 1 + eps_high was active
    sequence_ratio: torch.Tensor | None = None  # (n,) GSPO's s_i, or exp(mean log ratio) for others
    token_ratio: torch.Tensor | None = None  # raw pi/pi_old per token when `ratio` is not (GSPO)
    value_loss: float = float("nan")
    value_clip_fraction: float = float("nan")
    kl_penalty: float = 0.0  # beta * mean k3, when the KL is in the loss


class Algorithm(ABC):
    name = "base"
    config_class = RLConfig
    uses_critic = False  # PPO: a value head or a separate critic
    uses_greedy_baseline = False  # ReMax: a greedy completion per prompt
    group_based = False  # advantages compare the G completions of a prompt

    def __init__(self, config: RLConfig) -> None:
        if not isinstance(config, self.config_class):
            raise TypeError(f"{type(self).__name__} needs a {self.config_class.__name__}, got {type(config).__name__}")
        self.config = config
        self.max_completion_length: int | None = None  # set by the Trainer; Dr. GRPO's constant divisor

    def length_constant(self, completion_mask: torch.Tensor) -> int:
        """The constant L of `dr_grpo` aggregation: the generation budget, not this batch's width."""
        return self.max_completion_length or completion_mask.shape[1]

    @abstractmethod
    def compute_advantages(self, rollout: Rollout) -> None:
        """Fill rollout.advantages (N, T) (and, for PPO, rollout.returns)."""

    @abstractmethod
    def loss(self, minibatch: Rollout, policy: PolicyOutput) -> tuple[torch.Tensor, LossInfo]:
        """The scalar to minimise on one minibatch, and what it reports."""

    def after_step(self, metrics: dict) -> None:  # noqa: B027  (an optional hook, empty on purpose)
        """Hook for per-step state (PPO's adaptive KL coefficient)."""


def broadcast_to_tokens(per_sequence: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
    """(N,) -> (N, T): every token of a completion gets its completion's value (0 on padding)."""
    return per_sequence[:, None] * completion_mask
