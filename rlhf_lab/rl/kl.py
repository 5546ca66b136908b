"""KL estimators and KL-coefficient controllers.

The KL between the policy and the frozen reference is never computed exactly (that would need a sum
over every possible completion). Instead each sampled token gives a one-sample estimate. With
x = log pi_ref(a) - log pi(a) and a ~ pi (John Schulman, "Approximating KL Divergence", 2020):

    k1 = -x = log pi - log pi_ref          unbiased, can be negative, high variance
    k2 = x^2 / 2                           biased, always >= 0, low variance
    k3 = exp(x) - x - 1                    unbiased, always >= 0, low variance

PPO for RLHF (Ziegler et al. 2019, OpenAI lm-human-preferences; TRL's PPOTrainer default) puts
-kl_coef * k1 into the per-token reward. GRPO (DeepSeekMath, arXiv 2402.03300; TRL's GRPOTrainer)
adds beta * k3 to the loss instead.

All functions take log-probabilities of the sampled tokens, shape (batch, seq), and return the
per-token estimate with the same shape in float32. Masking padded positions is the caller's job.
"""

from __future__ import annotations

import torch

KL_ESTIMATORS = ("k1", "k2", "k3")


def kl_k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k1 = log pi(a) - log pi_ref(a). Shapes (batch, seq) -> (batch, seq)."""
    return logprobs.float() - ref_logprobs.float()  # k1 = log(pi / pi_ref)


def kl_k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k2 = 0.5 * (log pi(a) - log pi_ref(a))^2. Shapes (batch, seq) -> (batch, seq)."""
    return 0.5 * (logprobs.float() - ref_logprobs.float()) ** 2  # k2 = (log pi - log pi_ref)^2 / 2


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k3 = pi_ref/pi - log(pi_ref/pi) - 1, the estimator GRPO adds to its loss.

    Shapes (batch, seq) -> (batch, seq). Computed as expm1(x) - x with x = log pi_ref - log pi: the
    same value as exp(x) - x - 1, but it cannot round to a tiny negative number when x is near 0
    (expm1 is accurate there, and expm1(x) >= x holds after rounding too).
    """
    log_ratio = ref_logprobs.float() - logprobs.float()  # x = log(pi_ref / pi)
    return torch.expm1(log_ratio) - log_ratio  # k3 = e^x - x - 1 = (e^x - 1) - x


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k1") -> torch.Tensor:
    """Per-token KL estimate by name: "k1", "k2" or "k3". Shapes (batch, seq) -> (batch, seq)."""
    if estimator == "k1":
        return kl_k1(logprobs, ref_logprobs)
    if estimator == "k2":
        return kl_k2(logprobs, ref_logprobs)
    if estimator == "k3":
        return kl_k3(logprobs, ref_logprobs)
    raise ValueError(f"kl_estimator must be one of {KL_ESTIMATORS}, got {estimator!r}")


class FixedKLController:
    """A constant KL coefficient; `update` does nothing. Same interface as AdaptiveKLController."""

    def __init__(self, kl_coef: float):
        if kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> float:
        return self.value


class AdaptiveKLController:
    """Adaptive KL coefficient from Ziegler et al. 2019 (arXiv 1909.08593), OpenAI lm-human-preferences.

    After each batch of `n_steps` samples whose mean KL (summed over tokens) was `current_kl`:

        error = clip(current_kl / target - 1, -0.2, 0.2)
        beta <- beta * (1 + error * n_steps / horizon)

    so beta grows when the policy drifts past the target KL and shrinks when it stays below.
    The clip bounds the change per sample; `horizon` sets how many samples a full 20% change takes.
    OpenAI's defaults: init 0.2 (we keep no default), target 6 nats, horizon 10000.
    """

    def __init__(self, init_kl_coef: float, target: float, horizon: int):
        if init_kl_coef < 0:
            raise ValueError(f"init_kl_coef must be >= 0, got {init_kl_coef}")
        if target <= 0:
            raise ValueError(f"target must be > 0, got {target}")
        if horizon <= 0:
            raise ValueError(f"horizon must be > 0, got {horizon}")
        self.value = float(init_kl_coef)
        self.target = float(target)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> float:
        """Update and return the coefficient. `current_kl` may be a float or a 0-d tensor."""
        proportional_error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)  # clip(KL/target-1)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon  # beta *= 1 + err * n / horizon
        return self.value
