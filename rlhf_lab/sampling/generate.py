"""Batched generation: left-pad the prompts, prefill once, then one token per step through a KV cache.

    prompts --left pad--> (B, P) --prefill--> cache + last logits
            --expand(G)--> (B*G) rows, the G samples of a prompt sharing its prefill
            loop: processors -> sample -> write token -> stop rows that emitted EOS -> forward(1 token)

What the RL code needs comes back in `GenerationOutput`: the completion ids and mask (1 up to and
including EOS), whether each row finished or was truncated, and the log-prob of every sampled token
under the distribution it was drawn from (after temperature and filters): the rollout's `old_logprobs`.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..model.fast import fused_projections
from ..model.kv_cache import DynamicCache, StaticCache
from ..util import fast_paths
from ..util.device import autocast
from ..util.limits import check_memory, check_positions, check_token_ids, generation_bytes
from ..util.validation import check_bool, check_choice, check_number
from . import fast
from .compiled import CompiledSteps, compiled_cache_length
from .config import SamplingConfig
from .processors import make_generator, process_logits, sample_next_token

CACHE_KINDS = ("static", "dynamic", "paged", "int8", "none")


def make_cache(kind: str, config, batch_size: int, max_len: int, device=None, dtype=torch.float32, **kwargs):
    """A fresh KV cache of one of CACHE_KINDS ('none' -> None: recompute the whole prefix every step)."""
    if kind == "static":
        return StaticCache(config, batch_size, max_len, device=device, dtype=dtype)
    if kind == "dynamic":
        return DynamicCache()
    if kind == "paged":
        from ..model.paged_cache import PagedKVCache

        return PagedKVCache(config, batch_size, max_len, device=device, dtype=dtype, **kwargs)
    if kind == "int8":
        from ..model.quantized_cache import QuantizedKVCache

        return QuantizedKVCache(config, batch_size, device=device, dtype=dtype, **kwargs)
    if kind == "none":
        return None
    check_choice("cache", kind, CACHE_KINDS)
    raise AssertionError(f"unhandled cache kind {kind!r}")


def left_pad(sequences: Sequence[Sequence[int]], pad_token_id: int,
             device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists -> (ids (B, P), attention_mask (B, P)), padded on the LEFT so that every row's last
    prompt token sits in the same column and the next token is written at the same position for all."""
    if len(sequences) == 0:
        raise ValueError("prompts must contain at least one prompt")
    width = max(len(s) for s in sequences)
    if width == 0:
        raise ValueError("every prompt is empty: give at least one token (e.g. BOS)")
    ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if len(seq) == 0:
            raise ValueError(f"prompt {row} is empty: give at least one token (e.g. BOS)")
        ids[row, width - len(seq):] = torch.as_tensor(list(seq), dtype=torch.long)
        mask[row, width - len(seq):] = 1
    return ids.to(device), mask.to(device)


@dataclass
class GenerationOutput:
    """Shapes: N = number of prompts * num_return_sequences, P prompt width, T generated steps."""

    prompt_ids: torch.Tensor  # (N, P) left-padded
    prompt_mask: torch.Tensor  # (N, P) 1 = real prompt token
    completion_ids: torch.Tensor  # (N, T) pad after EOS
    completion_mask: torch.Tensor  # (N, T) 1 for generated tokens up to and including EOS
    finished: torch.Tensor  # (N,) bool: the row emitted EOS
    truncated: torch.Tensor  # (N,) bool: the row hit max_new_tokens without EOS
    logprobs: torch.Tensor | None  # (N, T) float32 log-prob of each sampled token, 0 where masked
    num_return_sequences: int = 1
    cache: object = None
    timings: dict = field(default_factory=dict)  # prefill_s, decode_s, steps

    @property
    def sequences(self) -> torch.Tensor:
        """(N, P + T) prompt and completion side by side."""
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.prompt_mask, self.completion_mask], dim=1)

    @property
    def completion_lengths(self) -> torch.Tensor:
        return self.completion_mask.sum(1)

    def texts(self, tokenizer) -> list[str]:
        """Decoded completions, EOS and padding removed."""
        return [tokenizer.decode_until_eos(row)[0] for row in self.completion_ids.tolist()]


def _encode_prompts(prompts, tokenizer, attention_mask, pad_token_id, device):
    if isinstance(prompts, torch.Tensor):
        if prompts.dim() != 2:
            raise ValueError(f"prompt tensor must be (batch, seq), got shape {tuple(prompts.shape)}")
        mask = attention_mask if attention_mask is not None else torch.ones_like(prompts)
        return prompts.to(device), mask.to(device)
    if isinstance(prompts, str):
        prompts = [prompts]
    if len(prompts) and isinstance(prompts[0], str):
        if tokenizer is None:
            raise ValueError("text prompts need a tokenizer: generate(model, texts, config, tokenizer=...)")
        prompts = [tokenizer.encode(text, add_bos=True) for text in prompts]
    return left_pad(prompts, pad_token_id, device)


