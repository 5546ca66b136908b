"""Logits processors: how next-token scores become the distribution we sample from.

Each function takes `scores` of shape (batch, vocab), float32 (the logits at the last position), and
returns a new tensor; nothing is modified in place. A token that a filter removes gets -inf, so softmax
gives it probability exactly 0. The semantics match transformers' `generation/logits_process.py`
(`RepetitionPenaltyLogitsProcessor`, `NoRepeatNGramLogitsProcessor`, `TemperatureLogitsWarper`,
`TopKLogitsWarper`, `TopPLogitsWarper`, `MinPLogitsWarper`); tests/test_processors.py checks them
against those classes.

The order is the one `model.generate` uses (see `build_stages`):

    repetition penalty -> no-repeat-ngram -> [only when sampling] temperature -> top-k -> top-p -> min-p

so min-p sees the tempered distribution, and top-p renormalises over what top-k left.

Padding. `input_ids` is the whole context (prompt + tokens generated so far), (batch, seq), possibly
left-padded. How pad tokens are treated:
- repetition penalty: pass `attention_mask` to skip positions where it is 0. That is what HF's generate
  does (it hands `RepetitionPenaltyLogitsProcessor` the left-padding length as `prompt_ignore_length`);
  without a mask, pad ids count as "seen", like the bare HF processor.
- no-repeat-ngram: pad tokens are included, exactly as in HF (which has no mask here). With left padding
  and n >= 2 this never changes the result, as long as the pad id is not used as a real token: the
  current suffix is real tokens, so an n-gram containing pads can never match it. With n = 1 the pad id
  itself is banned, which is harmless (tests/test_processors.py::test_no_repeat_ngram_ignores_left_padding).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from rlhf_lab.sampling.config import SamplingConfig
from rlhf_lab.util.validation import check_number

FILTER_VALUE = -float("inf")

# A stage maps (scores (batch, vocab), input_ids (batch, seq)) -> scores (batch, vocab).
Stage = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


# ----------------------------------------------------------------------------------------------------
# Processors that look at the context (applied in greedy and sampling mode)


def apply_repetition_penalty(
    scores: torch.Tensor,
    input_ids: torch.Tensor,
    penalty: float,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Penalise every token id that already occurs in the context (Keskar et al. 2019, CTRL).

    CTRL divides the logit by the penalty; HF's sign-aware form multiplies negative logits instead,
    so that a penalty > 1 always lowers the token's probability. Each id is penalised once, however
    many times it occurs.

    Args:
        scores: (batch, vocab) next-token logits.
        input_ids: (batch, seq) the context, prompt included.
        penalty: > 1 discourages repeats, < 1 encourages them, 1 is a no-op.
        attention_mask: optional (batch, seq), 0 marks padding that should not count as "seen".
    Returns:
        (batch, vocab) penalised scores.
    """
    vocab_size = scores.shape[-1]
    # Ids that must not count (padding, or ids beyond the output vocab) go to a spare column we drop.
    ids = input_ids.clamp(max=vocab_size)
    if attention_mask is not None:
        ids = ids.masked_fill(attention_mask == 0, vocab_size)
    seen = torch.zeros(scores.shape[0], vocab_size + 1, dtype=torch.bool, device=scores.device)
    seen.scatter_(1, ids, True)
    seen = seen[:, :vocab_size]
    # s' = s * penalty if s < 0 else s / penalty
    penalised = torch.where(scores < 0, scores * penalty, scores / penalty)
    return torch.where(seen, penalised, scores)


