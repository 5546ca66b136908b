"""Decoding with the cache, the stacked projections, the RoPE table and no mask without padding changes no
result: `generate` on the shipped model must give the tokens of a plain loop that recomputes the whole
sequence with an ordinary forward every step (no cache, no stacked weights, the mask always passed),
greedy and seeded-sampled alike. Each fast piece against the piece it replaces: tests/test_fast_paths.py.
"""

from __future__ import annotations

import pytest
import torch

from rlhf_lab.checkpoints import load_checkpoint
from rlhf_lab.model import build_attention_mask
from rlhf_lab.sampling import (
    SamplingConfig,
    generate,
    left_pad,
    make_generator,
    process_logits,
    sample_next_token,
)

EPS = torch.finfo(torch.float32).eps
TEXTS = ["12+7=", "345+678=", "9+9=", "1000+23=", "5+55=", "87+1="]  # different lengths: left padding


@pytest.fixture(scope="module")
def shipped():
    model, tokenizer, _ = load_checkpoint("addition_rl_start")
    return model, tokenizer


def plain_generate(model, ids, mask, config, generator, stop_at_eos=True):
    """The slowest correct loop: full forward over prompt + completion so far, every step."""
    eos, pad = model.config.eos_token_id, model.config.pad_token_id
    done = torch.zeros(ids.shape[0], dtype=torch.bool)
    tokens, logprobs, scale = [], [], 1.0
    with torch.no_grad():
        for _ in range(config.max_new_tokens):
            logits = model(ids, attention_mask=mask).logits[:, -1]
            scores = process_logits(logits, ids, config, mask)
            scale = max(scale, scores[scores.isfinite()].abs().max().item())
            token, logprob = sample_next_token(scores, config, generator)
            token = token.masked_fill(done, pad)
            tokens.append(token)
            logprobs.append(logprob.masked_fill(done, 0.0))
            if stop_at_eos:
                done |= token == eos
            ids = torch.cat([ids, token[:, None]], 1)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
            if bool(done.all()):
                break
    # log_softmax(s) = s - logsumexp(s): its rounding error scales with the largest |score|, which the
    # tolerance below is built from (fp32 eps times that scale, times a margin for the sums).
    return torch.stack(tokens, 1), torch.stack(logprobs, 1), 64 * EPS * scale


@pytest.mark.parametrize("config", [
    SamplingConfig(do_sample=False, max_new_tokens=8, return_logprobs=True),
    SamplingConfig(do_sample=True, temperature=0.7, top_k=20, top_p=0.9, seed=3, max_new_tokens=8,
                   return_logprobs=True),
], ids=["greedy", "sampled"])
def test_fast_generate_equals_a_plain_full_forward_loop(shipped, config):
    model, tokenizer = shipped
    ids, mask = left_pad([tokenizer.encode(t, add_bos=True) for t in TEXTS], model.config.pad_token_id)
    tokens, logprobs, tolerance = plain_generate(model, ids, mask, config, make_generator(config))
    for cache in ("static", "none"):
        out = generate(model, TEXTS, config, tokenizer=tokenizer, cache=cache)
        assert torch.equal(out.completion_ids, tokens), cache
        # Log-probs: the same math over different matmul shapes (one token vs the whole sequence), so
        # they agree to float32 rounding only.
        torch.testing.assert_close(out.logprobs, logprobs, atol=tolerance, rtol=0)
    assert out.finished.any()  # the shipped model answers: EOS stops rows, so the padding path runs


def test_unpadded_prompts_skip_the_mask_with_the_same_tokens(shipped):
    model, tokenizer = shipped
    ids = torch.tensor([tokenizer.encode(t, add_bos=True) for t in ["12+7=", "45+9=", "88+1=", "10+2="]])
    config = SamplingConfig(do_sample=True, temperature=1.0, seed=0, max_new_tokens=6, return_logprobs=True)
    fast = generate(model, ids, config, stop_at_eos=False)
    tokens, logprobs, tolerance = plain_generate(model, ids, torch.ones_like(ids), config,
                                                 make_generator(config), stop_at_eos=False)
    assert torch.equal(fast.completion_ids, tokens)
    torch.testing.assert_close(fast.logprobs, logprobs, atol=tolerance, rtol=0)


def test_sample_next_token_checks_removed_rows_only_when_asked():
    scores = torch.tensor([[0.0, 1.0, 2.0], [float("-inf")] * 3])
    greedy = SamplingConfig(do_sample=False)
    with pytest.raises(ValueError, match="every token"):
        sample_next_token(scores, greedy)
    tokens, logprobs = sample_next_token(scores[:1], greedy, return_logprobs=False)
    assert tokens.tolist() == [2] and logprobs is None
    tokens, _ = sample_next_token(scores, greedy, check_removed=False)  # no check: no error, no sync
    assert tokens[0].item() == 2


def test_decoding_step_mask_is_the_padding_mask_with_the_query_visible():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 1, 0]])  # last row: a padding query
    got = build_attention_mask(mask, num_new=1, past_len=4, device=torch.device("cpu"))
    # By the definition: key s visible to the query at position 4 when s <= 4, not padding, or s is itself.
    expected = torch.tensor([[(s <= 4 and bool(row[s])) or s == 4 for s in range(5)]
                             for row in mask.tolist()])
    assert got.shape == (3, 1, 1, 5)
    assert torch.equal(got[:, 0, 0], expected)
    assert mask[2, 4] == 0  # the caller's mask is not modified
    with pytest.raises(ValueError, match="covers 5 positions"):
        build_attention_mask(mask, num_new=1, past_len=5, device=torch.device("cpu"))
