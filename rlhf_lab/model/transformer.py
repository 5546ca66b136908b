"""A Llama-style decoder, written to be read top to bottom.

    tokens -> embed -> [ RMSNorm -> attention (RoPE, GQA) -> +residual
                         RMSNorm -> SwiGLU MLP            -> +residual ] x L -> RMSNorm -> lm_head

Parameter names are Hugging Face's (`model.layers.0.self_attn.q_proj.weight`, ...), so a state
dict moves between this model and `transformers.LlamaForCausalLM` unchanged (see `hf.py`), and
the parity tests can demand equal logits to 1e-5. The Qwen2 / Qwen3 families are the same decoder
with a few switches (biases, Qwen3's per-head q/k norm; see config.py), so they load too. The MoE
families (Mixtral, Qwen3-MoE) swap each layer's MLP for a router and experts (`moe.SparseMoeBlock`).

Shapes: B batch, T new tokens in this call, S = past + T keys, H query heads, K key/value heads,
D head_dim, C hidden size, V vocabulary.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..util.validation import check_choice
from .config import ModelConfig
from .kv_cache import KVCache
from .moe import SparseMoeBlock, moe_aux_loss
from .rope import RotaryEmbedding, rope_factors, rotate

_fused_rms_norm = getattr(F, "rms_norm", None)


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight, computed in float32 whatever the input dtype."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _fused_rms_norm is not None:  # one call, same formula (torch >= 2.4)
            if x.dtype == self.weight.dtype == torch.float32:  # nothing to cast (the common case)
                # the weight inside the call: one op, forward and backward, and the same bits as
                # weight * rms_norm(x) (the product (x * rstd) * weight either way)
                return _fused_rms_norm(x, (x.shape[-1],), weight=self.weight, eps=self.eps)
            return self.weight * _fused_rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class Attention(nn.Module):
    """Multi-head attention with grouped-query heads: query head h reads key/value head h // (H / K)."""

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.interleaved = config.rope_interleaved
        self.implementation = config.attn_implementation
        C, H, K, D = config.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim
        self.q_proj = nn.Linear(C, H * D, bias=config.qkv_bias)
        self.k_proj = nn.Linear(C, K * D, bias=config.qkv_bias)
        self.v_proj = nn.Linear(C, K * D, bias=config.qkv_bias)
        self.o_proj = nn.Linear(H * D, C, bias=config.o_proj_bias)
        # Qwen3: RMSNorm over each head's D dims of q and k. It bounds the scale of q.k, which keeps
        # attention logits from growing without bound in training (Qwen3 report, arXiv 2505.09388).
        self.q_norm = RMSNorm(D, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(D, config.rms_norm_eps) if config.qk_norm else None
        self.qkv_fused: tuple[torch.Tensor, torch.Tensor | None] | None = None  # see fuse_projections

    def fuse_projections(self, enabled: bool = True) -> None:
        """Stack W_q, W_k, W_v (and their biases) into one ((H + 2K) D, C) matrix, so that a forward
        without gradients makes one matmul instead of three; `enabled=False` drops the stack.

        The stack is a copy: it is right only while the weights do not change, so `LlamaModel.
        fused_projections` makes it for the length of a `generate` call. Forwards with gradients
        always use the three modules (the stack would not pass gradients back to them).
        """
        projections = (self.q_proj, self.k_proj, self.v_proj)
        if not enabled or not all(type(p) is nn.Linear for p in projections):
            # A wrapped projection (a LoRA adapter, say) computes more than x W^T + b: keep calling it.
            self.qkv_fused = None
            return
        bias = torch.cat([p.bias for p in projections]) if self.q_proj.bias is not None else None
        self.qkv_fused = (torch.cat([p.weight for p in projections]), bias)

    def forward(
        self,
        x: torch.Tensor,  # (B, T, C)
        cos: torch.Tensor,  # (B, 1, T, D') or (T, D') float32: `rope_factors`' tables (D' = D, or D/2 interleaved)
        sin: torch.Tensor,  # same shape as cos
        mask: torch.Tensor | None,  # (B, 1, T, S) bool, True = may attend; None = attend to all (T = 1)
        cache: KVCache | None,
    ) -> torch.Tensor:
        B, T, _ = x.shape
        H, K, D = self.num_heads, self.num_kv_heads, self.head_dim
        if self.qkv_fused is None or torch.is_grad_enabled() or self.q_norm is not None:
            q = self.q_proj(x).view(B, T, H, D)  # (B, T, H, D)
            k = self.k_proj(x).view(B, T, K, D)  # (B, T, K, D)
            if self.q_norm is not None:  # Qwen3: normalise each head before RoPE rotates it
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = q.transpose(1, 2), k.transpose(1, 2)  # (B, H, T, D), (B, K, T, D)
            v = self.v_proj(x).view(B, T, K, D).transpose(1, 2)  # (B, K, T, D)
            q = rotate(q, cos, sin, interleaved=self.interleaved)
            k = rotate(k, cos, sin, interleaved=self.interleaved)
        else:  # generation (see fuse_projections): the same numbers with fewer ops
            # [q | k | v] = x [W_q | W_k | W_v]^T: one matmul, heads side by side (B, H + 2K, T, D), and one
            # RoPE call rotates the H query and K key heads together
            qkv = F.linear(x, *self.qkv_fused).view(B, T, H + 2 * K, D).transpose(1, 2)
            qk = rotate(qkv[:, : H + K], cos, sin, interleaved=self.interleaved)
            # k gets its own buffer as in the unfused path: the attention matmul's rounding follows k's layout
            q, k, v = qk[:, :H], qk[:, H:].contiguous(), qkv[:, H + K :]  # (B, H|K|K, T, D)
        if cache is not None:
            # The cache stores keys AFTER RoPE and BEFORE the GQA repeat, as transformers does.
            k, v = cache.update(self.layer_idx, k, v)  # (B, K, S, D)
        if self.implementation == "sdpa":
            # The same softmax(q k^T / sqrt(D) + mask) v in one fused kernel (flash / memory-efficient on a
            # GPU: the (T, S) score matrix is never stored). Boolean mask: True = may attend.
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)  # (B, H, T, D)
        else:
            out = grouped_attention(q, k, v, mask)  # (B, H, T, D)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, self.num_heads * self.head_dim))


