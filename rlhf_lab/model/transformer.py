"""A Llama-style decoder, written to be read top to bottom.

    tokens -> embed -> [ RMSNorm -> attention (RoPE, GQA) -> +residual
                         RMSNorm -> SwiGLU MLP            -> +residual ] x L -> RMSNorm -> lm_head

Parameter names are Hugging Face's (`model.layers.0.self_attn.q_proj.weight`, ...), so a state
dict moves between this model and `transformers.LlamaForCausalLM` unchanged (see `hf.py`). The Qwen2 /
Qwen3 families are the same decoder with a few switches (biases, Qwen3's per-head q/k norm; see
config.py), so they load too. The MoE families (Mixtral, Qwen3-MoE) swap each layer's MLP for a router
and experts (`moe.SparseMoeBlock`).

This file is the definition, op for op the one transformers writes: in float32 with eager attention
its logits equal transformers' exactly (tests/test_fast_paths.py). `LlamaModel.forward` runs the same
function in fewer ops (`fast.py`) unless `rlhf_lab.util.fast_paths.reference_paths()` is on.

Shapes: B batch, T new tokens in this call, S = past + T keys, H query heads, K key/value heads,
D head_dim, C hidden size, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..util import fast_paths
from ..util.validation import check_choice
from . import fast
from .config import ModelConfig
from .kv_cache import KVCache
from .moe import SparseMoeBlock, moe_aux_loss
from .rope import RotaryEmbedding, apply_rope


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight, computed in float32 whatever the input dtype.

    x (..., C) -> (..., C) in x's dtype (transformers' `LlamaRMSNorm`).
    """

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
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

    def forward(
        self,
        x: torch.Tensor,  # (B, T, C)
        cos: torch.Tensor,  # (B, T, D/2) float32, from `RotaryEmbedding`
        sin: torch.Tensor,  # same shape as cos
        mask: torch.Tensor | None,  # (B, 1, T, S) bool, True = may attend; None = attend to all (T = 1)
        cache: KVCache | None,
    ) -> torch.Tensor:
        B, T, _ = x.shape
        H, K, D = self.num_heads, self.num_kv_heads, self.head_dim
        q = self.q_proj(x).view(B, T, H, D)
        k = self.k_proj(x).view(B, T, K, D)
        v = self.v_proj(x).view(B, T, K, D)
        if self.q_norm is not None:  # Qwen3: normalise each head before RoPE rotates it
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T, D), (B, K, T, D) x 2
        q = apply_rope(q, cos, sin, interleaved=self.interleaved)
        k = apply_rope(k, cos, sin, interleaved=self.interleaved)
        if cache is not None:
            # The cache stores keys AFTER RoPE and BEFORE the GQA repeat, as transformers does.
            k, v = cache.update(self.layer_idx, k, v)  # (B, K, S, D)
        if self.implementation == "sdpa":
            # The same softmax(q k^T / sqrt(D) + mask) v in one fused kernel (flash / memory-efficient on a
            # GPU: the (T, S) score matrix is never stored). Boolean mask: True = may attend.
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)  # (B, H, T, D)
        else:
            out = eager_attention(q, k, v, mask)  # (B, H, T, D)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, H * D))


def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """(B, K, S, D) -> (B, K * groups, S, D): each key/value head once for each of its query heads."""
    B, K, S, D = x.shape
    return x[:, :, None].expand(B, K, groups, S, D).reshape(B, K * groups, S, D)


def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    mask: torch.Tensor | None) -> torch.Tensor:
    """softmax(q k^T / sqrt(D) + mask) v, the softmax in float32 (transformers' `eager_attention_forward`).

    q (B, H, T, D); k, v (B, K, S, D); mask (B, 1, T, S) bool, True = may attend, or None -> (B, H, T, D).
    Grouped-query attention: the H / K query heads of a group share one key/value head, repeated here.
    """
    D = q.shape[-1]
    groups = q.shape[1] // k.shape[1]
    k, v = repeat_kv(k, groups), repeat_kv(v, groups)  # (B, H, S, D)
    scores = q @ k.transpose(-1, -2) * D**-0.5  # (B, H, T, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))  # exp(-inf) = 0: a hidden key gets no weight
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return probs @ v


