"""The decoding fast path (stacked projections, RoPE table, no mask without padding) changes no result.

`generate` on the shipped model must give the tokens of a plain loop that recomputes the whole
sequence with an ordinary forward every step (no cache, no stacked weights, the mask always passed),
greedy and seeded-sampled alike; and each fast piece must equal the piece it replaces.
"""

from __future__ import annotations

import copy

import pytest
import torch

from rlhf_lab.checkpoints import load_checkpoint
from rlhf_lab.model import LlamaModel, ModelConfig, build_attention_mask
from rlhf_lab.model.rope import RotaryEmbedding
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
            ids, mask = torch.cat([ids, token[:, None]], 1), torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
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
    tokens, logprobs, tolerance = plain_generate(model, ids, torch.ones_like(ids), config, make_generator(config),
                                                 stop_at_eos=False)
    assert torch.equal(fast.completion_ids, tokens)
    torch.testing.assert_close(fast.logprobs, logprobs, atol=tolerance, rtol=0)


def test_fused_projections_give_the_unfused_logits_and_leave_training_alone():
    torch.manual_seed(0)
    for config in (ModelConfig(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2),
                   ModelConfig(model_type="qwen3", vocab_size=40, hidden_size=32, intermediate_size=48,
                               num_hidden_layers=2, attention_bias=True)):
        model = LlamaModel(config).eval()
        ids = torch.randint(0, 40, (3, 7))
        with torch.no_grad():
            plain = model(ids).logits
            with model.fused_projections():
                assert model.model.layers[0].self_attn.qkv_fused is not None
                fused = model(ids).logits
        assert model.model.layers[0].self_attn.qkv_fused is None  # dropped on exit
        # Each stacked output column is the same dot product as before: equal up to the rounding of a
        # sum of hidden_size terms, scaled by the logits' magnitude.
        torch.testing.assert_close(fused, plain, atol=config.hidden_size * EPS * plain.abs().max().item(), rtol=0)
        # With gradients the stacks are ignored, so the weights still get their gradients.
        with model.fused_projections():
            model(ids).logits.sum().backward()
        assert model.model.layers[0].self_attn.q_proj.weight.grad is not None
        assert model.model.layers[0].mlp.gate_proj.weight.grad is not None


def test_rope_table_rows_equal_the_module_output():
    rope = RotaryEmbedding(16, 10000.0, {"rope_type": "yarn", "factor": 2.0}, 32)
    cos, sin = rope.cos_sin_table(40)  # longer than max_position_embeddings: the table grows
    assert cos.shape == (40, 8)
    positions = torch.tensor([[0, 5, 39], [17, 3, 31]])
    cos_direct, sin_direct = rope(positions)
    # cos and sin are at most attention_scaling in size; vectorised and scalar kernels may differ by an ulp.
    tolerance = 4 * EPS * rope.attention_scaling
    torch.testing.assert_close(cos[positions], cos_direct, atol=tolerance, rtol=0)
    torch.testing.assert_close(sin[positions], sin_direct, atol=tolerance, rtol=0)
    with pytest.raises(ValueError, match="dynamic"):
        RotaryEmbedding(16, 10000.0, {"rope_type": "dynamic", "factor": 2.0}, 32).cos_sin_table(8)
    with pytest.raises(ValueError, match="length"):
        rope.cos_sin_table(0)


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
    expected = torch.tensor([[(s <= 4 and bool(row[s])) or s == 4 for s in range(5)] for row in mask.tolist()])
    assert got.shape == (3, 1, 1, 5)
    assert torch.equal(got[:, 0, 0], expected)
    assert mask[2, 4] == 0  # the caller's mask is not modified
    with pytest.raises(ValueError, match="covers 5 positions"):
        build_attention_mask(mask, num_new=1, past_len=5, device=torch.device("cpu"))


def test_exponential_race_draws_what_multinomial_draws():
    torch.manual_seed(0)
    scores = torch.randn(64, 58) * 2
    scores[:, :5] = float("-inf")  # removed tokens are never drawn
    config = SamplingConfig(do_sample=True)
    ours, _ = sample_next_token(scores, config, torch.Generator().manual_seed(11), return_logprobs=False)
    theirs = torch.multinomial(scores.softmax(-1), 1, generator=torch.Generator().manual_seed(11)).squeeze(1)
    assert torch.equal(ours, theirs)  # same random numbers, same tokens: seeded histories unchanged
    assert (ours >= 5).all()
    # And it samples the right distribution: 20000 draws of one row, each frequency within 5 standard
    # errors sqrt(p (1 - p) / n) of its probability.
    row = torch.tensor([[0.0, 1.0, 2.0, -1.0]]).expand(20000, 4)
    tokens, _ = sample_next_token(row, config, torch.Generator().manual_seed(0), return_logprobs=False)
    p = row[0].softmax(-1)
    frequency = torch.bincount(tokens, minlength=4).float() / len(tokens)
    assert ((frequency - p).abs() <= 5 * (p * (1 - p) / len(tokens)).sqrt()).all()


def test_lora_adapters_are_not_bypassed_by_the_stacked_weights(shipped):
    from rlhf_lab.model.lora import add_lora

    model, tokenizer = shipped
    lora = add_lora(copy.deepcopy(model), r=4)
    with torch.no_grad():  # a nonzero update, so that ignoring the adapters would change the logits
        for name, param in lora.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5, generator=torch.Generator().manual_seed(0))
    ids = torch.tensor([tokenizer.encode("345+678=", add_bos=True)])
    with torch.no_grad():
        plain = lora(ids).logits
        with lora.fused_projections():
            fused = lora(ids).logits
        base = model(ids).logits
    assert not torch.allclose(plain, base)  # the adapters matter here
    assert torch.equal(fused, plain)
