"""Corrections for rollouts the learner did not sample itself: stale (asynchronous RL) or mismatched
(a rollout engine in another precision or with other kernels). Pure functions, and
`corrected_minibatch`, which the trainer applies to every minibatch before the algorithm's loss
(config.off_policy, off_policy_level, off_policy_cap), so any algorithm takes them unchanged.

Three policies, not two. A token a was sampled by the behaviour policy mu (the rollout copy, version
v, its own precision); the learner recomputes pi_prox, its weights at the start of this update (the
usual pi_old); pi_theta is being trained. With the behaviour ratio r = pi_prox(a) / mu(a):

    none       ratio pi_theta / pi_prox; mu is not read               (what a synchronous trainer does)
    naive      ratio pi_theta / mu: mu stands in for pi_old, the clip mixes staleness into the trust region
    decoupled  w * min(rho A, clip(rho, 1 - eps, 1 + eps) A),  rho = pi_theta / pi_prox,  w = r
               AReaL's decoupled PPO (arXiv 2505.24298): w corrects the sampling distribution, the
               clip is a trust region around pi_prox whatever the staleness
    tis        the same with w = min(r, C): truncated importance sampling (Yao et al. 2025)
    mis        w = 1 but tokens with r outside [1/C, C] leave the loss, numerator and denominator:
               masked importance sampling (verl's rejection sampling)

Each weight has no gradient. A weight w >= 0 factors out of the clipped surrogate,
w * min(rho A, clip(rho) A) = min(rho (w A), clip(rho) (w A)), and out of -rho A: so a weight is
applied as w * A, and a mask as the completion mask; the algorithm's own loss is not touched.

`level` says which r: "token" (each token's own), "sequence" (the product over the completion,
prod_t r_t) or "geometric" (its geometric mean, exp(mean_t log r_t), the length normalisation GSPO
uses), the sequence values given to every token of the completion. At
staleness 0 in exact arithmetic mu = pi_prox, r = 1, and every correction is ordinary PPO / GRPO.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from .losses import masked_sum

CORRECTIONS = ("none", "naive", "decoupled", "tis", "mis")
LEVELS = ("token", "sequence", "geometric")
LOG_RATIO_BOUND = 20.0  # |log r| is clamped here before exp (e^20 ~ 5e8): one wild token cannot overflow


@dataclass
class Correction:
    """What the loss uses instead of (pi_old, no weight, the completion mask). Shapes (N, T)."""

    old_logprobs: torch.Tensor  # what the ratio divides by: log pi_prox, or log mu (naive)
    weight: torch.Tensor | None  # multiplies each token's loss (detached); None: 1
    mask: torch.Tensor  # the tokens the loss averages over (mis: fewer)


def behaviour_log_ratio(prox_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor) -> torch.Tensor:
    """log r = log pi_prox(a) - log mu(a), (N, T), no gradient."""
    return prox_logprobs.detach().float() - behaviour_logprobs.detach().float()


def level_log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """log r at `level`, (N, T) -> (N, T): token: log r_t; sequence: sum_t log r_t (log of the product);
    geometric: mean_t log r_t; the sequence values broadcast over the completion's tokens."""
    if level == "token":
        return log_ratio
    total = masked_sum(log_ratio, mask, dim=-1)  # sum_t log r_t
    if level == "geometric":
        total = total / mask.float().sum(-1).clamp(min=1.0)  # mean_t log r_t
    elif level != "sequence":
        raise ValueError(f"off_policy_level must be one of {LEVELS}, got {level!r}")
    return total[:, None].expand_as(log_ratio)


def importance_weights(log_ratio: torch.Tensor, mask: torch.Tensor, correction: str, level: str = "token",
                       cap: float = 2.0) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(weight or None, kept mask) for `correction`, from log r = log pi_prox - log mu, (N, T) each.

        decoupled  w = r                       tis  w = min(r, C)
        mis        w = 1, kept = mask and 1/C <= r <= C          none, naive  w = 1, kept = mask
    """
    if correction not in CORRECTIONS:
        raise ValueError(f"off_policy must be one of {CORRECTIONS}, got {correction!r}")
    if correction in ("none", "naive"):
        return None, mask
    log_r = level_log_ratio(log_ratio, mask, level).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    ratio = torch.exp(log_r)  # r at the chosen level
    if correction == "decoupled":
        return ratio * mask, mask
    if correction == "tis":
        return ratio.clamp(max=cap) * mask, mask  # min(r, C)
    inside = (ratio >= 1.0 / cap) & (ratio <= cap)  # mis: 1/C <= r <= C
    return None, mask * inside


def correct(prox_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor | None, mask: torch.Tensor,
            correction: str = "none", level: str = "token", cap: float = 2.0) -> Correction:
    """The loss's inputs for `correction`. prox_logprobs: log pi_prox, the learner's own log pi_old;
    behaviour_logprobs: log mu, what the sampler recorded (`Rollout.sampling_logprobs`). (N, T) each."""
    if correction == "none":
        return Correction(prox_logprobs, None, mask)
    if behaviour_logprobs is None:
        raise ValueError(f"off_policy={correction!r} needs the behaviour policy's log-probs "
                         "(rollout.sampling_logprobs, recorded by the sampler); this rollout has none")
    if correction == "naive":
        return Correction(behaviour_logprobs.detach(), None, mask)
    log_ratio = behaviour_log_ratio(prox_logprobs, behaviour_logprobs)
    weight, kept = importance_weights(log_ratio, mask, correction, level, cap)
    return Correction(prox_logprobs, weight, kept)


def corrected_minibatch(minibatch, logprobs: torch.Tensor, config):
    """The minibatch the algorithm's loss sees under `config.off_policy` (a Rollout, the same one for
    "none"). logprobs: (N, T) log pi_theta of this minibatch, whose detached value is pi_prox when no
    pi_old was stored (on-policy: the weights before this update are the current ones).

        naive      old_logprobs = log mu
        decoupled  old_logprobs = log pi_prox, advantages = w * A      tis: the same with min(w, C)
        mis        old_logprobs = log pi_prox, completion_mask = the tokens with 1/C <= r <= C
                   (PPO's value loss then leaves those tokens out too)
    """
    if config.off_policy == "none":
        return minibatch
    prox = minibatch.old_logprobs if minibatch.old_logprobs is not None else logprobs.detach()
    fix = correct(prox, minibatch.sampling_logprobs, minibatch.completion_mask, config.off_policy,
                  config.off_policy_level, config.off_policy_cap)
    advantages = minibatch.advantages if fix.weight is None else minibatch.advantages * fix.weight
    return dataclasses.replace(minibatch, old_logprobs=fix.old_logprobs, advantages=advantages,
                               completion_mask=fix.mask)