class MLP(nn.Module):
    """SwiGLU: down( silu(gate(x)) * up(x) ), x (..., C) -> (..., C)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        bias = config.mlp_bias
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=bias)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = SparseMoeBlock(config) if config.is_moe else MLP(config)

    def forward(self, x, cos, sin, mask, cache, expert_indices=None):
        """x (B, T, C), cos and sin (B, T, D/2), mask (B, 1, T, S) | None -> (x (B, T, C), routing):
        routing is (router_logits, expert_indices) for an MoE layer, None for a dense one."""
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
        raise ValueError(f"attention_mask covers {attention_mask.shape[-1]} positions "
                         f"but past + new = {total}")
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

    Routing replay (MoE): `expert_indices` from an earlier forward (e.g. pi_old's
    `ModelOutput.expert_indices`) makes every layer use exactly those experts, gated by the current
    router's probabilities at them (GSPO paper §5, arXiv 2507.18071). The aux loss counts the non-padding
    tokens of this call.
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
        if fast_paths.enabled():  # the same function in fewer ops (model/fast.py); the code below defines it
            return fast.forward(self, input_ids, attention_mask, position_ids, cache, num_logits_to_keep,
                                expert_indices)
        B, T = input_ids.shape
        self.check_expert_indices(expert_indices)
        past_len = cache.get_seq_length() if cache is not None else 0
        mask = build_attention_mask(attention_mask, T, past_len, input_ids.device)  # (B, 1, T, S) or None
        if position_ids is None:
            position_ids = self.default_position_ids(attention_mask, B, T, past_len, input_ids.device)
        cos, sin = self.rotary_emb(position_ids)  # (B, T, D/2) float32 each, shared by every layer
        x = self.model.embed_tokens(input_ids)  # (B, T, C)
        # gradient checkpointing: recompute each layer in the backward (training steps only)
        recompute = self.gradient_checkpointing and self.training and torch.is_grad_enabled()
        recompute = recompute and cache is None
        routing = []  # MoE: (router_logits, expert_indices) per layer
        for i, layer in enumerate(self.model.layers):
            replay = expert_indices[i] if expert_indices is not None else None
            if recompute:
                x, layer_routing = checkpoint(layer, x, cos, sin, mask, None, replay, use_reentrant=False)
            else:
                x, layer_routing = layer(x, cos, sin, mask, cache, replay)
            if layer_routing is not None:
                routing.append(layer_routing)
        h = self.model.norm(x)
        logits = self.lm_logits(h[:, -num_logits_to_keep:] if num_logits_to_keep else h)
        return self.make_output(h, logits, routing, attention_mask, cache)

    def check_expert_indices(self, expert_indices: tuple[torch.Tensor, ...] | None) -> None:
        """Routing replay needs an MoE model and one (B, T, k) tensor per layer."""
        layers = len(self.model.layers)
        if expert_indices is not None and (not self.config.is_moe or len(expert_indices) != layers):
            expected = layers if self.config.is_moe else 0
            raise ValueError(f"expert_indices must hold one (B, T, k) tensor per MoE layer ({expected} "
                             f"for this model), got {len(expert_indices)}")

    def make_output(self, h: torch.Tensor, logits: torch.Tensor, routing: list,
                    attention_mask: torch.Tensor | None, cache: KVCache | None) -> ModelOutput:
        """The forward's result from the final hidden states h (B, T, C) and the logits: the value
        head's values and, for an MoE model, the router outputs and the aux loss over this call's
        non-padding tokens."""
        values = self.value_head(h).squeeze(-1).float() if self.value_head is not None else None
        if not routing:
            return ModelOutput(logits=logits, cache=cache, values=values, hidden_states=h)
        router_logits = tuple(r for r, _ in routing)
        real = attention_mask[:, -h.shape[1]:] if attention_mask is not None else None
        return ModelOutput(logits=logits, cache=cache, values=values, hidden_states=h,
                           router_logits=router_logits, expert_indices=tuple(e for _, e in routing),
                           aux_loss=moe_aux_loss(self.config, router_logits, real))

    def lm_logits(self, h: torch.Tensor) -> torch.Tensor:
        """The LM head on final (normed) hidden states (..., C) -> logits (..., V), always float32.

        Float32 even under bf16 autocast or with bf16 weights: log-probs and the PPO/GRPO ratio
        exp(log pi - log pi_old) are differences of nearly equal numbers, and bf16 keeps 8 bits.
        """
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