@torch.no_grad()
def generate(
    model,
    prompts,
    config: SamplingConfig | None = None,
    *,
    tokenizer=None,
    num_return_sequences: int = 1,
    cache: str = "static",
    attention_mask: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    stop_at_eos: bool = True,
    compile: bool = False,
    **cache_kwargs,
) -> GenerationOutput:
    """Generate completions for a batch of prompts.

    Args:
        model: a `rlhf_lab.model.LlamaModel` (any module with the same forward signature).
        prompts: list of strings (encoded with `tokenizer`, BOS prepended), list of token-id lists, or a
            (B, P) LongTensor with `attention_mask`.
        config: decoding settings; default greedy with 16 new tokens.
        num_return_sequences: G samples per prompt; rows b*G .. b*G+G-1 belong to prompt b.
        cache: one of CACHE_KINDS. 'none' recomputes the whole prefix each step (the slow baseline).
        generator: RNG for sampling; default: seeded from config.seed (None -> global RNG).
        stop_at_eos: False keeps generating after EOS (benchmarks that need a fixed token count).
        compile: True runs each decode step through `torch.compile` (`rlhf_lab.sampling.compiled`; needs
            cache='static'). The first call with new shapes pays the compilation (`timings['first_step_s']`);
            the results equal the eager ones up to float32 rounding. If compilation fails, a warning says
            why and the call decodes eagerly.

    Raises ValueError before allocating anything if a prompt id is outside the vocabulary, if prompt
    + max_new_tokens exceeds the model's max_position_embeddings (stop_at_eos=True), or if the KV cache
    and buffers would need more than half of the free memory (`rlhf_lab.util.limits`).
    """
    config = config or SamplingConfig(do_sample=False)
    check_number("num_return_sequences", num_return_sequences, low=1, integer=True)
    check_bool("compile", compile)
    if compile and cache != "static":
        raise ValueError(f"compile=True needs cache='static' (the fixed-shape cache), got cache={cache!r}")
    if compile and model.rotary_emb.rope_type == "dynamic":
        raise ValueError("compile=True needs a RoPE table, which rope_type 'dynamic' cannot have (its "
                         "frequencies change with the length): use compile=False")
    mc = model.config
    device = model.device
    prompt_ids, prompt_mask = _encode_prompts(prompts, tokenizer, attention_mask, mc.pad_token_id, device)
    B, P = prompt_ids.shape
    G, T_max = num_return_sequences, config.max_new_tokens
    if generator is None:
        generator = make_generator(config, device)
    dtype = next(model.parameters()).dtype
    # Bounds before any allocation: ids the model can embed, a context it was built for (a fixed-length
    # benchmark may run past it: RoPE extends to any position), and memory the machine has.
    check_token_ids(prompt_ids, mc.vocab_size)
    if stop_at_eos:
        check_positions(mc, P, T_max, "max_new_tokens")
    elif P + T_max > mc.max_position_embeddings:
        warnings.warn(f"generating {P} prompt + {T_max} new positions, past max_position_embeddings="
                      f"{mc.max_position_embeddings}: RoPE extends to them, but the model never saw them in "
                      "training (fine for a fixed-length benchmark, not for answers)",
                      stacklevel=3)  # 3: past torch.no_grad's wrapper, to the caller
    check_memory(generation_bytes(mc, B * G, P, T_max, dtype.itemsize), device,
                 f"generating {B * G} sequences of {P} + {T_max} tokens", "max_new_tokens or the batch")

    # Stacked q|k|v and gate|up weights for the model's fast forward, for the length of the call (the
    # weights cannot change meanwhile)
    with fused_projections(model):
        return _generate(model, prompt_ids, prompt_mask, config, G, generator, cache, stop_at_eos, dtype,
                         compile, cache_kwargs)


