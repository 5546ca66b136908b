"""The next-token draw in fewer ops: what `generate` runs unless `reference_paths()` is on.

processors.py holds the plain definitions: the processor chain (`process_logits`, one stage at a time
over the whole vocabulary) and `sample_next_token` (`torch.multinomial`). One place chooses between
them and this file, by `rlhf_lab.util.fast_paths`: `generate.token_chooser`, which makes the function
each step of `generate` calls to pick its tokens. Beam search draws nothing (its greedy case is
`generate`'s). What changes against the plain definition, and the test that holds each equal
(tests/test_fast_paths.py unless named):

- The draw is the exponential race: token = argmax_i p_i / E_i with E_i ~ Exp(1) independent. E_i / p_i
  is exponential with rate p_i, and the smallest of such clocks is clock i with probability p_i / sum p.
  `torch.multinomial(p, 1)` draws one sample this very way (the same random numbers, the same token for
  the same generator state); the race skips its input checks, each a read back to the host
  (`test_the_race_draws_multinomials_tokens`, `test_the_race_and_multinomial_sample_the_same_distribution`).
- The race's Exp(1) numbers come from `exponential_like`: float64 `uniform_` and one vectorised
  -log1p(-u), which on the CPU is the float32 numbers `exponential_` draws element by element, bit for
  bit; `uniform_gives_exponential` checks that once per process, and where it fails `exponential_` runs
  (tests/test_fused_sampler.py, `test_exponential_like_draws_what_exponential_draws`).
- Temperature, top-k and top-p alone (the usual sampler, no context processor, no min-p) run on top-k's
  survivors only (`sample_fused`): `torch.topk` returns them sorted, the order top-p needs, so

      scores / T --topk(k)--> (N, k) survivors, most likely first
                 --top-p on them--> a mask --log_softmax--> p --race with the survivors' Exp(1)--> token

  Top-p on the survivors is the chain's rule (remove a token when the mass of itself and everything
  less likely is <= 1 - p; always keep the `min_tokens_to_keep` most likely): the tokens top-k removed
  had probability 0 there, so they add nothing to any sum. The race draws Exp(1) numbers for the whole
  vocabulary, as the plain draw does, and picks out the survivors' ones: the same random numbers, the
  generator left in the same state. Equal to the chain up to float32 rounding, not bit for bit: the
  softmax sums k numbers instead of V (the same terms, the zeros left out, in another order), so where
  a token's cumulative mass lies within rounding of the top-p threshold, or two tokens' p / E within
  rounding of each other, the two can pick differently (tests/test_fused_sampler.py counts such draws:
  none in 61,440). Ties with the k-th score are exact: the chain keeps every token tied with it, topk
  keeps k, so when the (k+1)-th score equals the k-th in some row the step runs the chain (the check
  reads one bool back to the host).
- The stages are built once per call unless the repetition penalty reads the growing mask, and greedy
  decoding that needs no log-probs takes the argmax alone (`test_fast_token_chooser_equals_the_plain_one`).

Whole seeded generations, fast against plain (model and draw): `test_generate_fast_equals_plain`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

from .config import SamplingConfig
from .processors import FILTER_VALUE, build_stages, process_logits

# (logits (N, V), ids (N, L), attention_mask (N, L), width, generator) -> (tokens (N,), log-probs (N,) | None)
Chooser = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int, torch.Generator | None],
                   tuple[torch.Tensor, torch.Tensor | None]]


def token_chooser(config: SamplingConfig, check_removed: bool, return_logprobs: bool) -> Chooser:
    """`generate.token_chooser` (the processors, then the draw) in fewer ops: see the module docstring."""
    fused = fused_sampler_applies(config)
    stages = [] if fused else build_stages(config)  # the fused sampler applies its warpers itself
    reads_mask = config.repetition_penalty != 1.0  # only the repetition penalty reads the growing mask

    def choose(logits, ids, attention_mask, width, generator):
        scores = logits
        for _, stage in build_stages(config, attention_mask[:, :width]) if reads_mask else stages:
            scores = stage(scores, ids[:, :width])
        if fused:
            return sample_fused(scores, config, generator, return_logprobs=return_logprobs)
        if config.do_sample or return_logprobs:
            return sample_by_race(scores, config, generator, check_removed=check_removed,
                                  return_logprobs=return_logprobs)
        return scores.argmax(dim=-1), None  # plain greedy: the argmax is all that is needed

    return choose


def sample_by_race(
    scores: torch.Tensor,
    config: SamplingConfig,
    generator: torch.Generator | None = None,
    *,
    check_removed: bool = True,
    return_logprobs: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`sample_next_token` (same arguments, same results), the draw by the exponential race.

    scores (batch, vocab) -> tokens (batch,) int64, log-probs (batch,) float32 or None.
    """
    scores = scores.float()
    if check_removed and torch.isneginf(scores).all(dim=-1).any():
        raise ValueError(
            "every token of some row was removed (all scores are -inf); no_repeat_ngram_size can ban the "
            "whole vocabulary on long sequences over a small vocab: lower it or set it to 0"
        )
    if not config.do_sample:
        tokens = scores.argmax(dim=-1)
        if not return_logprobs:
            return tokens, None
        return tokens, F.log_softmax(scores, dim=-1).gather(1, tokens[:, None]).squeeze(1)
    logprobs_all = F.log_softmax(scores, dim=-1)  # (batch, vocab)
    probs = logprobs_all.exp()  # softmax(scores), the distribution drawn from
    race = exponential_like(probs, generator)  # the numbers empty_like(probs).exponential_() draws
    tokens = (probs / race).argmax(dim=-1, keepdim=True)  # (batch, 1): the first clock to ring
    if not return_logprobs:
        return tokens.squeeze(1), None
    return tokens.squeeze(1), logprobs_all.gather(1, tokens).squeeze(1)


