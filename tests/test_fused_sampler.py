"""The fused sampler of sampling/fast.py (temperature, top-k, top-p and the draw on top-k's survivors)
against the plain chain of `process_logits` + `sample_next_token`, and the fast Exp(1) draw against
`exponential_`."""

import pytest
import torch

from rlhf_lab.sampling import SamplingConfig, generate, process_logits, sample_next_token
from rlhf_lab.sampling.fast import (
    exponential_like,
    fused_sampler_applies,
    sample_fused,
    uniform_gives_exponential,
)

EPS = torch.finfo(torch.float32).eps

SETTINGS = [  # (temperature, top_k, top_p, min_tokens_to_keep)
    (0.7, 20, 0.9, 1),
    (1.0, 5, 1.0, 1),
    (1.3, 0, 0.8, 1),
    (0.5, 40, 0.5, 3),
    (1.0, 58, 0.95, 1),  # k = the vocabulary: no cut by top-k
    (2.0, 100, 0.3, 2),  # k beyond the vocabulary
]


def chain(scores, config, generator):
    return sample_next_token(process_logits(scores, None, config), config, generator)


@pytest.mark.parametrize("temperature,top_k,top_p,keep", SETTINGS)
def test_fused_draws_the_chains_tokens(temperature, top_k, top_p, keep):
    config = SamplingConfig(do_sample=True, temperature=temperature, top_k=top_k, top_p=top_p,
                            min_tokens_to_keep=keep)
    assert fused_sampler_applies(config)
    different = 0
    for seed in range(40):  # 40 x 256 rows = 10,240 draws per setting
        scores = torch.randn(256, 58, generator=torch.Generator().manual_seed(seed)) * 3
        scores[:, 7] = float("-inf")  # a token already removed (as min_new_tokens removes EOS)
        one, other = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        tokens, logprobs = sample_fused(scores, config, one)
        expected, expected_logprobs = chain(scores, config, other)
        assert torch.equal(one.get_state(), other.get_state())  # the same random numbers used up
        same = tokens == expected
        different += int((~same).sum())
        # log-probs of the same token: log_softmax over k numbers instead of V, so rounding of the order
        # of fp32 eps times the largest |score / T| (the shift inside log_softmax), with a margin of 16
        scale = (scores / temperature).abs().masked_fill(scores.isinf(), 0).amax()
        torch.testing.assert_close(logprobs[same], expected_logprobs[same], rtol=0, atol=16 * EPS * scale)
    assert different == 0  # rounding could flip a draw at a threshold; in these 10,240 none did


def test_ties_with_the_kth_score_keep_every_tied_token_as_the_chain():
    scores = torch.randn(64, 58, generator=torch.Generator().manual_seed(0))
    top = scores.topk(6, dim=-1)
    scores.scatter_(1, top.indices[:, 5:6], top.values[:, 4:5])  # the 6th best equals the 5th in every row
    config = SamplingConfig(do_sample=True, top_k=5, top_p=0.99)
    tokens, logprobs = sample_fused(scores, config, torch.Generator().manual_seed(1))
    expected, expected_logprobs = chain(scores, config, torch.Generator().manual_seed(1))
    assert torch.equal(tokens, expected)
    assert torch.equal(logprobs, expected_logprobs)  # the fallback is the chain itself


def test_the_fused_sampler_is_off_where_the_whole_vocabulary_is_needed():
    assert not fused_sampler_applies(SamplingConfig(do_sample=False, top_k=5))
    assert not fused_sampler_applies(SamplingConfig(do_sample=True))  # nothing to filter: the plain draw
    assert not fused_sampler_applies(SamplingConfig(do_sample=True, temperature=0.7))
    assert not fused_sampler_applies(SamplingConfig(do_sample=True, top_k=5, repetition_penalty=1.2))
    assert not fused_sampler_applies(SamplingConfig(do_sample=True, top_k=5, no_repeat_ngram_size=2))
    assert not fused_sampler_applies(SamplingConfig(do_sample=True, top_p=0.9, min_p=0.1))


def test_generate_with_the_fused_sampler_gives_the_chains_tokens():
    """A whole seeded generation (cached, fused sampler) against the chain run step by step with the same
    generator on full forwards of the sequences generate wrote."""
    from rlhf_lab.checkpoints import load_checkpoint

    model, tokenizer, _ = load_checkpoint("addition_rl_start")
    config = SamplingConfig(do_sample=True, temperature=0.8, top_k=10, top_p=0.9, seed=4, max_new_tokens=10,
                            return_logprobs=True)
    prompts = ["12+34=", "7+8=", "99+1="]
    out = generate(model, prompts, config, tokenizer=tokenizer, num_return_sequences=8, stop_at_eos=False)
    # the chain, one step at a time, on full forwards of the same sequences (teacher-forced)
    generator = torch.Generator().manual_seed(4)
    with torch.no_grad():
        logits = model(out.sequences, attention_mask=out.attention_mask).logits
    P = out.prompt_ids.shape[1]
    for t in range(out.completion_ids.shape[1]):
        tokens, logprobs = chain(logits[:, P + t - 1], config, generator)
        assert torch.equal(tokens, out.completion_ids[:, t])
        # cached vs full forward: logits agree to fp32 rounding of their scale; log-probs follow
        scale = logits[:, P + t - 1].abs().amax() / config.temperature
        torch.testing.assert_close(out.logprobs[:, t], logprobs, rtol=0, atol=64 * EPS * scale)


@pytest.mark.parametrize("shape", [(64, 58), (3, 5), (1, 1), (1000,)])
def test_exponential_like_draws_what_exponential_draws(shape):
    """Holds on every build: by the fast route where the check passes, by exponential_ itself where not."""
    one, other = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    ours = exponential_like(torch.empty(shape), one)
    theirs = torch.empty(shape).exponential_(1.0, generator=other)
    assert torch.equal(ours, theirs)
    assert torch.equal(one.get_state(), other.get_state())
    # and with the global generator
    torch.manual_seed(3)
    ours = exponential_like(torch.empty(shape))
    torch.manual_seed(3)
    assert torch.equal(ours, torch.empty(shape).exponential_(1.0))


def test_the_fast_route_check_says_whether_the_formula_gives_exponentials():
    """uniform_gives_exponential's answer (4096 draws of seed 0) agrees with 100,000 draws of another seed:
    -log1p(-u) of float64 uniforms equals exponential_'s float32 numbers exactly where the check says so."""
    uniforms = torch.empty(100_000, dtype=torch.float64).uniform_(generator=torch.Generator().manual_seed(5))
    expected = torch.empty(100_000).exponential_(1.0, generator=torch.Generator().manual_seed(5))
    assert uniform_gives_exponential() == torch.equal(uniforms.neg().log1p().neg().float(), expected)


def test_exponential_like_keeps_exponential_for_other_dtypes():
    one, other = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    ours = exponential_like(torch.empty(8, 5, dtype=torch.float64), one)
    assert ours.dtype == torch.float64
    assert torch.equal(ours, torch.empty(8, 5, dtype=torch.float64).exponential_(1.0, generator=other))