def apply_no_repeat_ngram(scores: torch.Tensor, input_ids: torch.Tensor, n: int) -> torch.Tensor:
    """Ban every token that would complete an n-gram already present in the context.

    The next token t completes the n-gram (last n-1 tokens, t). It is banned if some earlier window
    of n tokens starts with those same n-1 tokens and ends in t. With n = 1 every token seen so far
    is banned. Pad tokens are treated like any other id (see the module docstring).

    Args:
        scores: (batch, vocab) next-token logits.
        input_ids: (batch, seq) the context, prompt included.
        n: n-gram size, >= 1.
    Returns:
        (batch, vocab) scores with banned tokens at -inf.
    """
    check_number("no_repeat_ngram_size", n, low=1, integer=True)  # 0 means "off": skip the call instead
    seq_len = input_ids.shape[1]
    if seq_len < n:  # no complete n-gram yet
        return scores
    vocab_size = scores.shape[-1]
    suffix = input_ids[:, seq_len - (n - 1):]  # (batch, n-1): the n-gram the next token would complete
    windows = input_ids.unfold(1, n, 1)  # (batch, seq-n+1, n): every n-gram in the context
    # The last window ends at the last token, so its first n-1 tokens are never the current suffix:
    # a suffix cannot ban the token that follows itself in the future.
    matches = (windows[..., :-1] == suffix[:, None, :]).all(dim=-1)  # (batch, seq-n+1)
    # Non-matching windows (and ids beyond the output vocab) write into a spare column we drop.
    banned_ids = torch.where(matches, windows[..., -1].clamp(max=vocab_size), vocab_size)
    banned = torch.zeros(scores.shape[0], vocab_size + 1, dtype=torch.bool, device=scores.device)
    banned.scatter_(1, banned_ids, True)
    return scores.masked_fill(banned[:, :vocab_size], FILTER_VALUE)


# ----------------------------------------------------------------------------------------------------
# Warpers (applied only when sampling)


def apply_temperature(scores: torch.Tensor, temperature: float) -> torch.Tensor:
    """Scale logits: p_i = softmax(s / T)_i. T < 1 sharpens, T > 1 flattens; T must be > 0.

    scores: (batch, vocab) -> (batch, vocab).
    """
    check_number("temperature", temperature, low=0, low_open=True)  # T -> 0 is greedy: use do_sample=False
    return scores / temperature


def apply_top_k(scores: torch.Tensor, k: int, min_tokens_to_keep: int = 1) -> torch.Tensor:
    """Keep tokens scoring at least the k-th largest score (ties with it are kept too); k = 0 is a no-op.

    The effective k is max(k, min_tokens_to_keep), capped at the vocab size.
    scores: (batch, vocab) -> (batch, vocab).
    """
    if k == 0:
        return scores
    k = min(max(k, min_tokens_to_keep), scores.shape[-1])
    kth_largest = torch.topk(scores, k, dim=-1).values[..., -1:]  # (batch, 1)
    return scores.masked_fill(scores < kth_largest, FILTER_VALUE)


def apply_top_p(scores: torch.Tensor, p: float, min_tokens_to_keep: int = 1) -> torch.Tensor:
    """Nucleus filtering (Holtzman et al. 2020): keep the smallest set of top tokens with mass >= p.

    Sorted from least to most likely, a token is removed when the mass of itself and everything less
    likely is <= 1 - p. So the token whose probability crosses the threshold is kept, and for
    probs [0.3, 0.1, 0.1, 0.5] with p = 0.8 the kept set is {0.5, 0.3}. The min_tokens_to_keep most
    likely tokens are always kept. p = 1 is a no-op.
    scores: (batch, vocab) -> (batch, vocab).
    """
    if p >= 1.0:
        # Skipping matters: with p = 1 the rule below would still drop tokens whose probability
        # underflows to exactly 0 in float32. HF skips the warper at 1.0 as well.
        return scores
    sorted_scores, sorted_ids = torch.sort(scores, descending=False)  # least likely first
    # mass_at_or_below[j] = sum_{i <= j} p_(i) over the ascending order
    mass_at_or_below = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
    remove_sorted = mass_at_or_below <= (1 - p)
    remove_sorted[..., -min_tokens_to_keep:] = False  # the most likely tokens sit at the end
    remove = remove_sorted.scatter(1, sorted_ids, remove_sorted)  # back to vocab order
    return scores.masked_fill(remove, FILTER_VALUE)