@functools.cache
def uniform_gives_exponential() -> bool:
    """Whether this torch build's CPU `exponential_` is -log(1 - u) of one float64 `uniform_` number per
    element (checked on 4096 draws of a fixed seed: the same float32 numbers, the generator left in the
    same state). Checked once per process; `exponential_like` takes the faster route only if so."""
    one, other = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    expected = torch.empty(4096).exponential_(1.0, generator=one)
    uniforms = torch.empty(4096, dtype=torch.float64).uniform_(generator=other)
    return torch.equal(uniforms.neg().log1p().neg().float(), expected) and \
        torch.equal(one.get_state(), other.get_state())


def exponential_like(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Exp(1) numbers shaped like `probs`: the very ones `torch.empty_like(probs).exponential_(1.0,
    generator=generator)` draws, in the same order, leaving the generator in the same state.

    On the CPU exponential_ turns one float64 uniform u per element into -log(1 - u) one element at a
    time; drawing those uniforms with `uniform_` in float64 and taking -log1p(-u) over the whole tensor
    gives the same float32 numbers bit for bit, in vectorised ops (bench/exponential_draw.py).
    That equality is a property of torch's kernels, not a promise, so `uniform_gives_exponential` checks
    it once per process; where it fails, on other devices and other dtypes, exponential_ runs itself.
    """
    if probs.device.type == "cpu" and probs.dtype == torch.float32 and uniform_gives_exponential():
        uniforms = torch.empty(probs.shape, dtype=torch.float64).uniform_(generator=generator)
        return uniforms.neg_().log1p_().neg_().float()
    return torch.empty_like(probs).exponential_(1.0, generator=generator)


def fused_sampler_applies(config: SamplingConfig) -> bool:
    """True when `config` samples through warpers only (temperature, top-k, top-p) with top-k or top-p on:
    no context processors and no min-p, which need the whole vocabulary."""
    return (config.do_sample and config.repetition_penalty == 1.0 and config.no_repeat_ngram_size == 0
            and config.min_p == 0.0 and (config.top_k != 0 or config.top_p < 1.0))


def sample_fused(scores: torch.Tensor, config: SamplingConfig, generator: torch.Generator | None = None, *,
                 return_logprobs: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """What `process_logits` then `sample_next_token` return for raw next-token logits (batch, vocab),
    computed on top-k's survivors. Only for a config where `fused_sampler_applies`.

    Returns tokens (batch,) int64 and, unless return_logprobs is False, their log-probs (batch,) float32
    under the distribution drawn from.
    """
    raw = scores.float()
    scores = raw / config.temperature if config.temperature != 1.0 else raw  # as apply_temperature
    vocab, keep = scores.shape[-1], config.min_tokens_to_keep
    k = min(max(config.top_k, keep), vocab) if config.top_k else vocab
    if k < vocab:
        values, ids = torch.topk(scores, k + 1, dim=-1)  # one more, to see ties with the k-th
        if bool((values[:, k] == values[:, k - 1]).any()):  # the chain keeps every tied token: run it
            return sample_by_race(process_logits(raw, None, config), config, generator, check_removed=False,
                                  return_logprobs=return_logprobs)
        values, ids = values[:, :k], ids[:, :k]
    else:
        values, ids = torch.sort(scores, dim=-1, descending=True)
    if config.top_p < 1.0:
        # mass at or below each survivor, summed from the least likely up as apply_top_p sums it
        mass_at_or_below = values.softmax(dim=-1).flip(-1).cumsum(dim=-1).flip(-1)
        remove = mass_at_or_below <= (1 - config.top_p)
        remove[:, :keep] = False  # the most likely tokens sit first
        values = values.masked_fill(remove, FILTER_VALUE)
    logprobs = F.log_softmax(values, dim=-1)  # (batch, k) over the survivors
    race = exponential_like(scores, generator).gather(1, ids)  # the whole vocabulary's draw, as the chain's
    choice = (logprobs.exp() / race).argmax(dim=-1, keepdim=True)  # (batch, 1) position among survivors
    tokens = ids.gather(1, choice).squeeze(1)
    return tokens, logprobs.gather(1, choice).squeeze(1) if return_logprobs else None
