"""The lab's tiny Llama: config, decoder, RoPE, KV caches, mixture of experts and Hugging Face interop."""

from .config import ModelConfig
from .hf import (
    CheckpointError,
    config_from_hf,
    config_to_hf,
    from_hf,
    from_pretrained,
    save_pretrained,
    to_hf,
)
from .kv_cache import DynamicCache, KVCache, StaticCache, kv_cache_bytes
from .moe import SparseMoeBlock, load_balancing_loss, moe_aux_loss, router_z_loss
from .rope import ROPE_TYPES
from .transformer import LlamaModel, ModelOutput, RMSNorm, build_attention_mask

__all__ = [
    "ROPE_TYPES",
    "CheckpointError",
    "DynamicCache",
    "KVCache",
    "LlamaModel",
    "ModelConfig",
    "ModelOutput",
    "RMSNorm",
    "SparseMoeBlock",
    "StaticCache",
    "build_attention_mask",
    "config_from_hf",
    "config_to_hf",
    "from_hf",
    "from_pretrained",
    "kv_cache_bytes",
    "load_balancing_loss",
    "moe_aux_loss",
    "router_z_loss",
    "save_pretrained",
    "to_hf",
]