def _generate(model, prompt_ids, prompt_mask, config, G, generator, cache, stop_at_eos, dtype, compile,
              cache_kwargs):
    """The body of `generate`, its arguments checked: prefill, then the decode loop."""
    mc, device = model.config, prompt_ids.device
    pad_id, eos_id = mc.pad_token_id, mc.eos_token_id
    (B, P), T_max = prompt_ids.shape, config.max_new_tokens
    t0 = time.perf_counter()
    if cache == "paged":
        cache_kwargs.setdefault("max_sequences", B * G)  # the pool must hold every sample after expand
    kv = make_cache(cache, mc, B, compiled_cache_length(P + T_max) if compile else P + T_max, device=device,
                    dtype=dtype, **cache_kwargs)
    # One look at the prompts decides the mask for the whole call. Without padding every row's position is
    # its column and every key is visible to the new token, so the forward passes need no mask at all
    # (same result as an all-ones mask, without building one or checking it each step).
    padded = not bool(prompt_mask.all())
    amp = autocast(device)
    # The forwards and the draws run under inference_mode: no_grad that also skips autograd's view and
    # version bookkeeping, one dispatch layer less for each op of a decode step. The ids, masks and
    # log-probs the call returns are made outside it, so they stay ordinary tensors that a training
    # step can use. The compiled step keeps the grad mode it was compiled in.
    infer = contextlib.nullcontext() if compile else torch.inference_mode()
    with amp, infer:
        logits = model(prompt_ids, attention_mask=prompt_mask if padded else None, cache=kv,
                       num_logits_to_keep=1).logits[:, -1]
    if G > 1:  # prefill each prompt once; its G samples share the result
        logits = logits.repeat_interleave(G, dim=0)
        prompt_ids = prompt_ids.repeat_interleave(G, dim=0)
        prompt_mask = prompt_mask.repeat_interleave(G, dim=0)
        if kv is not None:
            kv = kv.expand(G)
    t1 = time.perf_counter()

    N = B * G
    ids = torch.cat([prompt_ids, torch.full((N, T_max), pad_id, dtype=torch.long, device=device)], dim=1)
    mask = torch.cat([prompt_mask, torch.ones((N, T_max), dtype=prompt_mask.dtype, device=device)], dim=1)
    # Without EOS stops every generated token counts; with them, a row's tokens count up to its EOS.
    completion_mask = torch.zeros((N, T_max), dtype=torch.long, device=device) if stop_at_eos else \
        torch.ones((N, T_max), dtype=torch.long, device=device)
    logprobs = torch.zeros((N, T_max), dtype=torch.float32, device=device) if config.return_logprobs else None
    done = torch.zeros(N, dtype=torch.bool, device=device)
    # Only no-repeat-ngram can remove every token of a row; otherwise that check would be wasted work.
    check_removed = config.no_repeat_ngram_size > 0
    choose = token_chooser(config, check_removed, logprobs is not None)  # the processors and the draw
    step = CompiledSteps(model, kv, prompt_mask) if compile else None
    steps = 0
    with infer:
        for t in range(T_max):
            width = P + t
            # HF's MinNewTokensLengthLogitsProcessor: no EOS yet (-inf survives every stage)
            if t < config.min_new_tokens:
                logits = logits.clone()
                logits[:, eos_id] = float("-inf")
            tokens, token_logprobs = choose(logits, ids, mask, width, generator)  # context: width columns
            if stop_at_eos:
                tokens = tokens.masked_fill(done, pad_id)  # finished rows keep emitting padding
                completion_mask[:, t] = ~done
            ids[:, width] = tokens
            if logprobs is not None:
                logprobs[:, t] = token_logprobs.masked_fill(done, 0.0) if stop_at_eos else token_logprobs
            steps = t + 1
            if stop_at_eos:
                done |= tokens == eos_id
                if bool(done.all()):  # the one host sync per step, and only when EOS can stop the call
                    break
            if t == T_max - 1:
                break
            step_mask = mask[:, : width + 1] if padded else None
            with amp:
                if step is not None:  # compiled: fixed shapes, the position as a tensor
                    logits = step(tokens, width)
                elif kv is None:  # no cache: feed the whole sequence again
                    logits = model(ids[:, : width + 1], attention_mask=step_mask,
                                   num_logits_to_keep=1).logits[:, -1]
                else:
                    logits = model(tokens[:, None], attention_mask=step_mask, cache=kv).logits[:, -1]
    t2 = time.perf_counter()

    return GenerationOutput(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=ids[:, P : P + steps],
        completion_mask=completion_mask[:, :steps],
        finished=done,
        truncated=~done,
        logprobs=logprobs[:, :steps] if logprobs is not None else None,
        num_return_sequences=G,
        cache=kv,
        timings={"prefill_s": t1 - t0, "decode_s": t2 - t1, "steps": steps,
                 **({"first_step_s": step.first_step_s} if step is not None else {})},
    )


def token_chooser(config: SamplingConfig, check_removed: bool, return_logprobs: bool):
    """The step's choice of the next tokens, the processors of `config` then one draw per row:
    fn(logits (N, V), ids (N, L), attention_mask (N, L), width, generator) -> (tokens (N,), log-probs (N,)
    or None), where the first `width` columns of ids and attention_mask are the context so far."""
    if fast_paths.enabled():  # the same in fewer ops (sampling/fast.py); the code below is its definition
        return fast.token_chooser(config, check_removed, return_logprobs)

    def choose(logits, ids, attention_mask, width, generator):
        scores = process_logits(logits, ids[:, :width], config, attention_mask[:, :width])
        return sample_next_token(scores, config, generator, check_removed=check_removed,
                                 return_logprobs=return_logprobs)

    return choose


def complete(model, tokenizer, prompts: list[str], config: SamplingConfig | None = None,
             **kwargs) -> list[str]:
    """Convenience: text prompts in, decoded completions (EOS removed) out."""
    return generate(model, prompts, config, tokenizer=tokenizer, **kwargs).texts(tokenizer)