SOFTMAX_MIN_KEYS = 16  # grouped_attention pads shorter key axes to this many on the CPU


def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """softmax(q k^T / sqrt(D) + mask) v with grouped-query heads, without copying k and v.

    q (B, H, T, D); k, v (B, K, S, D); mask (B, 1, T, S) bool or None (then T must be 1).
    The G = H / K query heads that share kv head j are stacked along the query axis, so one batched
    matmul per kv head serves all of them: (B, K, G*T, D) @ (B, K, D, S). Transformers instead
    repeats k and v G times (`repeat_kv`); the result is the same, the copy is not needed.
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
        # torch's CPU softmax over a last dimension under 16 is ~8x slower than over 16 (bench/RESULTS.md,
        # "Profile of the default GRPO step"): pad with -inf keys, whose probability is exactly 0, and drop
        # them after. The same probabilities up to the order of the float32 sum.
        scores = F.pad(scores, (0, SOFTMAX_MIN_KEYS - S), value=float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32)[..., :S].to(v.dtype).reshape(B * K, G * T, S)
    else:
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype).view(B * K, G * T, S)  # float32
    return torch.bmm(probs, v.reshape(B * K, S, D)).view(B, H, T, D)


class MLP(nn.Module):
    """SwiGLU: down( silu(gate(x)) * up(x) )."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        bias = config.mlp_bias
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=bias)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=bias)
        self.gate_up_fused: tuple[torch.Tensor, torch.Tensor | None] | None = None

    def fuse_projections(self, enabled: bool = True) -> None:
        """Stack W_gate and W_up into one (2I, C) matrix for forwards without gradients (see Attention's)."""
        if not enabled or not (type(self.gate_proj) is type(self.up_proj) is nn.Linear):  # as in Attention's
            self.gate_up_fused = None
            return
        bias = torch.cat([self.gate_proj.bias, self.up_proj.bias]) if self.gate_proj.bias is not None else None
        self.gate_up_fused = (torch.cat([self.gate_proj.weight, self.up_proj.weight]), bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_fused is None or torch.is_grad_enabled():
            gate, up = self.gate_proj(x), self.up_proj(x)
        else:  # generation: [gate | up] = x [W_g | W_u]^T in one matmul (see fuse_projections)
            gate, up = F.linear(x, *self.gate_up_fused).chunk(2, dim=-1)
            # silu's kernel for a strided view rounds differently from its contiguous one: copy, to get
            # the very numbers of the unfused path
            gate = gate.contiguous()
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = SparseMoeBlock(config) if config.is_moe else MLP(config)

    def forward(self, x, cos, sin, mask, cache, expert_indices=None):
        """-> (x, routing): routing is (router_logits, expert_indices) for an MoE layer, None for a dense one."""
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache)
        if isinstance(self.mlp, SparseMoeBlock):
            y, router_logits, expert_indices = self.mlp(self.post_attention_layernorm(x), expert_indices)
            return x + y, (router_logits, expert_indices)
        return x + self.mlp(self.post_attention_layernorm(x)), None


