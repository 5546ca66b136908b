"""The opt-in compiled decode step (`generate(..., compile=True)`): one token per row through the model.

Why compile. At the lab's size a decode step is many small ops (bench/RESULTS.md, "Profile of a decode
step"); each costs a dispatch and some Python, more than its arithmetic. `torch.compile` (TorchInductor)
traces the step once into a graph, fuses the pointwise ops (RMSNorm, RoPE, SwiGLU, the mask, softmax)
into a few generated C++ loops and leaves the matmuls to the BLAS library.

Why fixed shapes. The eager step attends over the S keys written so far, S growing by one per step: a
new shape every step, so a compiled graph would be rebuilt every step. The compiled step attends over
every slot of the static cache (`FixedShapeCache`), the slots not written yet hidden by the mask (their
softmax weight is exactly 0), and takes the position as a tensor. Every step of a call then has the same
shapes and one compilation serves them all, and every later call whose rows and cache length are the
same. The cache length is rounded up to a multiple of `CACHE_LENGTH_MULTIPLE`, so prompts of slightly
different lengths share a compilation too.

The step is the model's fast forward (`rlhf_lab.model.fast`), layer by layer. The numbers equal the eager
step's up to float32 rounding, not bit for bit: the generated kernels sum in their own order, and the
softmax runs over the whole cache instead of the filled prefix.
"""

from __future__ import annotations

import math
import time
import warnings

import torch
import torch.nn.functional as F

from ..model import fast
from ..model.kv_cache import FixedShapeCache, StaticCache

CACHE_LENGTH_MULTIPLE = 16  # compiled calls size their cache in steps of this many positions


def compiled_cache_length(length: int) -> int:
    """The static cache length of a compiled call: `length` rounded up to CACHE_LENGTH_MULTIPLE."""
    return CACHE_LENGTH_MULTIPLE * math.ceil(length / CACHE_LENGTH_MULTIPLE)


def decode_step(model, tokens: torch.Tensor, position: torch.Tensor, cache: StaticCache,
                visible: torch.Tensor, offsets: torch.Tensor, rope_table: tuple[torch.Tensor, torch.Tensor],
                stacks: tuple) -> torch.Tensor:
    """One decoding step with shapes that never change: next-token logits (N, V) float32.

    Args:
        model: a `LlamaModel`.
        tokens: (N,) long, the tokens written at column `position`.
        position: () long, that column (the cache slot the tokens' keys and values go to).
        cache: the call's `StaticCache`; slot `position` of every layer is written in place.
        visible: (N, max_len) bool, False at left padding (the keys no token may see).
        offsets: (N,) long, each row's padding count: a token at column c has position c - offset.
        rope_table: `fast.rope_factors` of `fast.cos_sin_table(model.rotary_emb, max_len)`, made once per
            call: the (max_len, D') tables every layer's `fast.rotate` multiplies by (D' = D, or D/2 for
            interleaved pairs).
        stacks: `fast.layer_stacks(model)`, each layer's stacked q|k|v and gate|up weights (arguments, so
            that the graph reads the tensors of the current call).
    """
    slots = torch.arange(visible.shape[1], device=visible.device)
    mask = (visible & (slots <= position))[:, None, None, :]  # (N, 1, 1, max_len): written, not padding
    position_ids = (position - offsets)[:, None]  # (N, 1), as default_position_ids numbers them
    cos_table, sin_table = rope_table
    cos = F.embedding(position_ids, cos_table)[:, None]  # (N, 1, 1, D'): the same angle for every head
    sin = F.embedding(position_ids, sin_table)[:, None]
    slot_cache = FixedShapeCache(cache, position)
    x = model.model.embed_tokens(tokens[:, None])  # (N, 1, C)
    for layer, layer_stacks in zip(model.model.layers, stacks):
        x, _ = fast.decoder_layer(layer, x, cos, sin, mask, slot_cache, None, layer_stacks)
    return fast.lm_logits(model, fast.rms_norm(model.model.norm, x[:, 0]))  # (N, V) float32, as the forward


# TorchInductor's C++ wrapper: the generated code calls its kernels from C++, not from Python
COMPILE_OPTIONS = {"cpp_wrapper": True}


