"""Beam search with transformers' names and semantics, on the paged KV cache.

Beam search keeps the `num_beams` best partial sequences ("beams") of each prompt, scored by their
summed log-probability, and grows all of them by one token per step:

    candidates = every beam x every token:   score(beam + v) = score(beam) + log p(v | beam)
    keep the best 2 * num_beams candidates   (2x: even if every beam's best token is EOS, num_beams go on)
    a candidate ending in EOS (or at max_new_tokens) is a finished hypothesis, ranked by
        score / generated_length ** length_penalty
    the best num_beams unfinished candidates are the next beams

This follows transformers 5.x `GenerationMixin._beam_search` rule for rule, so sequences and
`sequences_scores` equal `model.generate(num_beams=..., do_sample=False)` on the same weights (tested):

- the length in the penalty is the number of *generated* tokens, EOS included, never the prompt;
- only candidates ranked among the top num_beams of the 2 * num_beams may become finished hypotheses,
  and each prompt keeps the best num_beams of them;
- `early_stopping` decides when a prompt is done: True, as soon as it holds num_beams finished
  hypotheses; False (the default), when the best running beam, normalised by its current length, can
  no longer beat the worst kept hypothesis (a heuristic: with length_penalty > 0 a longer beam could
  still win); "never", the same test with the best possible length (max_new_tokens) when
  length_penalty > 0, which is the exact rule.
- num_beams = 1 is greedy decoding, as in transformers (which does not run beam search then).

The KV cache is where beams cost memory. After each step the surviving beams are a *reordering* of the
previous ones: beam i continues parent[i], and a good parent often has several children. A contiguous
cache copies each parent's keys and values to every child (transformers' `reorder_cache`). The paged
cache (`PagedKVCache.select`) copies block tables instead: the children share the parent's blocks
(reference count up), a block is copied only when a child writes into a shared, partially filled block
(copy-on-write), and blocks of beams that died return to the free list. vLLM does the same (Kwon et al.
2023, arXiv 2309.06180, section 4.4).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..model.paged_cache import PagedKVCache
from ..util.device import autocast
from ..util.limits import check_memory, check_positions, check_token_ids, generation_bytes
from ..util.validation import Validated, check_choice, check_number, setting
from .config import SamplingConfig
from .generate import _encode_prompts, generate, make_cache

BEAM_CACHE_KINDS = ("paged", "static", "dynamic")
EARLY_STOPPING_CHOICES = (True, False, "never")
# transformers' stand-in for -inf in beam scores: a finished or impossible candidate gets this added.
# The same constant (not -inf) keeps the arithmetic, and so the ranking of near-ties, identical.
NEG_LARGE = -1.0e9


@dataclass
class BeamSearchConfig(Validated):
    """Beam-search settings, named as in transformers' `GenerationConfig`.

    Attributes:
        num_beams: beams kept per prompt; 1 = greedy decoding.
        max_new_tokens: most tokens generated per hypothesis (EOS included).
        length_penalty: finished hypotheses are ranked by sum log p / generated_length ** length_penalty;
            > 0 favours longer sequences, < 0 shorter ones, 0 ranks by the raw sum (transformers'
            default 1.0).
        early_stopping: True, False or "never" (see the module docstring); transformers' default False.
        num_return_sequences: hypotheses returned per prompt, best first; at most num_beams.
    """

    num_beams: int = setting(4, ge=1, help="beams kept per prompt; 1 = greedy")
    max_new_tokens: int = setting(16, ge=1, help="tokens per hypothesis at most, EOS included")
    length_penalty: float = setting(1.0, help="rank by sum log p / length ** length_penalty")
    early_stopping: bool | str = setting(False, choices=EARLY_STOPPING_CHOICES, help="True, False or 'never'")
    num_return_sequences: int = setting(1, ge=1, help="hypotheses returned per prompt (<= num_beams)")

    def check(self) -> None:
        if self.num_return_sequences > self.num_beams:
            raise ValueError(f"num_return_sequences must satisfy 1 <= num_return_sequences <= "
                             f"{self.num_beams} (num_beams), got {self.num_return_sequences!r}")
        self.length_penalty = float(self.length_penalty)

    def hf_generate_kwargs(self) -> dict:
        """Keyword arguments for transformers' `model.generate` that mean the same thing (sampling off)."""
        return {"num_beams": self.num_beams, "max_new_tokens": self.max_new_tokens, "do_sample": False,
                "length_penalty": self.length_penalty, "early_stopping": self.early_stopping,
                "num_return_sequences": self.num_return_sequences,
                "temperature": None, "top_k": None, "top_p": None}


