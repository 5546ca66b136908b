"""The decoder's forward in fewer ops: what `LlamaModel.forward` runs unless `reference_paths()` is on.

transformer.py and rope.py hold the plain definitions; this file computes the same function with
fewer ops. `LlamaModel.forward` is the one place that chooses (`rlhf_lab.util.fast_paths`). What
changes against the plain definition, and the test that holds each equal (tests/test_fast_paths.py
unless named):

- RoPE's cos and sin are rows of a table computed once per model (`cos_sin_table`), not recomputed
  from the positions at every forward; row m comes from the very ops `RotaryEmbedding.forward` runs
  for position m (`test_rope_table_rows_equal_the_module_output`, within a few float32 ulps).
- RoPE's tables are made once per forward for every layer (`rope_factors`: [cos | cos], [-sin | sin]),
  and `rotate` finds [b | a] with one `torch.roll`: x * [cos | cos] + [b | a] * [-sin | sin] is
  `apply_rope`'s x * [cos | cos] + rotate_half(x) * [sin | sin] bit for bit ((-b) s = b (-s) in IEEE)
  (`test_rotate_is_apply_rope_bit_for_bit`).
- RMSNorm is torch's one `F.rms_norm` call, the weight inside it: the same products in the same order
  (`test_rms_norm_is_the_plain_rms_norm_bit_for_bit`).
- Grouped-query attention stacks the H / K query heads of a key/value head along the query axis and
  makes one batched matmul per key/value head, without repeating k and v (`grouped_attention`); on the
  CPU a key axis shorter than `SOFTMAX_MIN_KEYS` is padded with -inf keys, whose probability is exactly
  0, because torch's CPU softmax is slow on a short last dimension. The same softmax up to the float32
  order of its sum (`test_grouped_attention_equals_eager_attention`).
- Inside `fused_projections` (all of `generate`), forwards without gradients multiply by one stacked
  q|k|v matrix per attention layer and one gate|up matrix per MLP: each output column is still one row
  of W times x (`test_fused_projections_change_no_logit_and_leave_training_alone`).
- The LM head skips the autocast context when nothing is to be cast (the same `F.linear` on the same
  inputs).

The whole forward, fast against plain, on every feature the model has:
- left padding, position ids, RoPE scalings (dynamic included), Qwen2/Qwen3, SDPA, the value head and
  MoE routing replay (`test_fast_forward_equals_the_plain_forward`);
- every kind of cache (`test_cached_decoding_fast_equals_plain`);
- gradient checkpointing (`test_gradient_checkpointing_gives_the_plain_gradients`);
- bf16 autocast (`test_bf16_autocast_fast_equals_plain`);
- LoRA (`test_lora_wrapped_projections_on_both_paths`);
- whole seeded generations (`test_generate_fast_equals_plain`).
`sampling/compiled.py` compiles this file's decoder layer.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..util.validation import check_number
from . import transformer  # transformer.py imports this module too: its names are read at call time
from .moe import SparseMoeBlock
from .rope import RotaryEmbedding

_F_RMS_NORM = getattr(F, "rms_norm", None)  # torch >= 2.4
SOFTMAX_MIN_KEYS = 16  # grouped_attention pads shorter key axes to this many on the CPU

Stack = tuple[torch.Tensor, torch.Tensor | None]  # a stacked weight (rows of several projections) and bias
NO_STACKS: tuple[Stack | None, Stack | None] = (None, None)


def forward(model, input_ids, attention_mask=None, position_ids=None, cache=None, num_logits_to_keep=0,
            expert_indices=None):
    """`LlamaModel.forward` (same arguments, same `ModelOutput`) with this file's pieces."""
    B, T = input_ids.shape
    model.check_expert_indices(expert_indices)
    past_len = cache.get_seq_length() if cache is not None else 0
    mask = transformer.build_attention_mask(attention_mask, T, past_len, input_ids.device)
    # RoPE's tables, made once here for every layer's q and k (rope_factors: [cos | cos] and [-sin | sin],
    # width D' = D; interleaved pairs: cos and sin, D' = D/2)
    rope, interleaved = model.rotary_emb, model.config.rope_interleaved
    if position_ids is not None or rope.rope_type == "dynamic":  # positions chosen by the caller
        if position_ids is None:
            position_ids = model.default_position_ids(attention_mask, B, T, past_len, input_ids.device)
        cos, sin = rope_factors(*rope(position_ids), interleaved)  # float32 (B, T, D')
    else:  # positions < past_len + T: rows of the table
        cos, sin = rope_factors(*cos_sin_table(rope, past_len + T), interleaved)  # (past_len + T, D')
        if attention_mask is None:  # every row at positions past_len .. past_len + T - 1
            cos, sin = cos[past_len:], sin[past_len:]  # (T, D'), broadcast over the batch
        else:
            position_ids = model.default_position_ids(attention_mask, B, T, past_len, input_ids.device)
            cos, sin = F.embedding(position_ids, cos), F.embedding(position_ids, sin)  # (B, T, D')
    if cos.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, D'): the same angle for every head
    x = model.model.embed_tokens(input_ids)
    recompute = model.gradient_checkpointing and model.training and torch.is_grad_enabled() and cache is None
    routing = []  # MoE: (router_logits, expert_indices) per layer
    for i, layer in enumerate(model.model.layers):
        replay = expert_indices[i] if expert_indices is not None else None
        if recompute:
            x, layer_routing = checkpoint(decoder_layer, layer, x, cos, sin, mask, None, replay,
                                          use_reentrant=False)
        else:
            stacks = _STACKS.get(layer, NO_STACKS)
            x, layer_routing = decoder_layer(layer, x, cos, sin, mask, cache, replay, stacks)
        if layer_routing is not None:
            routing.append(layer_routing)
    h = rms_norm(model.model.norm, x)
    logits = lm_logits(model, h[:, -num_logits_to_keep:] if num_logits_to_keep else h)
    return model.make_output(h, logits, routing, attention_mask, cache)


