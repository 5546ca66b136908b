"""Key/value caches: what lets generation feed one token per step instead of the whole sequence.

Every cache has the same two-method interface, used by `Attention`:

    keys, values = cache.update(layer_idx, new_keys, new_values)   # (B, K, T, D) in, (B, K, S, D) out
    cache.get_seq_length()                                          # S before this forward

Keys are stored after RoPE and before the grouped-query repeat (as in transformers), so a cache
holds K (not H) heads: GQA divides KV memory by H / K.

    bytes = 2 (K and V) * layers * kv_heads * head_dim * seq_len * batch * bytes_per_element
"""

from __future__ import annotations

from typing import Protocol

import torch

from ..util.validation import check_number


class KVCache(Protocol):
    def update(
        self, layer_idx: int, key: torch.Tensor, value: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def get_seq_length(self) -> int: ...

    def expand(self, repeats: int) -> KVCache:
        """Row b becomes rows b*repeats .. b*repeats + repeats - 1 (G samples of one prefilled prompt)."""
        ...

    def nbytes(self) -> int: ...


def kv_cache_bytes(config, batch: int, seq_len: int, dtype: torch.dtype | int = torch.float16) -> int:
    """Memory of a full KV cache: 2 * layers * kv_heads * head_dim * seq_len * batch * bytes/element.

    `config` is a `ModelConfig` or anything with `num_hidden_layers`, `num_key_value_heads` and
    `head_dim` (a transformers `LlamaConfig` works). `dtype` may be a torch dtype or a byte count.
    Llama-2-7B in fp16 -> 512 KiB per token; Llama-3-8B in bf16 (8 kv heads) -> 128 KiB per token.
    """
    bytes_per_element = dtype if isinstance(dtype, int) else torch.empty((), dtype=dtype).element_size()
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return 2 * config.num_hidden_layers * kv_heads * head_dim * seq_len * batch * bytes_per_element


class DynamicCache:
    """Grows by concatenation: simple, but reallocates every step (transformers' default cache)."""

    def __init__(self) -> None:
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    def update(self, layer_idx, key, value):
        if layer_idx == len(self.keys):
            self.keys.append(key)
            self.values.append(value)
        else:
            self.keys[layer_idx] = torch.cat([self.keys[layer_idx], key], dim=2)
            self.values[layer_idx] = torch.cat([self.values[layer_idx], value], dim=2)
        return self.keys[layer_idx], self.values[layer_idx]

    def get_seq_length(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0

    def expand(self, repeats: int) -> DynamicCache:
        check_number("repeats", repeats, low=1, integer=True)
        out = DynamicCache()
        out.keys = [k.repeat_interleave(repeats, dim=0) for k in self.keys]
        out.values = [v.repeat_interleave(repeats, dim=0) for v in self.values]
        return out

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)


class StaticCache:
    """Contiguous, preallocated cache: one (B, K, max_len, D) buffer per layer, written in place.

    No reallocation while decoding; `update` returns views of the filled prefix, so the attention
    mask only needs to cover the positions written so far.
    """

    def __init__(self, config, batch_size: int, max_len: int, device=None, dtype=torch.float32) -> None:
        check_number("batch_size", batch_size, low=1, integer=True)
        check_number("max_len", max_len, low=1, integer=True)
        shape = (batch_size, config.num_key_value_heads, max_len, config.head_dim)
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.num_hidden_layers)]
        self.values = [torch.zeros(shape, device=device,
                                   dtype=dtype) for _ in range(config.num_hidden_layers)]
        self.max_len = max_len
        self.length = 0  # positions filled in every layer
        self._num_layers = config.num_hidden_layers

    def update(self, layer_idx, key, value):
        start, new = self.length, key.shape[2]
        if start + new > self.max_len:
            raise ValueError(f"StaticCache is full: max_len={self.max_len}, needed {start + new}")
        self.keys[layer_idx][:, :, start : start + new] = key
        self.values[layer_idx][:, :, start : start + new] = value
        if layer_idx == self._num_layers - 1:
            self.length += new
        end = start + new
        return self.keys[layer_idx][:, :, :end], self.values[layer_idx][:, :, :end]

    def get_seq_length(self) -> int:
        return self.length

    def expand(self, repeats: int) -> StaticCache:
        check_number("repeats", repeats, low=1, integer=True)
        out = StaticCache.__new__(StaticCache)
        out.keys = [k.repeat_interleave(repeats, dim=0) for k in self.keys]
        out.values = [v.repeat_interleave(repeats, dim=0) for v in self.values]
        out.max_len, out.length, out._num_layers = self.max_len, self.length, self._num_layers
        return out

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)


class FixedShapeCache:
    """A `StaticCache` seen with shapes that never change: what a compiled decode step needs.

    `StaticCache.update` writes at a Python int (its length) and returns the filled prefix, so the key
    length S grows by one every step: a new shape each step, and a compiled graph would be rebuilt each
    step. Here the write position is a tensor (`index_copy_` at `position`) and `update` returns the
    whole (B, K, max_len, D) buffers; the caller's attention mask hides the slots not written yet (their
    softmax weight is exactly 0). The `StaticCache`'s own `length` is left to the caller to advance.
    """

    def __init__(self, cache: StaticCache, position: torch.Tensor) -> None:
        self.keys, self.values = cache.keys, cache.values
        self.position = position.reshape(1)  # (1,) long: the slot the new token goes to

    def update(self, layer_idx, key, value):
        self.keys[layer_idx].index_copy_(2, self.position, key)
        self.values[layer_idx].index_copy_(2, self.position, value)
        return self.keys[layer_idx], self.values[layer_idx]