@dataclass
class BeamSearchOutput:
    """Shapes: N = prompts * num_return_sequences (rows n*R .. n*R+R-1 belong to prompt n), P prompt width,
    T = longest returned hypothesis (EOS included)."""

    sequences: torch.Tensor  # (N, P + T) prompt, then the hypothesis, then pad_token_id
    sequences_scores: torch.Tensor  # (N,) float32 sum log p / T_i ** length_penalty, best first per prompt
    completion_lengths: torch.Tensor  # (N,) tokens of each hypothesis, EOS included
    prompt_width: int  # P
    num_return_sequences: int = 1
    steps: int = 0  # decoding steps run
    # After the prefill and after each decoding forward (a step's high point): distinct blocks referenced,
    # and blocks the same beams would hold as contiguous per-beam caches. Empty unless cache="paged".
    blocks_in_use: list[int] = field(default_factory=list)
    blocks_if_contiguous: list[int] = field(default_factory=list)
    cow_copies: int = 0  # blocks copied by copy-on-write (paged cache)
    cache: object = None  # the cache after the search; a paged cache has released every block

    @property
    def completion_ids(self) -> torch.Tensor:
        """(N, T) the generated tokens only."""
        return self.sequences[:, self.prompt_width:]

    def texts(self, tokenizer) -> list[str]:
        """Decoded hypotheses, EOS and padding removed."""
        return [tokenizer.decode_until_eos(row)[0] for row in self.completion_ids.tolist()]

    def block_usage(self) -> dict[str, float]:
        """Peak and mean over the decoding steps of the blocks in use, paged vs contiguous per-beam
        caches, and the share saved: 1 - paged / contiguous."""
        if not self.blocks_in_use:
            raise ValueError("block_usage needs a beam search run with cache='paged'")
        paged, contiguous = self.blocks_in_use, self.blocks_if_contiguous
        peak_p, peak_c = max(paged), max(contiguous)
        mean_p, mean_c = sum(paged) / len(paged), sum(contiguous) / len(contiguous)
        return {"peak_paged": peak_p, "peak_contiguous": peak_c, "peak_saved": 1 - peak_p / peak_c,
                "mean_paged": mean_p, "mean_contiguous": mean_c, "mean_saved": 1 - mean_p / mean_c}


def reorder_cache(cache, rows: torch.Tensor):
    """Row i of the cache becomes old row rows[i] (repeats allowed): how beams follow their parents.

    Paged: block tables are copied and refcounts updated (`PagedKVCache.select`), no K/V is moved.
    Contiguous (`StaticCache`, `DynamicCache`): every layer's keys and values are gathered along the
    batch axis, one full copy per step, as transformers' `Cache.reorder_cache` does.
    """
    if isinstance(cache, PagedKVCache):
        return cache.select(rows.tolist())
    cache.keys = [k.index_select(0, rows) for k in cache.keys]
    cache.values = [v.index_select(0, rows) for v in cache.values]
    return cache