def decoder_layer(layer, x, cos, sin, mask, cache, expert_indices=None, stacks=NO_STACKS):
    """`DecoderLayer.forward` with cos and sin from `rope_factors` (see `attention`) and the layer's
    (q|k|v, gate|up) stacks (see `fused_projections`): -> (x, routing)."""
    qkv, gate_up = stacks
    x = x + attention(layer.self_attn, rms_norm(layer.input_layernorm, x), cos, sin, mask, cache, qkv)
    if isinstance(layer.mlp, SparseMoeBlock):
        h = rms_norm(layer.post_attention_layernorm, x)
        y, router_logits, expert_indices = layer.mlp(h, expert_indices)
        return x + y, (router_logits, expert_indices)
    return x + mlp(layer.mlp, rms_norm(layer.post_attention_layernorm, x), gate_up), None


def rms_norm(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """`RMSNorm.forward` as torch's one `F.rms_norm` call: x (..., C) -> (..., C)."""
    if _F_RMS_NORM is None:  # an older torch: the formula
        return norm(x)
    if x.dtype == norm.weight.dtype == torch.float32:  # nothing to cast (the common case)
        # the weight inside the call: one op, forward and backward, and the same bits as
        # weight * rms_norm(x) (the product (x * rstd) * weight either way)
        return _F_RMS_NORM(x, (x.shape[-1],), weight=norm.weight, eps=norm.eps)
    return norm.weight * _F_RMS_NORM(x.float(), (x.shape[-1],), eps=norm.eps).to(x.dtype)


def attention(attn, x, cos, sin, mask, cache, qkv: Stack | None = None):
    """`Attention.forward` with RoPE's tables from `rope_factors`, `grouped_attention`, and, without
    gradients, one matmul by the stacked [W_q | W_k | W_v] (`qkv`, see `fused_projections`).

    x (B, T, C); cos, sin (B, 1, T, D') or (T, D') float32 (D' = D, or D/2 for interleaved pairs);
    mask (B, 1, T, S) bool or None -> (B, T, C).
    """
    B, T, _ = x.shape
    H, K, D = attn.num_heads, attn.num_kv_heads, attn.head_dim
    if qkv is None or torch.is_grad_enabled() or attn.q_norm is not None:
        q = attn.q_proj(x).view(B, T, H, D)  # (B, T, H, D)
        k = attn.k_proj(x).view(B, T, K, D)  # (B, T, K, D)
        if attn.q_norm is not None:  # Qwen3: normalise each head before RoPE rotates it
            q, k = rms_norm(attn.q_norm, q), rms_norm(attn.k_norm, k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # (B, H, T, D), (B, K, T, D)
        v = attn.v_proj(x).view(B, T, K, D).transpose(1, 2)  # (B, K, T, D)
        q = rotate(q, cos, sin, interleaved=attn.interleaved)
        k = rotate(k, cos, sin, interleaved=attn.interleaved)
    else:
        # [q | k | v] = x [W_q | W_k | W_v]^T: one matmul, heads side by side (B, H + 2K, T, D), and one
        # RoPE call rotates the H query and K key heads together
        qkv_heads = F.linear(x, *qkv).view(B, T, H + 2 * K, D).transpose(1, 2)
        qk = rotate(qkv_heads[:, : H + K], cos, sin, interleaved=attn.interleaved)
        # k gets its own buffer as in the unfused branch: the attention matmul's rounding follows k's layout
        q, k, v = qk[:, :H], qk[:, H:].contiguous(), qkv_heads[:, H + K :]  # (B, H|K|K, T, D)
    if cache is not None:
        k, v = cache.update(attn.layer_idx, k, v)  # (B, K, S, D)
    if attn.implementation == "sdpa":
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)  # (B, H, T, D)
    else:
        out = grouped_attention(q, k, v, mask)  # (B, H, T, D)
    return attn.o_proj(out.transpose(1, 2).reshape(B, T, H * D))


def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      mask: torch.Tensor | None) -> torch.Tensor:
    """`eager_attention` without copying k and v: softmax(q k^T / sqrt(D) + mask) v.

    q (B, H, T, D); k, v (B, K, S, D); mask (B, 1, T, S) bool or None (then T must be 1) -> (B, H, T, D).
    The G = H / K query heads that share kv head j are stacked along the query axis, so one batched
    matmul per kv head serves all of them: (B, K, G*T, D) @ (B, K, D, S), where `repeat_kv` copies k and v
    G times.
    """
    B, H, T, D = q.shape
    K, S = k.shape[1], k.shape[2]
    G = H // K
    # B*K small matmuls in one bmm on (B*K, ., .) reshapes: what `@` does, minus its broadcasting steps
    k_t = k.transpose(-1, -2).reshape(B * K, D, S)
    scores = torch.bmm(q.reshape(B * K, G * T, D), k_t).view(B, K, G * T, S) * D**-0.5  # q k^T / sqrt(D)
    if mask is not None:
        # where(mask, scores, -inf): the masked_fill(~mask, -inf) of the formula without building ~mask
        scores = torch.where(mask[:, None], scores.view(B, K, G, T, S), float("-inf")).view(B, K, G * T, S)
    if S < SOFTMAX_MIN_KEYS and scores.device.type == "cpu":
        # torch's CPU softmax over a last dimension under 16 is much slower than over 16: pad with -inf
        # keys, whose probability is exactly 0, and drop them after
        scores = F.pad(scores, (0, SOFTMAX_MIN_KEYS - S), value=float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32)[..., :S]
        probs = probs.to(v.dtype).reshape(B * K, G * T, S)
    else:
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype).view(B * K, G * T, S)
    return torch.bmm(probs, v.reshape(B * K, S, D)).view(B, H, T, D)


