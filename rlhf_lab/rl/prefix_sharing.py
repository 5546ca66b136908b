"""Prefix sharing: the G completions of a prompt share one forward of that prompt.

The plain teacher-forced forward (rollout.py, `rollout_forward`) runs every row's whole sequence,
prompt included, so a group's prompt goes through the model G times. Causal attention means a
prompt position never sees the completion, so the prompt's keys and values are the same in every
row of its group: compute them once per distinct prompt, copy them to the group's rows, and run
only the completions. Tokens: U*P + N*(T-1) instead of N*(P+T-1). The same function of the weights,
so the same log-probs and gradients up to float32 rounding (the attention sums are split
differently); tests/test_fast_step.py holds it to the plain forward. The same idea as Prefix Grouper
(arXiv 2506.05433) for GRPO's shared prompts.

`rollout.completion_logits` takes this path when the fast paths are on (rlhf_lab.util.fast_paths)
and the caller allows it (`share_prompts=True`: the RL trainer's forwards).
"""

from __future__ import annotations

import torch

from ..model.kv_cache import DynamicCache


def shared_prompt_logits(model, rollout):
    """(logits (N, T, V), values (N, T) or None) at the completion positions with each distinct prompt
    computed once, or None when no prompt repeats or the model recomputes its layers in backward
    (gradient checkpointing recomputes without a cache)."""
    if getattr(model, "gradient_checkpointing", False) and torch.is_grad_enabled():
        return None
    P = rollout.prompt_width
    prompts = torch.cat([rollout.input_ids[:, :P], rollout.attention_mask[:, :P]], dim=1)  # (N, 2P)
    unique, row_prompt = distinct_rows(prompts)  # (U, 2P), (N,)
    if len(unique) == len(rollout):
        return None
    return shared_prompt_forward(model, rollout, unique[:, :P], unique[:, P:], row_prompt)


def distinct_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(distinct (U, W), inverse (N,)) of an integer matrix's rows: distinct[inverse] == rows, as
    torch.unique(rows, dim=0, return_inverse=True) gives, up to the order of the distinct rows, without
    its CPU kernel's row-by-row comparisons.

    Each row is summarised by one integer key, sum_j rows[:, j] * w_j with fixed odd weights, the keys
    made unique in one call, and the result checked exactly (distinct[inverse] == rows); should two
    different rows ever share a key, the check fails and torch.unique's row comparison answers."""
    n, width = rows.shape
    # Knuth's multiplier
    weights = (torch.arange(1, width + 1, device=rows.device) * 2654435761) % (1 << 31) | 1
    keys, inverse = torch.unique((rows.long() * weights).sum(1), return_inverse=True)  # (U,), (N,)
    # each key's first row stands for it
    first = torch.full((len(keys),), n, device=rows.device).scatter_reduce_(
        0, inverse, torch.arange(n, device=rows.device), "amin")
    distinct = rows[first]
    if torch.equal(distinct[inverse], rows):
        return distinct, inverse
    return torch.unique(rows, dim=0, return_inverse=True)


def shared_prompt_forward(model, rollout, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                          row_prompt: torch.Tensor):
    """Teacher-forced logits (N, T, V) and values (N, T) or None, each prompt computed once.

    prompt_ids, prompt_mask: (U, P) the distinct (left-padded) prompts; row_prompt: (N,) which of them
    row n continues. 1. the U prompts through the model, keys/values kept in a cache (with their
    gradient); its last position gives the logit of completion token 0. 2. the cache's rows indexed by
    row_prompt (autograd sums the gradient of the rows that share a prompt), then the N completions'
    first T-1 tokens attend to it: the logits of tokens 1 .. T-1.
    """
    T = rollout.completion_ids.shape[1]
    prefix = DynamicCache()
    head = model(prompt_ids, attention_mask=prompt_mask, cache=prefix, num_logits_to_keep=1)
    logits = RowsOf.apply(head.logits, row_prompt)  # (N, 1, V): predicts completion token 0
    values = RowsOf.apply(head.values, row_prompt)[:, -1:] if head.values is not None else None
    if T > 1:
        rows = DynamicCache()
        rows.keys = [RowsOf.apply(k, row_prompt) for k in prefix.keys]  # (N, K, P, D) per layer
        rows.values = [RowsOf.apply(v, row_prompt) for v in prefix.values]
        tail = model(rollout.completion_ids[:, : T - 1], attention_mask=rollout.attention_mask[:, :-1],
                     cache=rows)
        logits = torch.cat([logits, tail.logits], dim=1)  # (N, T, V)
        if values is not None:
            values = torch.cat([values, tail.values], dim=1)
    return logits, values


class RowsOf(torch.autograd.Function):
    """RowsOf.apply(x, index) = x.index_select(0, index): row n of the result is row index[n] of x (a
    prompt's keys copied to each of its completions). Its backward adds each row's gradient into its
    source row with index_add (faster on the CPU than indexing's accumulating index_put), after making
    the gradient contiguous, because index_add from a strided slice takes a slower path; the same sums
    in the same order, so the same bits."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(index)
        ctx.rows = x.shape[0]
        return x.index_select(0, index)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (index,) = ctx.saved_tensors
        grad = grad.contiguous()
        return grad.new_zeros((ctx.rows, *grad.shape[1:])).index_add_(0, index, grad), None