@torch.no_grad()
def beam_search(
    model,
    prompts,
    config: BeamSearchConfig | None = None,
    *,
    tokenizer=None,
    attention_mask: torch.Tensor | None = None,
    cache: str = "paged",
    block_size: int = 16,
    on_step: Callable[[int, object, torch.Tensor, torch.Tensor], None] | None = None,
) -> BeamSearchOutput:
    """Beam search for a batch of prompts (left-padded), as transformers' `generate(num_beams=...)`.

    Args:
        model: a `rlhf_lab.model.LlamaModel` (any module with the same forward signature).
        prompts: list of strings (encoded with `tokenizer`, BOS prepended), list of token-id lists, or a
            (B, P) LongTensor with `attention_mask`.
        config: `BeamSearchConfig`; default 4 beams, 16 new tokens.
        cache: "paged" (beams share blocks), or a contiguous "static" / "dynamic" cache (beams copied).
        block_size: tokens per block of the paged cache.
        on_step: called after every decoding forward as on_step(step, cache, parents, sequences), with
            parents (B * num_beams,) the row each beam continued from and sequences (B * num_beams,
            P + step + 1) the beams' tokens so far, prompt included (for inspecting or drawing the
            cache; not called with num_beams = 1).

    Returns a `BeamSearchOutput`; with cache="paged" it records the blocks in use at every step.
    """
    config = config or BeamSearchConfig()
    check_choice("cache", cache, BEAM_CACHE_KINDS)
    check_number("block_size", block_size, low=1, integer=True)
    mc, device = model.config, model.device
    pad_id, eos_id = mc.pad_token_id, mc.eos_token_id
    prompt_ids, prompt_mask = _encode_prompts(prompts, tokenizer, attention_mask, pad_id, device)
    if config.num_beams == 1:  # transformers runs greedy search here, not a one-beam beam search
        return _greedy(model, prompt_ids, prompt_mask, config, cache, block_size)
    B, P = prompt_ids.shape
    K, T_max, lp = config.num_beams, config.max_new_tokens, config.length_penalty
    dtype = next(model.parameters()).dtype
    check_token_ids(prompt_ids, mc.vocab_size)
    check_positions(mc, P, T_max, "max_new_tokens")
    check_memory(generation_bytes(mc, B * K, P, T_max, dtype.itemsize), device,
                 f"beam search over {B * K} beams of {P} + {T_max} tokens", "max_new_tokens or num_beams")

    extra = {"block_size": block_size, "max_sequences": B * K} if cache == "paged" else {}
    kv = make_cache(cache, mc, B, P + T_max, device=device, dtype=dtype, **extra)
    with autocast(device):  # prefill each prompt once; its K beams share the result
        logits = model(prompt_ids, attention_mask=prompt_mask, cache=kv, num_logits_to_keep=1).logits[:, -1]
    logits = logits.repeat_interleave(K, dim=0)  # (B*K, V)
    kv = kv.expand(K)
    blocks_in_use, blocks_if_contiguous = [], []
    if isinstance(kv, PagedKVCache):  # the K beams of a prompt share all its blocks
        blocks_in_use.append(kv.blocks_in_use())
        blocks_if_contiguous.append(kv.blocks_if_contiguous())
    mask = torch.cat([prompt_mask.repeat_interleave(K, dim=0),
                      torch.ones((B * K, T_max), dtype=prompt_mask.dtype, device=device)], dim=1)
    V = logits.shape[-1]
    C = 2 * K  # candidates kept per prompt: one EOS token, so at least K of them are unfinished
    in_top_k = torch.arange(C, device=device) < K  # only these may become finished hypotheses

    running_ids = torch.full((B, K, T_max), pad_id, dtype=torch.long, device=device)
    # Beam 0 starts at 0, the others at -1e9: at step 0 all K beams are the same prompt, and only
    # beam 0's continuations may be chosen (otherwise the K beams would be K copies of one sequence).
    running_scores = torch.zeros((B, K), device=device)
    running_scores[:, 1:] = NEG_LARGE
    done_ids = torch.full((B, K, T_max), pad_id, dtype=torch.long, device=device)
    done_scores = torch.full((B, K), NEG_LARGE, device=device)  # length-normalised
    done_lengths = torch.zeros((B, K), dtype=torch.long, device=device)
    is_done = torch.zeros((B, K), dtype=torch.bool, device=device)  # a real hypothesis in this slot
    may_improve = torch.ones((B, 1), dtype=torch.bool, device=device)  # the early-stopping test, per prompt
    batch_offset = torch.arange(B, device=device)[:, None] * K
    steps = 0
    for t in range(T_max):
        log_probs = F.log_softmax(logits.float(), dim=-1).view(B, K, V)
        total = (log_probs + running_scores[:, :, None]).view(B, K * V)  # score(beam + v)
        cand_scores, cand_index = torch.topk(total, C)  # (B, C), best first
        cand_parent, cand_token = cand_index // V, cand_index % V
        cand_ids = running_ids.gather(1, cand_parent[:, :, None].expand(B, C, T_max)).clone()
        cand_ids[:, :, t] = cand_token
        # transformers' stopping criteria: EOS, or the max_new_tokens-th token.
        stops = (cand_token == eos_id) | (t + 1 == T_max)

        # Next beams: the best K candidates that did not stop.
        alive_scores = cand_scores + stops.float() * NEG_LARGE
        keep = torch.topk(alive_scores, K).indices  # (B, K)
        running_ids = cand_ids.gather(1, keep[:, :, None].expand(B, K, T_max))
        running_scores = alive_scores.gather(1, keep)
        parents = (cand_parent.gather(1, keep) + batch_offset).view(-1)  # (B*K,) flat rows

        # Finished hypotheses: score / generated_length ** length_penalty, merged with the kept ones.
        new_done = stops & in_top_k
        normalised = cand_scores / ((t + 1) ** lp)
        if config.early_stopping is True:
            normalised = normalised + is_done.all(-1, keepdim=True).float() * NEG_LARGE  # already full
        normalised = normalised + (~may_improve).float() * NEG_LARGE  # this prompt is settled
        normalised = normalised + (~new_done).float() * NEG_LARGE  # still running: not a hypothesis
        merged_scores = torch.cat([done_scores, normalised], dim=1)  # (B, K + C)
        best = torch.topk(merged_scores, K).indices
        done_ids = torch.cat([done_ids, cand_ids], dim=1).gather(1, best[:, :, None].expand(B, K, T_max))
        done_scores = merged_scores.gather(1, best)
        new_lengths = torch.full((B, C), t + 1, device=device)
        done_lengths = torch.cat([done_lengths, new_lengths], dim=1).gather(1, best)
        is_done = torch.cat([is_done, new_done], dim=1).gather(1, best)

        # Stop? A prompt is settled when its best running beam, at the best length it could still
        # reach, cannot beat its worst kept hypothesis (only once all K slots hold one).
        steps = t + 1
        best_length = T_max if (config.early_stopping == "never" and lp > 0) else t + 1
        best_running = running_scores[:, :1] / (best_length**lp)
        worst_done = torch.where(is_done, done_scores.min(dim=1, keepdim=True).values, NEG_LARGE)
        may_improve = may_improve & (best_running > worst_done).any(dim=-1, keepdim=True)
        all_full = bool(is_done.all()) and config.early_stopping is True
        if not bool(may_improve.any()) or all_full or bool(stops.all()):
            break

        kv = reorder_cache(kv, parents)  # children share (paged) or copy (contiguous) their parent's K/V
        with autocast(device):
            out = model(running_ids[:, :, t].reshape(B * K, 1), attention_mask=mask[:, : P + t + 1], cache=kv)
        logits = out.logits[:, -1]
        if isinstance(kv, PagedKVCache):
            blocks_in_use.append(kv.blocks_in_use())
            blocks_if_contiguous.append(kv.blocks_if_contiguous())
        if on_step is not None:
            generated = running_ids[:, :, : t + 1].reshape(B * K, t + 1)
            on_step(t, kv, parents, torch.cat([prompt_ids.repeat_interleave(K, dim=0), generated], dim=1))

    R = config.num_return_sequences
    lengths = done_lengths[:, :R].reshape(-1)
    width = int(lengths.max())
    hypotheses = done_ids[:, :R, :width].reshape(B * R, width)
    sequences = torch.cat([prompt_ids.repeat_interleave(R, dim=0), hypotheses], dim=1)
    cow_copies = 0
    if isinstance(kv, PagedKVCache):
        cow_copies = kv.cow_copies
        kv.release()  # the hypotheses are token ids now; every block goes back to the pool
    return BeamSearchOutput(sequences=sequences, sequences_scores=done_scores[:, :R].reshape(-1),
                            completion_lengths=lengths, prompt_width=P, num_return_sequences=R, steps=steps,
                            blocks_in_use=blocks_in_use, blocks_if_contiguous=blocks_if_contiguous,
                            cow_copies=cow_copies, cache=kv)