def mlp(module, x: torch.Tensor, gate_up: Stack | None = None) -> torch.Tensor:
    """`MLP.forward`; without gradients and with the stacked [W_gate | W_up] (`gate_up`), one matmul
    for both projections. x (..., C) -> (..., C)."""
    if gate_up is None or torch.is_grad_enabled():
        gate, up = module.gate_proj(x), module.up_proj(x)
    else:
        gate, up = F.linear(x, *gate_up).chunk(2, dim=-1)
        # silu's kernel for a strided view rounds differently from its contiguous one: copy, to get
        # the very numbers of the unfused branch
        gate = gate.contiguous()
    return module.down_proj(F.silu(gate) * up)


def lm_logits(model, h: torch.Tensor) -> torch.Tensor:
    """`LlamaModel.lm_logits`: (..., C) -> (..., V) float32, without the autocast context when h and
    the head are float32 and autocast is off (then there is nothing to cast)."""
    weight = model.lm_head.weight
    if h.dtype == weight.dtype == torch.float32 and not torch.is_autocast_enabled(h.device.type):
        return F.linear(h, weight)
    return model.lm_logits(h)


# ---------------------------------------------------------------------------------------------
# RoPE: a table of cos and sin, and the rotation in whole rows
# ---------------------------------------------------------------------------------------------

_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # RotaryEmbedding -> (inv_freq, cos, sin)