class Backbone(nn.Module):
    """Embedding + decoder layers + final norm (HF's `LlamaModel`, kept under the name `model`)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


@dataclass
class ModelOutput:
    logits: torch.Tensor  # (B, T', V) float32; T' = T, or num_logits_to_keep
    cache: KVCache | None = None
    values: torch.Tensor | None = None  # (B, T) float32 when the model has a value head
    hidden_states: torch.Tensor | None = None  # (B, T, C) final-norm output
    # MoE models only (None for a dense one): one entry per layer.
    router_logits: tuple[torch.Tensor, ...] | None = None  # (B, T, E) float32 each
    expert_indices: tuple[torch.Tensor, ...] | None = None  # (B, T, k) long each: the experts each token used
    aux_loss: torch.Tensor | None = None  # scalar: router_aux_loss_coef * L_aux + router_z_loss_coef * L_z


def build_attention_mask(
    attention_mask: torch.Tensor | None, num_new: int, past_len: int, device: torch.device
) -> torch.Tensor | None:
    """Boolean mask (B, 1, T, S), True where query t may attend key s.

    Key s is visible to new token t when it is not in the future (s <= past_len + t) and is not
    padding (attention_mask[:, s] == 1). A padding query (left padding) would see no key at all and
    its softmax would be 0/0, so every query may always see itself; its output is never used.
    Returns None when one new token may see every key (decoding without padding). An all-ones
    attention_mask is not looked for (that would read it back to the host at every call): pass None.
    """
    if attention_mask is None and num_new == 1:
        return None
    total = past_len + num_new
    if attention_mask is not None and attention_mask.shape[-1] != total:
        raise ValueError(f"attention_mask covers {attention_mask.shape[-1]} positions but past + new = {total}")
    if num_new == 1:  # one new token (a decoding step): every key is in its past, only padding is hidden
        allowed = attention_mask != 0  # (B, S), a new tensor
        allowed[:, -1] = True  # the query itself
        return allowed[:, None, None, :]  # (B, 1, 1, S)
    key_pos = torch.arange(total, device=device)
    query_pos = torch.arange(past_len, total, device=device)
    allowed = key_pos[None, :] <= query_pos[:, None]  # (T, S) causal
    if attention_mask is not None:
        allowed = allowed[None] & attention_mask[:, None, :].bool()  # (B, T, S)
        allowed = allowed | (key_pos[None, None, :] == query_pos[None, :, None])
    else:
        allowed = allowed[None]
    return allowed[:, None]  # (B, 1, T, S)


class LlamaModel(nn.Module):
    """The lab's causal language model (optionally with a scalar value head for PPO).

    forward(input_ids (B, T), attention_mask (B, S) | None, position_ids (B, T) | None, cache,
            num_logits_to_keep, expert_indices (one (B, T, k) long tensor per layer) | None)
        -> ModelOutput(logits (B, T, V) float32, cache, values (B, T) | None,
                       router_logits, expert_indices, aux_loss: MoE only)

    Routing replay (MoE): `expert_indices` from an earlier forward (e.g. pi_old's `ModelOutput.expert_indices`)
    makes every layer use exactly those experts, gated by the current router's probabilities at them
    (GSPO paper §5, arXiv 2507.18071). The aux loss counts the non-padding tokens of this call.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = Backbone(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rotary_emb = RotaryEmbedding(
            config.head_dim, config.rope_theta, config.rope_scaling, config.max_position_embeddings
        )
        self.value_head = nn.Linear(config.hidden_size, 1) if config.value_head else None
        self.gradient_checkpointing = False
        self.reset_parameters()

    def reset_parameters(self) -> None:
        std = self.config.initializer_range
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=std)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)
            elif isinstance(module, SparseMoeBlock):
                module.experts.reset_parameters(std)
        if self.value_head is not None:  # zero-initialised critic, as in OpenAI's lm-human-preferences
            nn.init.zeros_(self.value_head.weight)
            nn.init.zeros_(self.value_head.bias)

    def add_value_head(self) -> None:
        """Attach a fresh zero-initialised value head (PPO's critic shares the policy's trunk)."""
        if self.value_head is None:
            param = next(self.parameters())
            self.value_head = nn.Linear(self.config.hidden_size, 1).to(param.device, param.dtype)
            nn.init.zeros_(self.value_head.weight)
            nn.init.zeros_(self.value_head.bias)
            self.config.value_head = True

    def set_attn_implementation(self, name: str) -> None:
        """Switch every layer to "eager" (the written-out softmax) or "sdpa" (torch's fused kernel)."""
        from .config import ATTN_IMPLEMENTATIONS

        check_choice("attn_implementation", name, ATTN_IMPLEMENTATIONS)
        self.config.attn_implementation = name
        for layer in self.model.layers:
            layer.self_attn.implementation = name

    @contextlib.contextmanager
    def fused_projections(self):
        """Within this block, forwards without gradients multiply by one stacked q|k|v matrix per
        attention layer and one gate|up matrix per MLP: 2 matmuls instead of 5 per layer, same weights,
        same products (each output column is still one row of W times x).

        The stacks are copies made on entry and dropped on exit, so the weights must not change inside
        the block: `generate` uses it, under no_grad. Forwards with gradients ignore the stacks.
        """
        layers = [m for m in self.modules() if hasattr(m, "fuse_projections") and m is not self]
        if any(getattr(m, "qkv_fused", None) is not None or getattr(m, "gate_up_fused", None) is not None
               for m in layers):
            yield self  # already inside such a block: the outer one owns the stacks
            return
        with torch.no_grad():
            for m in layers:
                m.fuse_projections()
        try:
            yield self
        finally:
            for m in layers:
                m.fuse_projections(False)

    def gradient_checkpointing_enable(self, enabled: bool = True) -> None:
        """Recompute each layer's activations in the backward pass instead of storing them: activation
        memory drops from ~L layers' worth to ~1, for about one extra forward of compute."""
        self.gradient_checkpointing = bool(enabled)

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: KVCache | None = None,
        num_logits_to_keep: int = 0,
        expert_indices: tuple[torch.Tensor, ...] | None = None,
    ) -> ModelOutput:
        B, T = input_ids.shape
        layers = self.model.layers
        if expert_indices is not None and (not self.config.is_moe or len(expert_indices) != len(layers)):
            raise ValueError(f"expert_indices must hold one (B, T, k) tensor per MoE layer ({len(layers) if self.config.is_moe else 0} "
                             f"for this model), got {len(expert_indices)}")
        past_len = cache.get_seq_length() if cache is not None else 0
        mask = build_attention_mask(attention_mask, T, past_len, input_ids.device)
        # RoPE's tables, made once here for every layer's q and k (rope_factors: [cos | cos] and [-sin | sin],
        # width D' = D; interleaved pairs: cos and sin, D' = D/2)
        rope, interleaved = self.rotary_emb, self.config.rope_interleaved
        if position_ids is not None or rope.rope_type == "dynamic":  # positions chosen by the caller
            if position_ids is None:
                position_ids = self.default_position_ids(attention_mask, B, T, past_len, input_ids.device)
            cos, sin = rope_factors(*rope(position_ids), interleaved)  # float32 (B, T, D')
        else:  # positions < past_len + T: rows of the precomputed table, no cos/sin to recompute
            cos, sin = rope_factors(*rope.cos_sin_table(past_len + T), interleaved)  # (past_len + T, D')
            if attention_mask is None:  # every row at positions past_len .. past_len + T - 1
                cos, sin = cos[past_len:], sin[past_len:]  # (T, D'), broadcast over the batch
            else:
                position_ids = self.default_position_ids(attention_mask, B, T, past_len, input_ids.device)
                cos, sin = F.embedding(position_ids, cos), F.embedding(position_ids, sin)  # (B, T, D')
        if cos.dim() == 3:
            cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, D'): the same angle for every head
        x = self.model.embed_tokens(input_ids)
        recompute = self.gradient_checkpointing and self.training and torch.is_grad_enabled() and cache is None
        routing = []  # MoE: (router_logits, expert_indices) per layer
        for i, layer in enumerate(layers):
            replay = expert_indices[i] if expert_indices is not None else None
            if recompute:
                x, layer_routing = checkpoint(layer, x, cos, sin, mask, None, replay, use_reentrant=False)
            else:
                x, layer_routing = layer(x, cos, sin, mask, cache, replay)
            if layer_routing is not None:
                routing.append(layer_routing)
        h = self.model.norm(x)
        logits = self.lm_logits(h[:, -num_logits_to_keep:] if num_logits_to_keep else h)
        values = self.value_head(h).squeeze(-1).float() if self.value_head is not None else None
        if routing:  # MoE: the router outputs and the auxiliary loss over this call's non-padding tokens
            router_logits = tuple(r for r, _ in routing)
            real = attention_mask[:, -T:] if attention_mask is not None else None
            return ModelOutput(logits=logits, cache=cache, values=values, hidden_states=h, router_logits=router_logits,
                               expert_indices=tuple(e for _, e in routing),
                               aux_loss=moe_aux_loss(self.config, router_logits, real))
        return ModelOutput(logits=logits, cache=cache, values=values, hidden_states=h)

    def lm_logits(self, h: torch.Tensor) -> torch.Tensor:
        """The LM head on final (normed) hidden states (..., C) -> logits (..., V), always float32.

        Float32 even under bf16 autocast or with bf16 weights: log-probs and the PPO/GRPO ratio
        exp(log pi - log pi_old) are differences of nearly equal numbers, and bf16 keeps 8 bits.
        """
        if h.dtype == self.lm_head.weight.dtype == torch.float32 and not torch.is_autocast_enabled(h.device.type):
            return F.linear(h, self.lm_head.weight)  # already float32, and no autocast to turn off
        with torch.autocast(device_type=h.device.type, enabled=False):
            return F.linear(h.float(), self.lm_head.weight.float())

    @staticmethod
    def default_position_ids(attention_mask: torch.Tensor | None, batch: int, num_new: int, past_len: int,
                             device: torch.device) -> torch.Tensor:
        """(B, T) positions of the new tokens when the caller gives none: past_len, past_len + 1, ...;
        with left padding, real tokens are numbered 0, 1, 2... from each row's first non-pad token."""
        if attention_mask is not None:
            return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, past_len:]
        return torch.arange(past_len, past_len + num_new, device=device).expand(batch, num_new)
