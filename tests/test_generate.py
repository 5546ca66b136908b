"""Batched generation: caches agree with each other and with transformers' generate."""

from __future__ import annotations

import pytest
import torch

from rlhf_lab.model import LlamaModel, ModelConfig, to_hf
from rlhf_lab.sampling import CACHE_KINDS, SamplingConfig, generate


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=59, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         initializer_range=0.3)
    return LlamaModel(config).eval()


PROMPTS = [[1, 5, 9, 13, 7], [1, 20], [1, 8, 8, 30, 31, 32, 33, 4, 12], [1, 44, 45]]


def test_greedy_identical_across_caches(model):
    config = SamplingConfig(do_sample=False, max_new_tokens=20)
    outs = {kind: generate(model, PROMPTS, config, cache=kind)
            for kind in ("static", "dynamic", "paged", "none")}
    reference = outs["none"]
    assert reference.completion_ids.shape[1] > 5
    for kind, out in outs.items():
        assert torch.equal(out.completion_ids, reference.completion_ids), kind
        assert torch.equal(out.completion_mask, reference.completion_mask), kind


def test_greedy_equals_transformers_generate(model):
    config = SamplingConfig(do_sample=False, max_new_tokens=20)
    ours = generate(model, PROMPTS, config, cache="static")
    hf = to_hf(model)
    with torch.no_grad():
        theirs = hf.generate(input_ids=ours.prompt_ids, attention_mask=ours.prompt_mask, do_sample=False,
                             max_new_tokens=20, pad_token_id=0, eos_token_id=2, top_k=None, top_p=None,
                             temperature=None)
    generated = theirs[:, ours.prompt_ids.shape[1]:]
    assert torch.equal(generated[:, : ours.completion_ids.shape[1]], ours.completion_ids)


def test_eos_stops_rows_and_pads_after(model):
    # Force EOS early for row 0 by making EOS the argmax: bias the lm_head.
    config = SamplingConfig(do_sample=True, temperature=1.5, max_new_tokens=30, seed=3, return_logprobs=True)
    out = generate(model, PROMPTS * 4, config)
    lengths = out.completion_lengths
    for row in range(out.completion_ids.shape[0]):
        n = int(lengths[row])
        ids = out.completion_ids[row]
        if out.finished[row]:
            assert ids[n - 1] == model.config.eos_token_id
            assert (ids[n:] == model.config.pad_token_id).all()
            assert (ids[: n - 1] != model.config.eos_token_id).all()
        else:
            assert n == 30 and out.truncated[row]
        assert (out.logprobs[row, n:] == 0).all() and (out.logprobs[row, :n] < 0).all()
    assert out.finished.any() and out.truncated.any()  # both outcomes present in this setting


def test_min_new_tokens_forbids_eos_early_as_transformers(model):
    eos = model.config.eos_token_id
    free = generate(model, PROMPTS * 8, SamplingConfig(temperature=3.0, max_new_tokens=8, seed=0))
    assert (free.completion_ids[:, :3] == eos).any()  # without the rule, EOS comes early somewhere
    held = generate(model, PROMPTS * 8, SamplingConfig(temperature=3.0, max_new_tokens=8, min_new_tokens=3,
                                                       seed=0))
    assert not (held.completion_ids[:, :3] == eos).any() and (held.completion_ids == eos).any()
    config = SamplingConfig(do_sample=False, max_new_tokens=8, min_new_tokens=3)
    ours = generate(model, PROMPTS, config)
    with torch.no_grad():
        theirs = to_hf(model).generate(
            input_ids=ours.prompt_ids,
            attention_mask=ours.prompt_mask,
            pad_token_id=0,
            eos_token_id=eos,
            **config.hf_generate_kwargs(),
        )
    generated = theirs[:, ours.prompt_ids.shape[1]:]
    assert torch.equal(generated[:, : ours.completion_ids.shape[1]], ours.completion_ids)
    with pytest.raises(ValueError, match="min_new_tokens must satisfy 0 <= min_new_tokens <= 8"):
        SamplingConfig(max_new_tokens=8, min_new_tokens=9)


