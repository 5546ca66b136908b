"""Pure loss pieces shared by PPO, GRPO, GSPO and the REINFORCE-style baselines.

Every algorithm module builds its loss from the same four steps:

    logprobs   = selective_log_softmax(logits / temperature, completion_ids)        (batch, seq)
    ratio      = exp(token_log_ratio(...))  or  gspo_ratio(...)                       (batch, seq)
    per_token  = clipped_surrogate(ratio, advantages, eps_low, eps_high)[0] (+ beta * kl)
    loss       = aggregate(per_token, completion_mask, loss_type)                     scalar

Conventions follow TRL's GRPOTrainer (trl/trainer/grpo_trainer.py) and PPO trainer
(trl/trainer/ppo_trainer.py, now trl/experimental/ppo), and the papers cited per function.
Masks are 0/1 (float or bool), 1 = a real completion token. Outputs are float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")


# ----------------------------------------------------------------------------------------------
# masked reductions


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of x where mask is 1. x, mask: same shape, e.g. (batch, seq).

    dim=None sums everything (scalar); dim=-1 gives one sum per row, e.g. (batch,).
    Uses `where`, not `x * mask`, so that inf/nan at padded positions (a -inf log-prob of a pad
    token, say) cannot leak into the result.
    """
    x = torch.where(mask.bool(), x.float(), torch.zeros((), dtype=torch.float32, device=x.device))
    return x.sum() if dim is None else x.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of x over positions where mask is 1: sum(x * mask) / sum(mask).

    x, mask: same shape, e.g. (batch, seq). dim=None -> scalar; dim=-1 -> (batch,).
    The count is clamped to >= 1 (as TRL does), so an empty row gives 0 rather than nan.
    """
    count = mask.float().sum() if dim is None else mask.float().sum(dim=dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1.0)  # sum(x m) / max(sum(m), 1)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of x over all positions where mask is 1 (scalar).

    unbiased=True multiplies by n / (n - 1) (Bessel), like TRL's `masked_var` default.
    """
    mean = masked_mean(x, mask)
    variance = masked_mean((x.float() - mean) ** 2, mask)  # (1/n) sum m (x - mu)^2
    if unbiased:
        n = mask.float().sum()
        if n < 2:
            raise ValueError(f"unbiased masked_var needs at least 2 unmasked values, got {int(n)}")
        variance = variance * n / (n - 1)  # Bessel's correction
    return variance


# ----------------------------------------------------------------------------------------------
# loss aggregation (the loss_type knob of TRL's GRPOTrainer)