def _greedy(model, prompt_ids, prompt_mask, config: BeamSearchConfig, cache: str,
            block_size: int) -> BeamSearchOutput:
    """num_beams = 1: greedy decoding; the score is the one beam search would give the hypothesis."""
    extra = {"block_size": block_size} if cache == "paged" else {}
    sampling = SamplingConfig.greedy(max_new_tokens=config.max_new_tokens, return_logprobs=True)
    out = generate(model, prompt_ids, sampling, attention_mask=prompt_mask, cache=cache, **extra)
    lengths = out.completion_lengths.clamp(min=1)
    scores = out.logprobs.sum(1) / lengths.float() ** config.length_penalty
    if isinstance(out.cache, PagedKVCache):
        out.cache.release()
    return BeamSearchOutput(sequences=out.sequences, sequences_scores=scores, completion_lengths=lengths,
                            prompt_width=prompt_ids.shape[1],
                            num_return_sequences=1, steps=out.timings["steps"], cache=out.cache)


def measure_block_sharing(model, prompts, num_beams=(2, 4, 8), block_sizes=(1, 4, 16), *, tokenizer=None,
                          max_new_tokens: int = 8, length_penalty: float = 1.0,
                          early_stopping: bool | str = False) -> list[dict]:
    """Beam search on the paged cache for every (num_beams, block_size): blocks in use against
    contiguous per-beam caches of the same lengths, peak and mean over the steps (`block_usage`).

    Returns one dict per run: num_beams, block_size, steps, peak/mean paged and contiguous blocks,
    the shares saved, copy-on-write copies, and whether the hypotheses equal those of block_size 1
    (the block size must not change the result).
    """
    rows = []
    for beams in num_beams:
        config = BeamSearchConfig(num_beams=beams, max_new_tokens=max_new_tokens, length_penalty=length_penalty,
                                  early_stopping=early_stopping)
        reference = None
        for block_size in block_sizes:
            out = beam_search(model, prompts, config, tokenizer=tokenizer, block_size=block_size)
            reference = out.sequences if reference is None else reference
            rows.append({"num_beams": beams, "block_size": block_size, "steps": out.steps, **out.block_usage(),
                         "cow_copies": out.cow_copies, "same hypotheses": torch.equal(out.sequences, reference)})
    return rows


__all__ = ["BEAM_CACHE_KINDS", "BeamSearchConfig", "BeamSearchOutput", "beam_search", "measure_block_sharing", "reorder_cache"]