class CompiledFunction:
    """`fn` under torch.compile with fixed shapes, for the steps of one `generate` call.

    torch's own cache keeps what it compiled for later calls with the same shapes (in this process, and
    its kernels on disk). The first call is timed (`first_call_s`, compilation included when the shapes
    are new); if compiling fails there, one warning names the reason and `fn` runs eagerly from then on.
    Later calls skip the guards' evaluation (`torch.compiler.set_stance(skip_guard_eval_unsafe=True)`):
    within one call the arguments keep their shapes, dtypes and objects, so the guards the first call
    passed still hold, and checking them again each step would cost more than some of the step's kernels.
    """

    def __init__(self, fn) -> None:
        self.fn, self.run = fn, None
        self.first_call_s: float | None = None

    def __call__(self, *args):
        if self.first_call_s is None:
            return self.first_call(*args)
        if self.run is self.fn:  # compilation failed: eager
            return self.fn(*args)
        with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
            return self.run(*args)

    def first_call(self, *args):
        start = time.perf_counter()
        try:
            self.run = compiled(self.fn)
            out = self.run(*args)
        except Exception as error:  # a compiler missing or failing: run eagerly, say so once
            warn_compile_failed(error)
            self.run = self.fn
            out = self.fn(*args)
        self.first_call_s = time.perf_counter() - start
        return out


COMPILED: dict = {}  # fn -> its torch.compile wrapper, made once per process


def compiled(fn):
    """`fn` under torch.compile with fixed shapes, the wrapper made once per process: making one costs
    more than a short `generate` call's decoding. What it compiled lives in torch's own cache either way."""
    if fn not in COMPILED:
        COMPILED[fn] = torch.compile(fn, dynamic=False, options=COMPILE_OPTIONS)
    return COMPILED[fn]


def warn_compile_failed(error: Exception) -> None:
    """The fallback's one warning: compilation failed (no C++ compiler, an unsupported platform...),
    so the call runs eagerly. Python shows a warning from one place once per session by default."""
    warnings.warn(f"generate(compile=True): torch.compile failed ({type(error).__name__}: "
                  f"{str(error).splitlines()[0] if str(error) else ''}); decoding eagerly instead",
                  RuntimeWarning, stacklevel=4)


class CompiledSteps:
    """The decode steps of one `generate` call, compiled: `step(tokens, column)` -> next-token logits (N, V).

    Holds what stays fixed over the call: the mask of padding, each row's offset, the RoPE table, the
    stacked projections and the position tensor (refilled each step: the same tensor, so nothing for a
    guard to see change). Only the model's step is compiled; the processors and the choice of the token
    run eagerly after it, as without compile, one graph serving greedy decoding and every sampling
    setting. Inside the graph they were no faster (bench/RESULTS.md, "Generation"): top-k, the sort and
    the cumsum stay library calls there, and the temperature, k and p would be constants that dynamo
    guards on, so each new setting would be a new compilation.
    """

    def __init__(self, model, cache: StaticCache, prompt_mask: torch.Tensor) -> None:
        N, P = prompt_mask.shape
        device = prompt_mask.device
        self.model, self.cache = model, cache
        unwritten = torch.ones(N, cache.max_len - P, dtype=torch.bool, device=device)
        self.visible = torch.cat([prompt_mask != 0, unwritten], 1)
        self.offsets = P - prompt_mask.sum(1)  # (N,) padding count of each row
        self.rope_table = fast.rope_factors(*fast.cos_sin_table(model.rotary_emb, cache.max_len),
                                            model.config.rope_interleaved)
        self.stacks = fast.layer_stacks(model)
        self.position = torch.zeros((), dtype=torch.long, device=device)
        self.forward = CompiledFunction(decode_step)

    def __call__(self, tokens: torch.Tensor, column: int) -> torch.Tensor:
        self.position.fill_(column)
        logits = self.forward(self.model, tokens, self.position, self.cache, self.visible, self.offsets,
                              self.rope_table, self.stacks)
        self.cache.length += 1  # the StaticCache's own count of filled positions, as its update keeps it
        return logits

    @property
    def first_step_s(self) -> float | None:
        """The first step's seconds, compilation included when its shapes were new (None: no step ran)."""
        return self.forward.first_call_s