def aggregate(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    loss_type: str,
    max_completion_length: int | None = None,
    num_items_in_batch: int | float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce a (batch, seq) per-token loss to a scalar. mask: (batch, seq), 1 = real token.

    loss_type:
      "grpo"    mean over sequences of each sequence's token mean (DeepSeekMath):
                (1/B) sum_i (1/|o_i|) sum_t l_it. A token's weight is 1/|o_i|: tokens of short
                completions weigh more (Dr. GRPO's "response-length bias").
      "bnpo"    every token of the batch weighs the same: sum_it l_it / sum_it m_it.
      "dr_grpo" sum_it l_it / (B * max_completion_length): a constant normaliser (Dr. GRPO,
                arXiv 2503.20783). max_completion_length is required.
      "dapo"    sum_it l_it / num_items_in_batch, the token count of the whole global batch, so that
                gradient-accumulation micro-batches add up to a true token mean (DAPO, arXiv 2503.14476).
                Defaults to this batch's token count, where it equals "bnpo".
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
    if loss_type == "grpo":
        return masked_mean(per_token_loss, mask, dim=-1).mean()  # (1/B) sum_i (1/|o_i|) sum_t l_it
    total = masked_sum(per_token_loss, mask)  # sum_it l_it m_it
    if loss_type == "bnpo":
        return total / mask.float().sum().clamp(min=1.0)  # / sum_it m_it
    if loss_type == "dr_grpo":
        if max_completion_length is None:
            raise ValueError("max_completion_length is required for loss_type='dr_grpo', got None")
        return total / (per_token_loss.shape[0] * max_completion_length)  # / (B * L_max)
    # dapo
    if num_items_in_batch is None:
        num_items_in_batch = mask.float().sum()
    return total / torch.as_tensor(num_items_in_batch, dtype=torch.float32).clamp(min=1.0)  # / N_tokens


# ----------------------------------------------------------------------------------------------
# importance ratios


def token_log_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor) -> torch.Tensor:
    """log r_t = log pi_theta(a_t) - log pi_old(a_t). Shapes (batch, seq) -> (batch, seq).

    old_logprobs is detached here: the sampling policy is data, never differentiated. So passing
    old_logprobs = logprobs (on-policy, num_iterations = 1) gives ratio 1 with a live gradient.
    """
    return logprobs.float() - old_logprobs.detach().float()  # log(pi / pi_old)


def sequence_log_ratio(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """GSPO's length-normalised sequence log-ratio, (batch, seq) -> (batch,).

    log s_i = (1/|y_i|) sum_t log(pi_theta(y_it) / pi_old(y_it))   (GSPO, arXiv 2507.18071, eq. 7)
    """
    return masked_mean(token_log_ratio(logprobs, old_logprobs), mask, dim=-1)  # mean_t log r_it


def gspo_ratio(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor, token_level: bool = False
) -> torch.Tensor:
    """GSPO's sequence ratio s_i broadcast over tokens, shape (batch, seq).

    token_level=False (GSPO):        s_it = s_i = exp(log s_i) for every t.
    token_level=True  (GSPO-token):  s_it = sg[s_i] * pi_theta(y_it) / sg[pi_theta(y_it)]
    GSPO-token has the value s_i at every token, but the gradient of s_it flows only through its
    own token: d s_it / d log pi(y_it) = s_i. With A_it = A_i and per-sequence token-mean
    aggregation it is GSPO exactly; it exists so that advantages may differ per token.
    """
    log_s = sequence_log_ratio(logprobs, old_logprobs, mask).unsqueeze(-1)  # (batch, 1)
    if token_level:
        logprobs = logprobs.float()
        log_s = log_s.detach() + logprobs - logprobs.detach()  # log s_it = sg[log s_i] + log pi - sg[log pi]
    return torch.exp(log_s).expand_as(logprobs)  # s_i = exp(log s_i)


# ----------------------------------------------------------------------------------------------
# policy and value losses


def clipped_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, eps_low: float, eps_high: float | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate, per token, as a loss (to minimise).

    ratio: (batch, seq). advantages: (batch, seq), (batch, 1) or (batch,) (one value per sequence).
    eps_high defaults to eps_low; eps_high > eps_low is DAPO's "clip-higher".

        l_t = -min(r_t * A_t, clip(r_t, 1 - eps_low, 1 + eps_high) * A_t)

    Returns (per_token_loss, is_low_clipped, is_high_clipped), all (batch, seq); the indicators
    (bool) mark tokens where the clip is active and kills the gradient, as TRL logs them:
    low = r < 1 - eps_low and A < 0; high = r > 1 + eps_high and A > 0.
    """
    eps_high = eps_low if eps_high is None else eps_high
    ratio = ratio.float()
    advantages = advantages.float()
    if advantages.dim() == ratio.dim() - 1:
        advantages = advantages.unsqueeze(-1)  # (batch,) -> (batch, 1), broadcast over tokens
    clipped_ratio = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)  # clip(r, 1-eps_low, 1+eps_high)
    per_token_loss = -torch.min(ratio * advantages, clipped_ratio * advantages)  # -min(rA, clip(r)A)
    is_low_clipped = (ratio < 1.0 - eps_low) & (advantages < 0)
    is_high_clipped = (ratio > 1.0 + eps_high) & (advantages > 0)
    return per_token_loss, is_low_clipped, is_high_clipped


def clipped_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip_range_value: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped value loss (OpenAI baselines / lm-human-preferences, TRL's PPOTrainer).

    values, old_values, returns, mask: (batch, seq).

        V_clip = clip(V, V_old - c, V_old + c)
        loss   = 0.5 * masked_mean(max((V - R)^2, (V_clip - R)^2))

    Returns (loss, clip_fraction): the scalar loss and the fraction of real tokens whose clipped
    error was the larger one (so the clip decided the gradient).
    """
    values = values.float()
    old_values = old_values.detach().float()
    returns = returns.detach().float()
    values_clipped = torch.clamp(values, old_values - clip_range_value, old_values + clip_range_value)
    loss_unclipped = (values - returns) ** 2  # (V - R)^2
    loss_clipped = (values_clipped - returns) ** 2  # (V_clip - R)^2
    loss = 0.5 * masked_mean(torch.max(loss_unclipped, loss_clipped), mask)  # 0.5 * mean(max(...))
    clip_fraction = masked_mean((loss_clipped > loss_unclipped).float(), mask)
    return loss, clip_fraction


# ----------------------------------------------------------------------------------------------
# from logits


# Rows per log-softmax call in `selective_log_softmax`: at most this many float32 elements (64 MiB) at once.
LOG_SOFTMAX_CHUNK_ELEMENTS = 2**24


def log_softmax_chunks(logits: torch.Tensor):
    """Yield (rows, float32 log_softmax of those rows) over the batch dim, at most
    LOG_SOFTMAX_CHUNK_ELEMENTS values at once: the full (batch, seq, vocab) float32 log-softmax of a
    large vocabulary is never held in memory (TRL's `selective_log_softmax` goes one row at a time for
    the same reason); a small batch is one chunk, one call, no Python loop per row. Each value is the
    same either way: the softmax reduces over the vocabulary only."""
    batch, seq, vocab = logits.shape
    rows = max(1, LOG_SOFTMAX_CHUNK_ELEMENTS // max(seq * vocab, 1))
    for start in range(0, batch, rows):
        chunk = slice(start, start + rows)
        yield chunk, F.log_softmax(logits[chunk].float(), dim=-1)  # log p = z - logsumexp(z)


def selective_log_softmax(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[token_id] in float32. (batch, seq, vocab), (batch, seq) -> (batch, seq).

    logits must already be divided by the sampling temperature. Computed in row chunks
    (`log_softmax_chunks`).
    """
    return selective_log_softmax_and_entropy(logits, token_ids, with_entropy=False)[0]


def selective_log_softmax_and_entropy(logits: torch.Tensor, token_ids: torch.Tensor, with_entropy: bool = True
                                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(selective_log_softmax(logits, token_ids), entropy_from_logits(logits.detach()) or None), the same
    values from one log-softmax: the entropy -sum p log p reads the log-probs the selection used (detached:
    a metric, no gradient)."""
    logprobs, entropies = [], []
    for rows, log_p in log_softmax_chunks(logits):
        logprobs.append(log_p.gather(-1, token_ids[rows].unsqueeze(-1)).squeeze(-1))
        if with_entropy:
            entropies.append(entropy_from_logprobs(log_p.detach()))
    join = lambda parts: parts[0] if len(parts) == 1 else torch.cat(parts)  # noqa: E731
    return join(logprobs), join(entropies) if with_entropy else None


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the next-token distribution in float32 nats. (batch, seq, vocab) -> (batch, seq).

    H = -sum_v p_v log p_v
    """
    return entropy_from_logprobs(F.log_softmax(logits.float(), dim=-1))


def entropy_from_logprobs(logprobs: torch.Tensor) -> torch.Tensor:
    """-sum_v p_v log p_v from log p (..., vocab) -> (...)."""
    return -(logprobs.exp() * logprobs).sum(dim=-1)  # -sum p log p


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """How much of the returns' variance the value head explains, over real tokens (scalar).

        EV = 1 - Var[R - V] / Var[R]

    1 = perfect, 0 = no better than predicting the mean, < 0 = worse. nan when Var[R] = 0.
    The biased/unbiased choice cancels in the ratio; we use the biased one.
    """
    var_returns = masked_var(returns, mask, unbiased=False)
    var_residual = masked_var(returns.float() - values.float(), mask, unbiased=False)
    if var_returns == 0:
        return torch.tensor(float("nan"), device=returns.device)
    return 1.0 - var_residual / var_returns  # 1 - Var[R - V] / Var[R]
