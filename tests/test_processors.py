"""Logits processors and SamplingConfig: HF's documented cases, then parity with transformers' classes.

Parity means: the same tokens are removed (same -inf pattern) and the surviving scores agree to 1e-6.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from rlhf_lab.sampling import (
    SamplingConfig,
    apply_min_p,
    apply_no_repeat_ngram,
    apply_repetition_penalty,
    apply_temperature,
    apply_top_k,
    apply_top_p,
    explain_filters,
    make_generator,
    process_logits,
    sample_next_token,
)

VOCAB = 40


def random_case(seed: int, batch: int = 4, vocab: int = VOCAB, seq: int = 12, spread: float = 3.0):
    """Random logits plus a context drawn from a small id range, so that repeats and n-grams occur."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(batch, vocab, generator=g) * spread
    input_ids = torch.randint(0, 6, (batch, seq), generator=g)
    return scores, input_ids


def assert_same_filtering(ours: torch.Tensor, theirs: torch.Tensor, what: str = "") -> None:
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs)), f"{what}: different tokens removed"
    finite = ~torch.isinf(theirs)
    max_diff = (ours[finite] - theirs[finite]).abs().max().item() if finite.any() else 0.0
    assert max_diff <= 1e-6, f"{what}: surviving scores differ by {max_diff}"


# ----------------------------------------------------------------------------------------------------
# HF's own test cases (transformers tests/generation/test_logits_process.py), on our functions


def test_top_p_documented_case():
    probs = torch.tensor([[0.3, 0.1, 0.1, 0.5], [0.15, 0.3, 0.3, 0.25]])
    kept = apply_top_p(probs.log(), 0.8).exp()
    expected = torch.tensor([[0.3, 0.0, 0.0, 0.5], [0.0, 0.3, 0.3, 0.25]])
    torch.testing.assert_close(kept, expected, atol=1e-6, rtol=0)


def test_top_p_exact_boundary():
    """Mass at or below a token exactly 1 - p: the token goes (<=), leaving a kept mass of exactly p."""
    probs = torch.tensor([[0.125, 0.125, 0.25, 0.5]])  # dyadic, so the cumulative sums are exact
    ours = apply_top_p(probs.log(), 0.75)
    assert (~torch.isinf(ours)).tolist() == [[False, False, True, True]]
    assert_same_filtering(ours, TopPLogitsWarper(0.75)(None, probs.log()), "top_p boundary")


def test_top_p_min_tokens_to_keep():
    ramp = (torch.arange(10.0) - 5).repeat(2, 1)
    ramp[1] *= 100.0  # row 1: one token holds ~all the mass, but 2 must stay
    kept = ~torch.isinf(apply_top_p(ramp, 0.9, min_tokens_to_keep=2))
    assert kept.sum(dim=-1).tolist() == [3, 2]  # row 0: top-3 softmax mass of a ramp is ~0.95 >= 0.9
    assert kept[1, -2:].all()


def test_top_k_ramp_and_min_tokens():
    ramp = torch.arange(10.0).repeat(2, 1)
    ramp[1, :5] = ramp[1, 5:] + 10  # row 1: the largest values are now at ids 2, 3, 4
    kept = ~torch.isinf(apply_top_k(ramp, 3))
    assert kept[0].nonzero().flatten().tolist() == [7, 8, 9]
    assert kept[1].nonzero().flatten().tolist() == [2, 3, 4]
    # min_tokens_to_keep overrides a smaller k
    kept = ~torch.isinf(apply_top_k(torch.arange(5.0).repeat(2, 1), 1, min_tokens_to_keep=3))
    assert kept.sum(dim=-1).tolist() == [3, 3]
    # uniform scores: every token ties with the k-th, so nothing is removed
    assert not torch.isinf(apply_top_k(torch.zeros(2, 5), 1)).any()


def test_top_k_keeps_ties():
    scores = torch.tensor([[1.0, 2.0, 2.0, 2.0, 0.0]])
    kept = ~torch.isinf(apply_top_k(scores, 2))
    assert kept.tolist() == [[False, True, True, True, False]], "tokens tied with the k-th score must stay"