def apply_min_p(scores: torch.Tensor, min_p: float, min_tokens_to_keep: int = 1) -> torch.Tensor:
    """Min-p filtering (Nguyen et al. 2024): remove tokens with p_i < min_p * max_j p_j.

    The bar scales with the model's confidence: a peaked distribution keeps few tokens, a flat one
    keeps many. The min_tokens_to_keep most likely tokens are always kept. min_p = 0 is a no-op.
    scores: (batch, vocab) -> (batch, vocab).
    """
    if min_p == 0:
        return scores
    probs = scores.softmax(dim=-1)
    threshold = min_p * probs.amax(dim=-1, keepdim=True)  # (batch, 1)
    remove = probs < threshold
    top_ids = torch.topk(probs, min(min_tokens_to_keep, probs.shape[-1]), dim=-1).indices
    remove.scatter_(1, top_ids, False)
    return scores.masked_fill(remove, FILTER_VALUE)


# ----------------------------------------------------------------------------------------------------
# The chain


def build_stages(config: SamplingConfig,
                 attention_mask: torch.Tensor | None = None) -> list[tuple[str, Stage]]:
    """The active processing stages, in `model.generate`'s order, as (name, fn(scores, input_ids)).

    Stages that would be no-ops (penalty 1, top_k 0, top_p 1, min_p 0, temperature 1) are left out,
    as HF leaves them out.
    """
    c, keep = config, config.min_tokens_to_keep
    stages: list[tuple[str, Stage]] = []
    if c.repetition_penalty != 1.0:
        stages.append(("repetition_penalty",
                       lambda s, ids: apply_repetition_penalty(s, ids, c.repetition_penalty, attention_mask)))
    if c.no_repeat_ngram_size > 0:
        stages.append(("no_repeat_ngram",
                       lambda s, ids: apply_no_repeat_ngram(s, ids, c.no_repeat_ngram_size)))
    if not c.do_sample:  # greedy stops here, as in HF: the warpers below never move the argmax
        return stages
    if c.temperature != 1.0:
        stages.append(("temperature", lambda s, ids: apply_temperature(s, c.temperature)))
    if c.top_k != 0:
        stages.append(("top_k", lambda s, ids: apply_top_k(s, c.top_k, keep)))
    if c.top_p < 1.0:
        stages.append(("top_p", lambda s, ids: apply_top_p(s, c.top_p, keep)))
    if c.min_p > 0.0:
        stages.append(("min_p", lambda s, ids: apply_min_p(s, c.min_p, keep)))
    return stages