def test_seeded_sampling_is_reproducible_and_logprobs_match_a_forward(model):
    config = SamplingConfig(do_sample=True, temperature=0.8, top_p=0.9, max_new_tokens=12, seed=7,
                            return_logprobs=True)
    a = generate(model, PROMPTS, config, num_return_sequences=3)
    b = generate(model, PROMPTS, config, num_return_sequences=3)
    assert torch.equal(a.completion_ids, b.completion_ids)
    c = generate(model, PROMPTS, SamplingConfig(**{**config.__dict__, "seed": 8}), num_return_sequences=3)
    assert not torch.equal(a.completion_ids, c.completion_ids)
    # The stored log-probs are those of a full forward at temperature 0.8 (top_p only removes tokens
    # and renormalises, so compare on a no-filter config).
    plain = SamplingConfig(do_sample=True, temperature=0.8, max_new_tokens=12, seed=7, return_logprobs=True)
    out = generate(model, PROMPTS, plain, num_return_sequences=2)
    with torch.no_grad():
        logits = model(out.sequences, attention_mask=out.attention_mask).logits.float()
    P = out.prompt_ids.shape[1]
    logp = torch.log_softmax(logits[:, P - 1 : -1] / 0.8, dim=-1)
    logp = logp.gather(-1, out.completion_ids[..., None]).squeeze(-1)
    m = out.completion_mask.bool()
    torch.testing.assert_close(out.logprobs[m], logp[m], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("cache", CACHE_KINDS)
def test_outputs_are_ordinary_tensors_a_training_step_can_use(model, cache):
    """generate's forwards run under inference_mode, whose tensors autograd refuses to save for a
    backward; what it returns must be ordinary tensors, because the RL trainer trains on them (its
    loss multiplies the log-probs by the completion mask, and the embedding keeps the token ids)."""
    config = SamplingConfig(do_sample=True, temperature=0.8, max_new_tokens=6, seed=3, return_logprobs=True)
    out = generate(model, PROMPTS, config, num_return_sequences=2, cache=cache)
    fields = {
        "prompt_ids": out.prompt_ids,
        "prompt_mask": out.prompt_mask,
        "completion_ids": out.completion_ids,
        "completion_mask": out.completion_mask,
        "finished": out.finished,
        "truncated": out.truncated,
        "logprobs": out.logprobs,
        "sequences": out.sequences,
        "attention_mask": out.attention_mask,
    }
    assert [name for name, t in fields.items() if t.is_inference()] == []
    P = out.prompt_ids.shape[1]
    logits = model(out.sequences, attention_mask=out.attention_mask).logits.float()  # with gradients
    logp = torch.log_softmax(logits[:, P - 1 : -1] / 0.8, dim=-1).gather(-1, out.completion_ids[..., None])
    mask = out.completion_mask.float()
    loss = ((logp.squeeze(-1) - out.logprobs) * mask * out.logprobs).sum() / mask.sum()
    grads = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)
    assert any(g is not None and bool(g.abs().sum() > 0) for g in grads)


def test_num_return_sequences_groups_rows(model):
    out = generate(model, PROMPTS, SamplingConfig(do_sample=False, max_new_tokens=5), num_return_sequences=3)
    assert out.completion_ids.shape[0] == 12
    for b in range(4):  # greedy: the three samples of a prompt are identical
        group = out.completion_ids[3 * b : 3 * b + 3]
        assert torch.equal(group[0], group[1]) and torch.equal(group[0], group[2])
        assert torch.equal(out.prompt_ids[3 * b], out.prompt_ids[3 * b + 2])


def test_text_prompts_need_tokenizer(model):
    with pytest.raises(ValueError, match="tokenizer"):
        generate(model, ["12+3="])
    with pytest.raises(ValueError, match="cache must be one of"):
        generate(model, PROMPTS, cache="magic")
