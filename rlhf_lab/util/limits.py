"""Bounds checked before work starts: what fits the model, and what fits in memory.

    check_tokenizer_fits(tokenizer, model_config)       every token id has an embedding row
    check_token_ids(ids, vocab_size)                     prompt ids inside the vocabulary
    check_positions(model_config, prompt, new, field)    prompt + generation <= max_position_embeddings
    check_sequence_length(model_config, length, what)    a whole sequence <= max_position_embeddings
    generation_bytes(model_config, rows, prompt, new)    what `generate` allocates, estimated
    training_bytes(model_config, rows, length)           what a forward and backward allocate, estimated
    check_memory(needed, device, what, field)            refuse a request that cannot fit, before allocating

A request that would not fit raises ValueError naming the setting to change, instead of an
IndexError deep in torch or an out-of-memory kill that takes the machine down with it.
"""

from __future__ import annotations

import os

import torch

# Refuse a single allocation plan above this share of the memory available now: the rest of the
# process (the models, the optimiser, Python) and the rest of the machine need some too.
MEMORY_SHARE = 0.5


def check_tokenizer_fits(tokenizer, model_config) -> None:
    """Raise ValueError unless every id the tokenizer can produce has a row in the model's embedding."""
    if len(tokenizer) > model_config.vocab_size:
        raise ValueError(f"the tokenizer has {len(tokenizer)} tokens but the model's vocab_size is "
                         f"{model_config.vocab_size}: ids >= {model_config.vocab_size} have no embedding; "
                         "use the tokenizer the model was trained with")


def check_token_ids(ids: torch.Tensor, vocab_size: int, what: str = "prompt") -> None:
    """Raise ValueError if a token id in `ids` is negative or >= vocab_size."""
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        bad = int(ids.max()) if int(ids.max()) >= vocab_size else int(ids.min())
        raise ValueError(f"{what} holds token id {bad}, outside the model's vocabulary [0, {vocab_size})")


def check_positions(model_config, prompt_tokens: int, new_tokens: int, field: str = "max_new_tokens") -> None:
    """Raise ValueError naming `field` unless prompt_tokens + new_tokens <= max_position_embeddings
    (the context the model was built, and trained, for)."""
    limit = model_config.max_position_embeddings
    if prompt_tokens + new_tokens > limit:
        raise ValueError(f"{field} must be <= {max(limit - prompt_tokens, 0)}: the longest prompt has "
                         f"{prompt_tokens} tokens and the model's max_position_embeddings is {limit}, "
                         f"got {field}={new_tokens}")


def check_sequence_length(model_config, length: int, what: str) -> None:
    """Raise ValueError unless a sequence of `length` tokens (`what` it is) fits the model's context:
    past max_position_embeddings the model meets positions it was never trained on."""
    limit = model_config.max_position_embeddings
    if length > limit:
        raise ValueError(f"{what} has {length} tokens, more than the model's max_position_embeddings "
                         f"({limit}); shorten it")


def training_bytes(model_config, rows: int, length: int) -> int:
    """Bytes one forward and backward over (rows, length) tokens allocate, estimated: ~4 float32
    copies of the (rows, length, vocab) logits (log-softmax and its gradient) and ~16 of each
    layer's (rows, length, hidden) activations, plus the batch's int64 indices."""
    c = model_config
    per_token = 4 * (4 * c.vocab_size + 16 * c.num_hidden_layers * c.hidden_size)
    return rows * length * per_token + rows * 8


def generation_bytes(model_config, rows: int, prompt_tokens: int, new_tokens: int, dtype_bytes: int = 4) -> int:
    """Bytes `generate` allocates for `rows` sequences: the KV cache, 2 (k, v) x layers x rows x
    kv_heads x (P + T) x head_dim values, plus the token ids, masks and log-probs (8 bytes each per
    position) and one row of logits per sequence."""
    c = model_config
    length = prompt_tokens + new_tokens
    cache = 2 * c.num_hidden_layers * rows * c.num_key_value_heads * length * c.head_dim * dtype_bytes
    return cache + rows * length * 8 * 4 + rows * c.vocab_size * 4


def available_memory_bytes(device: torch.device | str = "cpu") -> int | None:
    """Free memory on `device` now: the GPU's free bytes, or the machine's available RAM
    (Linux: MemAvailable; elsewhere the physical size). None when unknown."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_memory(needed: int, device, what: str, field: str) -> None:
    """Raise ValueError naming `field` if `needed` bytes exceed MEMORY_SHARE of the memory available."""
    available = available_memory_bytes(device)
    if available is not None and needed > MEMORY_SHARE * available:
        raise ValueError(f"{what} would need about {needed / 2**30:.1f} GiB, more than "
                         f"{MEMORY_SHARE:.0%} of the {available / 2**30:.1f} GiB available; lower {field}")
