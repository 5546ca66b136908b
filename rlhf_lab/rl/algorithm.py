"""The contract between the training loop and an algorithm.

The loop (trainer.py) runs the same phases for every method and asks the algorithm at each hook:

    setup(policy)                     build what the method needs beside the policy  (PPO: its critic)
    check_budget(max_length)          refuse settings the generation budget cannot hold (DAPO)
    models()                          those models, trained with the policy           (PPO's separate critic)
    shape_rollout(rollout, sampler)   change the batch before the loss sees it        (DAPO, ReMax)
    needs_old_logprobs                must log pi_old be computed at rollout time?    (off-policy, PPO)
    needs_reference_logprobs          does the loss or the advantage use log pi_ref?  (PPO; beta > 0)
    before_update(rollout, old)       keep what the loss needs from the sampling policy (log pi_old, V_old)
    compute_advantages(rollout)       each completion token's advantage               (every method)
    loss(minibatch, policy)           the scalar to minimise, plus what it reports   (every method)
    after_step(metrics)               per-step state, e.g. an adaptive KL weight      (PPO)
    state_dict() / load_state_dict()  that state, so a step can be undone or resumed

Everything else (sampling, the reference model, the optimiser, minibatches, metrics, faults) is
the loop's job, and the loop names no algorithm. So ppo.py, grpo.py, dapo.py, gspo.py and
baselines.py each hold all of one method's behaviour and can be read side by side.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from .config import RLConfig
from .losses import sequence_log_ratio, token_log_ratio
from .rollout import PolicyOutput, Rollout, RolloutSampler


@dataclass
class LossInfo:
    """What a loss reports besides its value (all detached). Shapes (n, T) unless noted."""

    policy_loss: float
    ratio: torch.Tensor  # the importance ratio the loss applied to each token (GSPO: s_i)
    token_ratio: torch.Tensor  # raw pi / pi_old per token, what the dashboard's histogram shows
    sequence_ratio: torch.Tensor  # (n,) exp(mean_t log(pi / pi_old)): GSPO's s_i, a diagnostic for the others
    clipped_low: torch.Tensor  # bool: the clip at 1 - eps was active
    clipped_high: torch.Tensor  # bool: the clip at 1 + eps_high was active
    old_logprobs: torch.Tensor  # log pi_old, the sampling policy the ratio divides by
    value_loss: float = float("nan")
    value_clip_fraction: float = float("nan")
    explained_variance: float = float("nan")  # of the returns by the critic's values (PPO)
    kl_penalty: float = 0.0  # beta * mean k3, when the KL is in the loss

    @classmethod
    def of(cls, policy_loss: torch.Tensor, ratio: torch.Tensor, clipped_low: torch.Tensor,
           clipped_high: torch.Tensor, old_logprobs: torch.Tensor, minibatch: Rollout, policy: PolicyOutput,
           **extra) -> LossInfo:
        """The one way an algorithm fills its report: the raw ratios come from the log-probs."""
        logprobs = policy.logprobs.detach()
        return cls(
            policy_loss=policy_loss.item(), ratio=ratio.detach(),
            token_ratio=torch.exp(token_log_ratio(logprobs, old_logprobs)),
            sequence_ratio=torch.exp(sequence_log_ratio(logprobs, old_logprobs, minibatch.completion_mask)),
            clipped_low=clipped_low, clipped_high=clipped_high, old_logprobs=old_logprobs.detach(), **extra,
        )


class Algorithm(ABC):
    name = "base"
    config_class = RLConfig

    def __init__(self, config: RLConfig) -> None:
        if not isinstance(config, self.config_class):
            raise TypeError(f"{type(self).__name__} needs a {self.config_class.__name__}, "
                            f"got {type(config).__name__}")
        self.config = config

    def setup(self, policy: torch.nn.Module) -> None:  # noqa: B027  (an optional hook, empty on purpose)
        """Called once with the policy to train, before the optimiser is built."""

    def check_budget(self, max_completion_length: int) -> None:  # noqa: B027  (an optional hook)
        """Raise ValueError naming a setting that the generation budget cannot hold, at construction."""

    def models(self) -> dict[str, torch.nn.Module]:
        """Models this method trains besides the policy, by name: their parameters join the optimiser
        and their weights the saved state."""
        return {}

    def shape_rollout(self, rollout: Rollout, sampler: RolloutSampler) -> Rollout:
        """The batch the loss will see. `sampler(count)` draws more prompts if the method needs them."""
        return rollout

    @property
    def needs_old_logprobs(self) -> bool:
        """Compute log pi_old at rollout time? Only needed when minibatches go off-policy: on-policy the
        loss takes pi_old = pi_theta.detach() (policy_gradient.py)."""
        return not self.config.on_policy

    @property
    def needs_reference_logprobs(self) -> bool:
        """Does the loss (or the advantage) use log pi_ref? If not, a training step skips the reference
        model's forward over the whole batch and estimates the KL metrics on a few rows
        (`RLConfig.kl_metric_samples`). Default True: a method that says nothing gets them."""
        return True

    def before_update(self, rollout: Rollout, old: PolicyOutput | None) -> None:
        """Keep what the loss needs from the policy that sampled. `old` is that policy's no-grad forward
        over the rollout (with its value head's output, if any), None when nothing asked for it."""
        if old is not None and self.needs_old_logprobs:
            rollout.old_logprobs = old.logprobs

    @abstractmethod
    def compute_advantages(self, rollout: Rollout) -> None:
        """Fill rollout.advantages (N, T) (and, for PPO, rollout.returns)."""

    @abstractmethod
    def loss(self, minibatch: Rollout, policy: PolicyOutput) -> tuple[torch.Tensor, LossInfo]:
        """The scalar to minimise on one minibatch, and what it reports."""

    @property
    def kl_coefficient(self) -> float:
        """The weight of the KL to the reference in effect now (a metric: `kl_coef`)."""
        return 0.0

    def after_step(self, metrics: dict) -> None:  # noqa: B027  (an optional hook, empty on purpose)
        """Called once per completed step with its metrics row (PPO adapts its KL weight here)."""

    def state_dict(self) -> dict:
        """Per-step state that a restored or resumed run needs (none by default)."""
        return {}

    def load_state_dict(self, state: dict) -> None:  # noqa: B027  (nothing to load by default)
        """Restore what `state_dict` returned."""


def broadcast_to_tokens(per_sequence: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
    """(N,) -> (N, T): every token of a completion gets its completion's value (0 on padding)."""
    return per_sequence[:, None] * completion_mask