def process_logits(
    scores: torch.Tensor,
    input_ids: torch.Tensor,
    config: SamplingConfig,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Run the whole chain of `config` on next-token scores.

    Args:
        scores: (batch, vocab) float32 logits at the last position.
        input_ids: (batch, seq) context so far (prompt + generated tokens).
        config: which processors are active and their settings.
        attention_mask: optional (batch, seq); 0 = padding, ignored by the repetition penalty.
    Returns:
        (batch, vocab) processed scores; removed tokens are -inf. Softmax of this is the distribution
        `sample_next_token` draws from.
    """
    for _, stage in build_stages(config, attention_mask):
        scores = stage(scores, input_ids)
    return scores


def make_generator(config: SamplingConfig, device: torch.device | str = "cpu") -> torch.Generator | None:
    """A torch.Generator seeded with config.seed, or None (global RNG) when seed is None."""
    if config.seed is None:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(config.seed)
    return generator


def sample_next_token(
    scores: torch.Tensor,
    config: SamplingConfig,
    generator: torch.Generator | None = None,
    *,
    check_removed: bool = True,
    return_logprobs: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Pick one token per row from already processed scores (the output of `process_logits`).

    Greedy: argmax. Sampling: one draw from softmax(scores) per row, `torch.multinomial`.

    Args:
        scores: (batch, vocab) processed scores; cast to float32 here.
        config: only `do_sample` is read.
        generator: RNG for the draw (see `make_generator`); None uses the global RNG.
        check_removed: raise ValueError when a row has no token left (all -inf). It reads the result
            back to the host, a sync per call; `generate` turns it off unless no-repeat-ngram, the only
            processor that can remove every token, is on.
        return_logprobs: False skips gathering the log-probs (then the second result is None).
    Returns:
        tokens: (batch,) int64 chosen ids.
        logprobs: (batch,) float32, log softmax(scores) at the chosen id: the log-probability under the
            distribution the token was actually drawn from (after temperature and filters).
    """
    scores = scores.float()
    if check_removed and torch.isneginf(scores).all(dim=-1).any():
        raise ValueError(
            "every token of some row was removed (all scores are -inf); no_repeat_ngram_size can ban the "
            "whole vocabulary on long sequences over a small vocab: lower it or set it to 0"
        )
    logprobs_all = F.log_softmax(scores, dim=-1)  # (batch, vocab)
    if config.do_sample:
        tokens = torch.multinomial(logprobs_all.exp(), 1, generator=generator).squeeze(1)  # (batch,)
    else:
        tokens = scores.argmax(dim=-1)  # (batch,)
    if not return_logprobs:
        return tokens, None
    return tokens, logprobs_all.gather(1, tokens[:, None]).squeeze(1)


# ----------------------------------------------------------------------------------------------------
# For the notebook widget


def explain_filters(
    scores: torch.Tensor,
    input_ids: torch.Tensor | None,
    config: SamplingConfig,
    attention_mask: torch.Tensor | None = None,
) -> dict:
    """Run the chain stage by stage and record what each stage did, for a kept-vs-removed bar chart.

    Args:
        scores: (vocab,) or (batch, vocab) raw next-token logits.
        input_ids: (seq,) or (batch, seq) context; may be None when no context processor is active.
        config: the sampling settings to explain.
        attention_mask: optional, as in `process_logits`.
    Returns a dict (tensors have the leading shape of `scores`, i.e. (vocab,) or (batch, vocab)):
        stages: names of the active stages, in order.
        scores_raw, scores_final: logits before and after the chain.
        probs_raw: softmax of the raw logits.
        probs_final: the distribution sampled from (zeros where removed).
        probs_by_stage: {stage: probabilities right after that stage}.
        kept_by_stage: {stage: bool mask of tokens still allowed after that stage}.
        kept: bool mask after the whole chain.
        removed_by: for each token, the name of the first stage that removed it, None if it is kept
            ("input" if its raw logit was already -inf). A list (vocab,) or a list of lists (batch, vocab).
    """
    single = scores.dim() == 1
    scores_2d = scores[None, :] if single else scores
    if input_ids is None:
        input_ids_2d = torch.zeros(scores_2d.shape[0], 0, dtype=torch.long, device=scores.device)
    else:
        input_ids_2d = input_ids[None, :] if input_ids.dim() == 1 else input_ids
    mask_2d = attention_mask
    if attention_mask is not None and attention_mask.dim() == 1:
        mask_2d = attention_mask[None, :]

    scores_2d = scores_2d.float()
    removed_at = torch.full(scores_2d.shape, -1, dtype=torch.long)  # index into stage_names, -1 = kept
    stage_names = ["input"]
    alive = ~torch.isneginf(scores_2d)
    removed_at[~alive.cpu()] = 0
    probs_by_stage, kept_by_stage = {}, {}
    current = scores_2d
    for name, stage in build_stages(config, mask_2d):
        current = stage(current, input_ids_2d)
        still_alive = ~torch.isneginf(current)
        stage_names.append(name)
        removed_at[(alive & ~still_alive).cpu()] = len(stage_names) - 1
        alive = still_alive
        probs_by_stage[name] = current.softmax(dim=-1)
        kept_by_stage[name] = still_alive

    removed_by = [[None if i < 0 else stage_names[i] for i in row] for row in removed_at.tolist()]

    def unbatch(x):
        return x[0] if single else x

    return {
        "stages": stage_names[1:],
        "scores_raw": unbatch(scores_2d),
        "scores_final": unbatch(current),
        "probs_raw": unbatch(scores_2d.softmax(dim=-1)),
        "probs_final": unbatch(current.softmax(dim=-1)),
        "probs_by_stage": {k: unbatch(v) for k, v in probs_by_stage.items()},
        "kept_by_stage": {k: unbatch(v) for k, v in kept_by_stage.items()},
        "kept": unbatch(alive),
        "removed_by": unbatch(removed_by),
    }
