"""The rollout/trainer mismatch: the same weights, another precision or another KV cache, other
probabilities. Even at staleness 0, the rollout engine's mu differs from the learner's pi.

    copy = rollout_copy(trainer.policy, "bfloat16")
    engine = decode_logprobs(copy, rollout, cache="int8")          (N, T, V) what the engine computed
    learner = next_token_logprobs(trainer.policy, rollout)         (N, T, V) the fp32 learner
    mismatch_metrics(engine, learner, rollout)

Per sampled token a, with d = log pi_train(a) - log mu(a):

    abs_logp_diff     mean and max of |d|
    ratio_over_2      the fraction of tokens with |d| > log 2 (a probability off by more than 2x)
    kl_rollout_train  KL(mu || pi_train) = sum_v mu_v (log mu_v - log pi_v), averaged over tokens

Rounding explains the size: bf16 keeps 7 stored mantissa bits (relative error ~2^-8), fp16 keeps 10
(~2^-11), so fp16 logits are ~8x closer to fp32 (Qi et al., arXiv 2510.26788, argue for fp16 rollouts
on that ground). The int8 cache quantizes keys and values to 255 levels per group (KIVI's scheme).
"""

from __future__ import annotations

import copy
import math

import torch

from ..rl.losses import masked_mean
from ..rl.rollout import Rollout, at_temperature
from ..sampling.generate import make_cache
from .worker import INT8_RESIDUAL_LENGTH


def rollout_copy(policy: torch.nn.Module, dtype: str = "float32") -> torch.nn.Module:
    """A frozen copy of `policy` in `dtype` (float32, bfloat16, float16): a rollout engine's weights."""
    return copy.deepcopy(policy).to(getattr(torch, dtype)).eval().requires_grad_(False)


@torch.no_grad()
def decode_logprobs(model, rollout: Rollout, temperature: float = 1.0, cache: str = "static") -> torch.Tensor:
    """(N, T, V) float32 log-probs of each completion position as the sampler computed them: the prompt
    prefilled into a KV cache (`cache`: "static", or "int8" with groups of 8), then the completion fed
    one token at a time (teacher forcing through the decode path, in the model's own precision)."""
    P, T = rollout.prompt_width, rollout.completion_ids.shape[1]
    N = len(rollout)
    options = {"residual_length": INT8_RESIDUAL_LENGTH} if cache == "int8" else {}
    dtype = next(model.parameters()).dtype
    kv = make_cache(cache, model.config, N, P + T, device=rollout.input_ids.device, dtype=dtype, **options)
    mask = rollout.attention_mask.clone()
    mask[:, P:] = 1  # the sampler attends to every generated position (padding after EOS is never read)
    prefill = model(rollout.input_ids[:, :P], attention_mask=mask[:, :P], cache=kv, num_logits_to_keep=1)
    logits = [prefill.logits]
    for t in range(T - 1):
        step = model(rollout.completion_ids[:, t: t + 1], attention_mask=mask[:, : P + t + 1], cache=kv)
        logits.append(step.logits[:, -1:])
    return torch.log_softmax(at_temperature(torch.cat(logits, dim=1), temperature), dim=-1)


def mismatch_metrics(engine_logprobs: torch.Tensor, learner_logprobs: torch.Tensor, rollout: Rollout) -> dict:
    """How far the engine's next-token distributions (N, T, V) are from the learner's (N, T, V) on the
    rollout's sampled tokens and over the whole vocabulary (float32 means over real tokens)."""
    mask = rollout.completion_mask
    tokens = rollout.completion_ids.unsqueeze(-1)
    # d = log pi - log mu of each sampled token
    d = (learner_logprobs.gather(-1, tokens) - engine_logprobs.gather(-1, tokens)).squeeze(-1)
    kl = (engine_logprobs.exp() * (engine_logprobs - learner_logprobs)).sum(-1)  # sum_v mu_v log(mu_v / pi_v)
    return {"abs_logp_diff_mean": masked_mean(d.abs(), mask).item(),
            "abs_logp_diff_max": d.abs()[mask.bool()].max().item() if mask.any() else float("nan"),
            "ratio_over_2": masked_mean((d.abs() > math.log(2)).float(), mask).item(),
            "kl_rollout_train": masked_mean(kl, mask).item()}
