"""The usual sampler in fewer ops: temperature, top-k, top-p and the draw on top-k's survivors only.

`processors` teaches the chain stage by stage, each stage over the whole vocabulary: temperature (1 op),
top-k (4), top-p (a sort, a softmax, a cumsum and 4 more), then the draw (7). At the lab's size
(64 rows x 58 tokens) every op costs a dispatch, more than its arithmetic: in the third round's
measurements the warpers and the draw took about half of a compiled sampled step (0.46 of 0.91 ms;
bench/RESULTS.md, "Generation").

The shortcut: after top-k only k tokens can still be drawn, and `torch.topk` returns them already
sorted, which is the order top-p needs. So

    scores / T --topk(k)--> (N, k) survivors, most likely first
               --top-p on them--> a mask --log_softmax--> p --race with the survivors' Exp(1)--> token

Top-p on the survivors is the chain's rule (remove a token when the mass of itself and everything less
likely is <= 1 - p; always keep the `min_tokens_to_keep` most likely): the tokens top-k removed had
probability 0 there, so they add nothing to any sum. The race draws Exp(1) numbers for the whole
vocabulary, as `sample_next_token` does, and picks out the survivors' ones: the same random numbers,
so the same token for the same generator state, and the generator ends in the same state.

Equal to the chain up to float32 rounding, not bit for bit: the softmax sums k numbers instead of V
(the same terms, the zeros left out, in another order). So where a token's cumulative mass lies within
rounding of the top-p threshold, or two tokens' p / E within rounding of each other, the two can pick
differently: in tests/test_fused_sampler.py, 0 of 61,440 draws (6 settings) did. Ties with the k-th
score are exact: the chain keeps every token tied with it, topk keeps k, so when the (k+1)-th score equals the
k-th in some row the step falls back to the chain (the check reads one bool back to the host).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .config import SamplingConfig
from .processors import FILTER_VALUE, exponential_like, process_logits, sample_next_token


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
            return sample_next_token(process_logits(raw, None, config), config, generator, check_removed=False,
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