def test_min_p_documented_case():
    probs = torch.tensor([[0.9, 0.0274, 0.047, 0.0274], [0.15, 0.3, 0.3, 0.25], [0.97, 0.01, 0.01, 0.01]])
    filtered = apply_min_p(probs.log(), 0.05).exp()
    # bar = 0.05 * max prob: 0.045 (keeps 0.047, drops 0.0274), 0.015 (keeps all), 0.0485 (keeps only 0.97)
    expected = torch.tensor([[0.9, 0.0, 0.047, 0.0], [0.15, 0.3, 0.3, 0.25], [0.97, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(filtered, expected, atol=1e-6, rtol=0)


def test_min_p_exact_boundary():
    """A token with probability exactly min_p * max prob is kept (the rule is a strict <)."""
    scores = torch.tensor([[0.0, 0.0, torch.tensor(0.5).log().item(), -3.0]])  # p2 = 0.5 * p0
    ours = apply_min_p(scores, 0.5)
    assert (~torch.isinf(ours)).tolist() == [[True, True, True, False]]
    assert_same_filtering(ours, MinPLogitsWarper(0.5)(None, scores.clone()), "min_p boundary")


def test_min_p_min_tokens_to_keep():
    ramp = (torch.arange(10.0) - 5).repeat(2, 1)
    ramp[1] *= 100.0
    kept = ~torch.isinf(apply_min_p(ramp, 0.9, min_tokens_to_keep=2))
    assert kept.sum(dim=-1).tolist() == [2, 2]


def test_repetition_penalty_documented_case():
    input_ids = torch.tensor([[0, 1], [5, 0]])
    scores = torch.full((2, 10), 1 / 10)
    scores[0, 0] = -1 / 10
    scores[1, 5] = 4 / 10
    out = apply_repetition_penalty(scores, input_ids, 2.0)
    assert out[0, 0].item() == pytest.approx(-1 / 10 * 2)  # negative logit: multiplied
    assert out[0, 1].item() == pytest.approx(1 / 10 / 2)  # positive logit: divided
    assert out[1, 0].item() == pytest.approx(1 / 10 / 2)
    assert out[1, 5].item() == pytest.approx(4 / 10 / 2)
    assert out[0, 2].item() == pytest.approx(1 / 10), "tokens not in the context must be untouched"


def test_repetition_penalty_applied_once_per_id():
    scores = torch.tensor([[2.0, -2.0, 1.0]])
    out = apply_repetition_penalty(scores, torch.tensor([[0, 0, 0, 1, 1]]), 2.0)
    assert out.tolist() == [[1.0, -4.0, 1.0]]


def test_no_repeat_ngram_documented_case():
    input_ids = torch.tensor([[1, 1, 2, 1], [0, 1, 0, 1]])
    scores = torch.full((2, 3), 1 / 3)
    banned2 = torch.isinf(apply_no_repeat_ngram(scores, input_ids, 2)).tolist()
    banned3 = torch.isinf(apply_no_repeat_ngram(scores, input_ids, 3)).tolist()
    assert banned2 == [[False, True, True], [True, False, False]]
    assert banned3 == [[False, False, False], [True, False, False]]


def test_no_repeat_ngram_short_context_and_unigram():
    scores = torch.zeros(1, 5)
    assert torch.equal(apply_no_repeat_ngram(scores, torch.tensor([[3, 3]]), 3), scores)  # no 3-gram yet
    banned = torch.isinf(apply_no_repeat_ngram(scores, torch.tensor([[3, 1, 3]]), 1))
    assert banned.tolist() == [[False, True, False, True, False]]  # n = 1 bans every id seen


def test_no_repeat_ngram_ignores_left_padding():
    """Left pads (id 0, never a real token here) cannot change the banned set for n >= 2: the suffix has no
    pads. With n = 1 the only difference is that the pad id itself counts as seen and is banned."""
    pad = 0
    g = torch.Generator().manual_seed(0)
    for n in (1, 2, 3):
        for real_len in (1, 2, 3, 8):
            real = torch.randint(1, 5, (1, real_len), generator=g)
            padded = torch.cat([torch.full((1, 5), pad), real], dim=1)
            scores = torch.randn(1, 8, generator=g)
            expected = apply_no_repeat_ngram(scores, real, n)
            if n == 1:
                expected[:, pad] = -float("inf")
            assert torch.equal(apply_no_repeat_ngram(scores, padded, n), expected), (n, real_len)


# ----------------------------------------------------------------------------------------------------
# Each processor against transformers' class, on random logits


@pytest.mark.parametrize("seed", range(4))
def test_each_processor_matches_transformers(seed):
    scores, input_ids = random_case(seed)
    for t in (0.3, 0.7, 1.0, 1.9):
        assert_same_filtering(
            apply_temperature(scores, t),
            TemperatureLogitsWarper(t)(input_ids, scores.clone()),
            f"temperature {t}",
        )
    for keep in (1, 3):
        for k in (1, 2, 5, 17, VOCAB, VOCAB + 5):
            theirs = TopKLogitsWarper(k, min_tokens_to_keep=keep)(input_ids, scores.clone())
            assert_same_filtering(apply_top_k(scores, k, keep), theirs, f"top_k {k} keep {keep}")
        for p in (0.05, 0.3, 0.5, 0.8, 0.9, 0.99):
            theirs = TopPLogitsWarper(p, min_tokens_to_keep=keep)(input_ids, scores.clone())
            assert_same_filtering(apply_top_p(scores, p, keep), theirs, f"top_p {p} keep {keep}")
        for m in (0.01, 0.1, 0.3, 0.7, 0.99):
            theirs = MinPLogitsWarper(m, min_tokens_to_keep=keep)(input_ids, scores.clone())
            assert_same_filtering(apply_min_p(scores, m, keep), theirs, f"min_p {m} keep {keep}")
    for penalty in (0.5, 1.2, 2.0):
        theirs = RepetitionPenaltyLogitsProcessor(penalty)(input_ids, scores.clone())
        assert_same_filtering(apply_repetition_penalty(scores, input_ids, penalty), theirs,
                              f"penalty {penalty}")
    for n in (1, 2, 3, 4):
        theirs = NoRepeatNGramLogitsProcessor(n)(input_ids, scores.clone())
        ours = apply_no_repeat_ngram(scores, input_ids, n)
        assert_same_filtering(ours, theirs, f"ngram {n}")
        if n == 2:
            assert torch.isinf(ours).any(), "test data should make the 2-gram ban bite"


def test_processors_do_not_modify_inputs():
    scores, input_ids = random_case(0)
    before = scores.clone()
    config = SamplingConfig(temperature=0.7, top_k=10, top_p=0.8, min_p=0.05, repetition_penalty=1.3,
                            no_repeat_ngram_size=2)
    process_logits(scores, input_ids, config)
    assert torch.equal(scores, before)


def test_repetition_penalty_mask_matches_generate_prompt_ignore_length():
    """With an attention mask, left pads are not 'seen': what generate() does via prompt_ignore_length."""
    scores, input_ids = random_case(1, batch=3)
    pad_lengths = torch.tensor([0, 3, 7])
    attention_mask = (torch.arange(input_ids.shape[1])[None, :] >= pad_lengths[:, None]).long()
    input_ids = input_ids.masked_fill(attention_mask == 0, 0)
    scores[:, 0] = 2.5  # make the pad id's logit visible to the penalty
    theirs = RepetitionPenaltyLogitsProcessor(
        1.5, prompt_ignore_length=pad_lengths)(input_ids, scores.clone())
    ours = apply_repetition_penalty(scores, input_ids, 1.5, attention_mask=attention_mask)
    assert_same_filtering(ours, theirs, "masked repetition penalty")
    unmasked = apply_repetition_penalty(scores, input_ids, 1.5)
    assert unmasked[1, 0] == pytest.approx(2.5 / 1.5), "without a mask the pad id counts as seen"


# ----------------------------------------------------------------------------------------------------
# The whole chain against a LogitsProcessorList in generate()'s order


def hf_chain(config: SamplingConfig) -> LogitsProcessorList:
    chain = LogitsProcessorList()
    if config.repetition_penalty != 1.0:
        chain.append(RepetitionPenaltyLogitsProcessor(config.repetition_penalty))
    if config.no_repeat_ngram_size > 0:
        chain.append(NoRepeatNGramLogitsProcessor(config.no_repeat_ngram_size))
    if config.do_sample:
        if config.temperature != 1.0:
            chain.append(TemperatureLogitsWarper(config.temperature))
        if config.top_k != 0:
            chain.append(TopKLogitsWarper(config.top_k, min_tokens_to_keep=config.min_tokens_to_keep))
        if config.top_p < 1.0:
            chain.append(TopPLogitsWarper(config.top_p, min_tokens_to_keep=config.min_tokens_to_keep))
        chain.append(MinPLogitsWarper(config.min_p, min_tokens_to_keep=config.min_tokens_to_keep))
    return chain


GRID = list(itertools.product((0.5, 1.0, 1.7), (0, 5), (1.0, 0.9, 0.5), (0.0, 0.1), (1.0, 1.3), (0, 2)))


def test_chain_matches_transformers_grid():
    scores, input_ids = random_case(10, batch=6)
    scores = scores * torch.tensor([0.3, 0.6, 1.0, 1.5, 2.0, 3.0])[:, None]  # flat to peaked rows
    for temperature, top_k, top_p, min_p, penalty, ngram in GRID:
        config = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                repetition_penalty=penalty, no_repeat_ngram_size=ngram)
        theirs = hf_chain(config)(input_ids, scores.clone())
        assert_same_filtering(process_logits(scores, input_ids, config), theirs, str(config))


def test_greedy_chain_skips_warpers():
    scores, input_ids = random_case(3)
    config = SamplingConfig.greedy(temperature=0.5, top_k=3, top_p=0.5, repetition_penalty=1.3,
                                   no_repeat_ngram_size=2)
    expected = apply_no_repeat_ngram(apply_repetition_penalty(scores, input_ids, 1.3), input_ids, 2)
    assert torch.equal(process_logits(scores, input_ids, config), expected)


def test_chain_matches_hf_generate_scores():
    """End to end: replay HF generate()'s raw logits through process_logits and compare with its scores.

    This checks the order of the chain, the left-padding handling and `hf_generate_kwargs` at once.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    vocab = 24
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )).eval()
    prompt = torch.tensor([[0, 0, 0, 5, 6, 5, 6], [3, 4, 3, 4, 7, 8, 3]])
    prompt_mask = (prompt != 0).long()
    configs = [
        SamplingConfig(temperature=1.7, top_k=8, top_p=0.9, min_p=0.05, repetition_penalty=1.3,
                       no_repeat_ngram_size=2, max_new_tokens=6),
        SamplingConfig(temperature=0.6, top_p=0.8, repetition_penalty=0.8, max_new_tokens=6),
        SamplingConfig.greedy(repetition_penalty=1.5, no_repeat_ngram_size=3, max_new_tokens=6),
    ]
    for config in configs:
        torch.manual_seed(1)
        out = model.generate(
            prompt,
            attention_mask=prompt_mask,
            return_dict_in_generate=True,
            output_scores=True,
            output_logits=True,
            pad_token_id=0,
            eos_token_id=None,
            **config.hf_generate_kwargs(),
        )
        assert len(out.scores) == config.max_new_tokens
        for step, (logits, hf_scores) in enumerate(zip(out.logits, out.scores)):
            context = out.sequences[:, : prompt.shape[1] + step]
            mask = torch.cat([prompt_mask, torch.ones(2, step, dtype=torch.long)], dim=1)
            ours = process_logits(logits, context, config, attention_mask=mask)
            assert_same_filtering(ours, hf_scores, f"{config} step {step}")


# ----------------------------------------------------------------------------------------------------
# Choosing the token


def test_greedy_is_argmax_and_logprobs_are_log_softmax():
    scores, input_ids = random_case(5)
    config = SamplingConfig.greedy(repetition_penalty=1.3)
    processed = process_logits(scores, input_ids, config)
    tokens, logprobs = sample_next_token(processed, config)
    assert torch.equal(tokens, processed.argmax(dim=-1))
    expected = F.log_softmax(processed, dim=-1).gather(1, tokens[:, None]).squeeze(1)
    torch.testing.assert_close(logprobs, expected, atol=1e-6, rtol=0)
    assert logprobs.dtype == torch.float32 and tokens.dtype == torch.int64


def test_sampling_logprobs_are_under_the_filtered_distribution():
    scores, input_ids = random_case(6)
    config = SamplingConfig(temperature=0.7, top_k=10, top_p=0.8, seed=0)
    processed = process_logits(scores, input_ids, config)
    tokens, logprobs = sample_next_token(processed, config, make_generator(config))
    assert not torch.isinf(processed.gather(1, tokens[:, None])).any(), "sampled a removed token"
    expected = F.log_softmax(processed, dim=-1).gather(1, tokens[:, None]).squeeze(1)
    torch.testing.assert_close(logprobs, expected, atol=1e-6, rtol=0)
    raw = F.log_softmax(scores, dim=-1).gather(1, tokens[:, None]).squeeze(1)
    assert (logprobs - raw).abs().max() > 1e-3, (
        "logprobs must come from the processed scores, not the raw ones"
    )


def test_seeded_sampling_is_reproducible():
    scores = torch.randn(8, VOCAB, generator=torch.Generator().manual_seed(7))
    config = SamplingConfig(seed=123)
    draws = [sample_next_token(scores, config, make_generator(config))[0] for _ in range(2)]
    assert torch.equal(draws[0], draws[1])
    other = sample_next_token(scores, config, make_generator(config.replace(seed=124)))[0]
    many = torch.stack([sample_next_token(scores, config, make_generator(config.replace(seed=s)))[0]
                        for s in range(20)])
    assert not (many == many[0]).all(), "different seeds should give different samples"
    assert other.shape == (8,)


def test_sampling_follows_the_distribution():
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    scores = probs.log().repeat(20_000, 1)
    tokens, _ = sample_next_token(scores, SamplingConfig(), torch.Generator().manual_seed(0))
    freqs = torch.bincount(tokens, minlength=4).float() / tokens.numel()
    torch.testing.assert_close(freqs, probs, atol=0.015, rtol=0)


def test_all_removed_row_raises():
    scores = torch.full((1, 5), -float("inf"))
    with pytest.raises(ValueError, match="no_repeat_ngram_size"):
        sample_next_token(scores, SamplingConfig())


# ----------------------------------------------------------------------------------------------------
# explain_filters


def test_explain_filters_reports_each_stage():
    probs = torch.tensor([0.05, 0.3, 0.1, 0.1, 0.45])
    config = SamplingConfig(top_k=3, top_p=0.7, no_repeat_ngram_size=1)
    info = explain_filters(probs.log(), torch.tensor([3]), config)
    assert info["stages"] == ["no_repeat_ngram", "top_k", "top_p"]
    # id 3 is banned (seen, n = 1); top-3 of the rest drops id 0 (0.05); top-p over
    # {0.45, 0.3, 0.1} / 0.85 keeps 0.53 + 0.35 >= 0.7 and drops id 2.
    assert info["removed_by"] == ["top_k", None, "top_p", "no_repeat_ngram", None]
    assert info["kept"].tolist() == [False, True, False, False, True]
    torch.testing.assert_close(info["probs_raw"], probs)
    torch.testing.assert_close(info["probs_final"], torch.tensor([0.0, 0.4, 0.0, 0.0, 0.6]))
    assert info["kept_by_stage"]["no_repeat_ngram"].tolist() == [True, True, True, False, True]
    assert info["probs_by_stage"]["top_p"].sum().item() == pytest.approx(1.0)
    assert torch.equal(
        info["scores_final"], process_logits(probs.log()[None], torch.tensor([[3]]), config)[0])


def test_explain_filters_batched_matches_process_logits():
    scores, input_ids = random_case(8)
    config = SamplingConfig(temperature=1.3, top_k=12, top_p=0.8, min_p=0.1, repetition_penalty=1.2,
                            no_repeat_ngram_size=2)
    info = explain_filters(scores, input_ids, config)
    final = process_logits(scores, input_ids, config)
    assert torch.equal(info["kept"], ~torch.isinf(final))
    assert len(info["removed_by"]) == scores.shape[0]
    for row, kept in zip(info["removed_by"], info["kept"].tolist()):
        assert [r is None for r in row] == kept


# ----------------------------------------------------------------------------------------------------
# SamplingConfig validation


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("do_sample", 1), ("do_sample", "yes"),
        ("temperature", 0.0), ("temperature", -1.0), ("temperature", "1.0"), ("temperature", True),
        ("temperature", float("nan")), ("temperature", float("inf")),
        ("top_p", 0.0), ("top_p", 1.5), ("top_p", -0.1), ("top_p", None),
        ("top_k", -1), ("top_k", 5.0), ("top_k", True),
        ("min_p", -0.1), ("min_p", 1.0), ("min_p", "0.1"),
        ("repetition_penalty", 0.0), ("repetition_penalty", -1.2), ("repetition_penalty", False),
        ("no_repeat_ngram_size", -1), ("no_repeat_ngram_size", 2.0),
        ("max_new_tokens", 0), ("max_new_tokens", 1.5),
        ("min_tokens_to_keep", 0), ("min_tokens_to_keep", True),
        ("seed", 1.5), ("seed", "42"), ("seed", True),
        ("return_logprobs", 0),
    ],
)
def test_invalid_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingConfig(**{field: value})


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("top_p", 1.5, "top_p must satisfy 0 < top_p <= 1, got 1.5"),
        ("min_p", 1.0, "min_p must satisfy 0 <= min_p < 1, got 1.0"),
        ("top_k", -1, "top_k must satisfy 0 <= top_k, got -1"),
        ("max_new_tokens", 0, "max_new_tokens must satisfy 1 <= max_new_tokens, got 0"),
        ("temperature", -1.0, "temperature must satisfy 0 <= temperature"),
        ("do_sample", 1, "do_sample must be True or False"),
        ("seed", 1.5, "seed must be an integer.*None is also allowed"),
    ],
)
def test_invalid_config_message_gives_the_allowed_values(field, value, message):
    with pytest.raises(ValueError, match=message):
        SamplingConfig(**{field: value})


def test_processors_validate_their_argument():
    scores, ids = torch.zeros(1, 5), torch.zeros(1, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="temperature must satisfy 0 < temperature"):
        apply_temperature(scores, 0.0)
    with pytest.raises(ValueError, match="no_repeat_ngram_size must satisfy 1 <= no_repeat_ngram_size"):
        apply_no_repeat_ngram(scores, ids, 0)


def test_temperature_zero_message_points_to_greedy():
    with pytest.raises(ValueError, match="do_sample=False"):
        SamplingConfig(temperature=0.0)


def test_valid_configs():
    assert SamplingConfig().top_k == 0, "top_k is off by default (HF's default is 50)"
    greedy = SamplingConfig.greedy(temperature=0.0, max_new_tokens=4)
    assert greedy.do_sample is False and greedy.max_new_tokens == 4
    config = SamplingConfig(temperature=2, top_p=1, repetition_penalty=1)  # ints are fine for floats
    assert isinstance(config.temperature, float) and isinstance(config.top_p, float)
    with pytest.raises(ValueError, match="do_sample"):
        SamplingConfig.greedy(do_sample=True)
    with pytest.raises(ValueError, match="top_p"):
        SamplingConfig().replace(top_p=2.0)
    kwargs = SamplingConfig(top_p=0.9).hf_generate_kwargs()
    assert kwargs["top_k"] == 0 and kwargs["top_p"] == 0.9 and kwargs["do_sample"] is True