def cos_sin_table(rope: RotaryEmbedding, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of positions 0 .. length - 1, each float32 (length, head_dim // 2).

    Row m is what `rope(position_ids)` gives for position m (the same ops compute it), but the table is
    computed once per module and kept (regrown when a longer length is asked for, rebuilt when the
    frequencies move to another device), so a decoding step reads one row instead of recomputing
    m * theta_i, its cos and its sin. Not for "dynamic" scaling, whose frequencies depend on the length.
    """
    if rope.rope_type == "dynamic":
        raise ValueError("cos_sin_table: rope_type 'dynamic' changes its frequencies with the length; "
                         "call the module on position_ids instead")
    check_number("length", length, low=1, integer=True)
    table = _TABLES.get(rope)
    if table is None or table[0] is not rope.inv_freq or table[1].shape[0] < length:
        size = max(length, rope.max_position_embeddings)
        with torch.inference_mode(False):  # made inside inference_mode, it could not serve a training step
            cos, sin = rope(torch.arange(size, device=rope.inv_freq.device)[None])  # (1, size, d/2) each
        table = _TABLES[rope] = (rope.inv_freq, cos[0], sin[0])
    return table[1][:length], table[2][:length]


def rope_factors(cos: torch.Tensor, sin: torch.Tensor,
                 interleaved: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The two tables `rotate` multiplies by, from `RotaryEmbedding`'s cos and sin (..., head_dim // 2).

    Half-split pairs (i, i + d/2): [cos | cos] and [-sin | sin], (..., head_dim), so that the rotation is
    x * [cos | cos] + [b | a] * [-sin | sin] on whole rows (a, b the two halves of x).
    Interleaved pairs (2i, 2i + 1): cos and sin as they are.
    The tables depend on the positions only, so a forward builds them once for every layer's q and k.
    """
    if interleaved:
        return cos, sin
    return torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    """`apply_rope` with tables already made by `rope_factors` (same shape rules, same result, bit for bit).

    Half-split: x * [cos | cos] + [b | a] * [-sin | sin], with [b | a] = x rolled by d/2 along the last dim:
    2 full-width multiplies, where the pairwise a cos - b sin, b cos + a sin makes 4 half-width ones.
    """
    low_precision = x.dtype not in (torch.float32, torch.float64)
    x_c = x.float() if low_precision else x  # fp16/bf16 -> fp32; fp32 and fp64 stay as they are
    if cos.dim() == 3:
        cos, sin = cos.unsqueeze(-3), sin.unsqueeze(-3)  # (batch, 1, seq, .), shared by all heads
    if cos.dtype != x_c.dtype:
        cos, sin = cos.to(x_c.dtype), sin.to(x_c.dtype)
    if not interleaved:
        # roll: one op for [b | a] (chunk + cat is three), the same values
        out = x_c * cos + torch.roll(x_c, x_c.shape[-1] // 2, dims=-1) * sin
        return out.to(x.dtype) if low_precision else out
    first, second = x_c[..., 0::2], x_c[..., 1::2]
    rotated_first = first * cos - second * sin  # a' = a cos - b sin
    rotated_second = second * cos + first * sin  # b' = b cos + a sin
    out = torch.stack((rotated_first, rotated_second), dim=-1).flatten(-2)  # (..., d/2, 2) -> (..., d)
    return out.to(x.dtype) if low_precision else out


# ---------------------------------------------------------------------------------------------
# Stacked projections for generation
# ---------------------------------------------------------------------------------------------

_STACKS: dict = {}  # DecoderLayer -> (q|k|v stack, gate|up stack), inside `fused_projections` only


@contextlib.contextmanager
def fused_projections(model: nn.Module) -> Iterator[nn.Module]:
    """Within this block, the fast forward's passes without gradients multiply by one stacked q|k|v
    matrix per attention layer and one gate|up matrix per MLP: 2 matmuls instead of 5 per layer, same
    weights, same products (each output column is still one row of W times x).

    The stacks are copies made on entry and dropped on exit, so the weights must not change inside the
    block: `generate` uses it, under no_grad. Forwards with gradients ignore the stacks, and so does the
    plain forward (`reference_paths()`). A projection that is not a bare `nn.Linear` (a LoRA adapter
    computes more than x W^T + b) is never stacked. `model` may be a peft model around the lab's.
    """
    layers = [m for m in model.modules() if isinstance(m, transformer.DecoderLayer)]
    if any(layer in _STACKS for layer in layers):
        yield model  # already inside such a block: the outer one owns the stacks
        return
    with torch.no_grad():
        for layer in layers:
            _STACKS[layer] = (_stack(layer.self_attn, ("q_proj", "k_proj", "v_proj")),
                              _stack(layer.mlp, ("gate_proj", "up_proj")))
    try:
        yield model
    finally:
        for layer in layers:
            _STACKS.pop(layer, None)


def layer_stacks(model: nn.Module) -> tuple[tuple[Stack | None, Stack | None], ...]:
    """Each decoder layer's (q|k|v, gate|up) stacks, for a caller that passes them to `decoder_layer`
    itself (the compiled decode step); (None, None) for a layer outside `fused_projections`."""
    return tuple(_STACKS.get(layer, NO_STACKS) for layer in model.model.layers)


def _stack(module: nn.Module, names: tuple[str, ...]) -> Stack | None:
    """The weights (and biases) of `module`'s projections `names` stacked row-wise, or None when one of
    them is missing or wrapped, or when the module normalises q and k (Qwen3: the stack is not used)."""
    projections = [getattr(module, name, None) for name in names]
    if not all(type(p) is nn.Linear for p in projections) or getattr(module, "q_norm", None) is not None:
        return None
    bias = torch.cat([p.bias for p in projections]) if projections[0].bias is not None else None
    return torch.cat([p.weight for p in projections]), bias
