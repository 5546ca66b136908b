"""Beam search: equal to transformers' beam search, and correct block bookkeeping on the paged cache."""

from __future__ import annotations

import pytest
import torch

from rlhf_lab.checkpoints import load_checkpoint
from rlhf_lab.model import LlamaModel, ModelConfig, to_hf
from rlhf_lab.sampling import BeamSearchConfig, beam_search, left_pad, measure_block_sharing

PROMPTS = [[1, 5, 9, 13, 7], [1, 20], [1, 8, 8, 30, 31, 32, 33, 4, 12], [1, 44, 45]]
EPS = torch.finfo(torch.float32).eps
PAD, EOS = 0, 2  # the lab's tokenizer: <pad>=0, <bos>=1, <eos>=2


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    # Random weights (large init: peaked, varied distributions) and one kv head for 4 query heads.
    torch.manual_seed(0)
    model = LlamaModel(ModelConfig(vocab_size=59, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=64,
                                   initializer_range=0.3)).eval()
    config = model.config
    with torch.no_grad():  # tilt EOS's output row towards the mean direction: hypotheses of 1-10 tokens
        weight = model.lm_head.weight
        weight[config.eos_token_id] += 2.0 * weight.mean(0) * config.vocab_size**0.5
    return model


@pytest.fixture(scope="module")
def hf(model):
    return to_hf(model)


@pytest.fixture(scope="module")
def prompts():
    return left_pad(PROMPTS, pad_token_id=0)


def transformers_beam_search(hf_model, ids, mask, config: BeamSearchConfig, pad_id: int, eos_id: int):
    with torch.no_grad():
        return hf_model.generate(input_ids=ids, attention_mask=mask, pad_token_id=pad_id, eos_token_id=eos_id,
                                 output_scores=True, return_dict_in_generate=True,
                                 **config.hf_generate_kwargs())


def assert_same_as_transformers(model, ours, theirs, config: BeamSearchConfig, logit_scale: float):
    mc = model.config
    # transformers 5.x fills the unused tail of a finished hypothesis with `pad_token_id or eos_token_id`,
    # so with pad id 0 the tail is EOS; the lab writes pad_token_id there. Compare each hypothesis up to
    # its length, and the tail against transformers' fill value.
    fill = mc.pad_token_id or mc.eos_token_id
    assert ours.sequences.shape == theirs.sequences.shape
    P = ours.prompt_width
    tail = torch.arange(ours.sequences.shape[1] - P)[None, :] >= ours.completion_lengths[:, None]
    expected = ours.sequences.clone()
    expected[:, P:][tail] = fill
    assert torch.equal(expected, theirs.sequences)
    # Scores: each is sum_t log p_t / T ** length_penalty. Each log p_t is a log-softmax of logits of size
    # `logit_scale`, computed by two implementations whose matmuls, attention kernels and prefill batch
    # differ: an error of a few ulp of the logit scale per token (64 eps * scale leaves room for the
    # accumulation order of hidden-size dot products and the log-sum-exp), summed over T tokens, then
    # divided by T ** length_penalty (a multiplication when length_penalty < 0).
    T = ours.completion_lengths.float()
    tolerance = T * 64 * EPS * logit_scale / T**config.length_penalty
    error = (ours.sequences_scores - theirs.sequences_scores).abs()
    assert (error <= tolerance).all(), (error.max().item(), tolerance.min().item())


def logit_scale(model, ids, mask) -> float:
    with torch.no_grad():
        return 1.0 + model(ids, attention_mask=mask).logits.abs().max().item()


@pytest.mark.parametrize("num_beams", [2, 4, 8])
@pytest.mark.parametrize("length_penalty", [-1.0, 0.0, 1.0, 2.0])
@pytest.mark.parametrize("early_stopping", [True, False])
def test_equals_transformers_beam_search(model, hf, prompts, num_beams, length_penalty, early_stopping):
    ids, mask = prompts
    config = BeamSearchConfig(num_beams=num_beams, max_new_tokens=10, length_penalty=length_penalty,
                              early_stopping=early_stopping, num_return_sequences=num_beams)
    ours = beam_search(model, ids, config, attention_mask=mask)
    theirs = transformers_beam_search(hf, ids, mask, config, PAD, EOS)
    if length_penalty <= 1:  # hypotheses ended by EOS and by the length limit (2.0 favours long ones)
        assert (ours.completion_lengths < 10).any() and (ours.completion_lengths == 10).any()
    assert_same_as_transformers(model, ours, theirs, config, logit_scale(model, ids, mask))


@pytest.mark.parametrize("length_penalty", [0.5, 2.0])
def test_early_stopping_never_equals_transformers(model, hf, prompts, length_penalty):
    ids, mask = prompts
    config = BeamSearchConfig(num_beams=4, max_new_tokens=10, length_penalty=length_penalty,
                              early_stopping="never", num_return_sequences=4)
    ours = beam_search(model, ids, config, attention_mask=mask)
    theirs = transformers_beam_search(hf, ids, mask, config, PAD, EOS)
    assert_same_as_transformers(model, ours, theirs, config, logit_scale(model, ids, mask))


def test_one_beam_is_greedy_as_in_transformers(model, hf, prompts):
    ids, mask = prompts
    config = BeamSearchConfig(num_beams=1, max_new_tokens=10, length_penalty=0.0)
    ours = beam_search(model, ids, config, attention_mask=mask)
    with torch.no_grad():  # transformers runs greedy search for num_beams=1 (no sequences_scores)
        theirs = hf.generate(input_ids=ids, attention_mask=mask, pad_token_id=PAD, eos_token_id=EOS,
                             **config.hf_generate_kwargs())
    assert torch.equal(ours.sequences, theirs)
    with torch.no_grad():  # the score is the hypothesis' summed log-probability (length_penalty 0)
        logits = model(ours.sequences, attention_mask=(ours.sequences != PAD).long()).logits
    logp = torch.log_softmax(logits, dim=-1)
    P = ours.prompt_width
    token_logp = logp[:, P - 1:-1].gather(-1, ours.sequences[:, P:, None]).squeeze(-1)
    inside = torch.arange(token_logp.shape[1])[None] < ours.completion_lengths[:, None]
    expected = (token_logp * inside).sum(1)
    T = ours.completion_lengths.float()
    assert torch.allclose(ours.sequences_scores, expected, rtol=0, atol=float((T * 64 * EPS * 30).max()))


def test_shipped_checkpoint_equals_transformers():
    model, tok, _ = load_checkpoint("addition_sft")
    ids, mask = left_pad([tok.encode(p, add_bos=True) for p in ("12+345=", "7+8=", "406+59=", "1+1=")],
                         tok.pad_token_id)
    hf = to_hf(model)
    scale = logit_scale(model, ids, mask)
    for num_beams, length_penalty, early_stopping in ((2, 1.0, False), (4, -1.0, True), (8, 2.0, False)):
        config = BeamSearchConfig(num_beams=num_beams, max_new_tokens=8, length_penalty=length_penalty,
                                  early_stopping=early_stopping, num_return_sequences=2)
        ours = beam_search(model, ids, config, attention_mask=mask)
        theirs = transformers_beam_search(hf, ids, mask, config, tok.pad_token_id, tok.eos_token_id)
        assert_same_as_transformers(model, ours, theirs, config, scale)


@pytest.mark.parametrize("kind", ["static", "dynamic"])
def test_paged_equals_contiguous_cache(model, prompts, kind):
    ids, mask = prompts
    config = BeamSearchConfig(num_beams=4, max_new_tokens=10, num_return_sequences=4)
    paged = beam_search(model, ids, config, attention_mask=mask, cache="paged", block_size=4)
    contiguous = beam_search(model, ids, config, attention_mask=mask, cache=kind)
    assert torch.equal(paged.sequences, contiguous.sequences)
    assert torch.equal(paged.sequences_scores, contiguous.sequences_scores)


@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_blocks_refcounted_shared_and_isolated(model, prompts, block_size):
    """At every step: refcounts match the block tables (never negative, nothing leaked); each beam's
    cached keys/values are exactly its parent's, plus its own new token (a sibling's copy-on-write
    write never reaches them); at the end every block is free."""
    ids, mask = prompts
    snapshots = []

    def check(step, cache, parents, sequences):
        cache.check_invariants()
        assert sequences.shape == (len(cache.block_table_rows()), cache.length)
        layers = [cache.read(layer) for layer in range(model.config.num_hidden_layers)]
        if snapshots:
            old_sequences, old_layers = snapshots[-1]
            assert torch.equal(sequences[:, :-1], old_sequences[parents])  # each beam extends its parent
            for (keys, values), (old_keys, old_values) in zip(layers, old_layers):
                S = old_keys.shape[2]
                assert torch.equal(keys[:, :, :S], old_keys[parents])
                assert torch.equal(values[:, :, :S], old_values[parents])
        snapshots.append((sequences, layers))

    config = BeamSearchConfig(num_beams=4, max_new_tokens=10, num_return_sequences=4)
    out = beam_search(model, ids, config, attention_mask=mask, block_size=block_size, on_step=check)
    assert len(snapshots) == out.steps - 1 >= 5
    assert out.cache.blocks_in_use() == 0 and out.cache.free_blocks() == out.cache.num_blocks
    out.cache.check_invariants()
    # Right after the prefill the 4 beams of a prompt share all of its blocks.
    B, P = ids.shape
    per_prompt = -(-P // block_size)
    assert out.blocks_in_use[0] == B * per_prompt and out.blocks_if_contiguous[0] == 4 * B * per_prompt
    assert all(p <= c for p, c in zip(out.blocks_in_use, out.blocks_if_contiguous))
    if block_size > 1:  # a shared, partially filled block gets written: copy-on-write happened
        assert out.cow_copies > 0
    else:  # one token per block: a block is always full when shared, nothing is ever copied
        assert out.cow_copies == 0
    usage = out.block_usage()
    assert 0 < usage["mean_saved"] < 1 and usage["peak_paged"] == max(out.blocks_in_use)


def test_settings_are_validated(model, prompts):
    ids, mask = prompts
    with pytest.raises(ValueError, match="num_beams must satisfy 1 <= num_beams, got 0"):
        BeamSearchConfig(num_beams=0)
    with pytest.raises(ValueError, match="num_return_sequences must satisfy 1 <= num_return_sequences <= 2"):
        BeamSearchConfig(num_beams=2, num_return_sequences=3)
    with pytest.raises(ValueError, match="early_stopping must be one of"):
        BeamSearchConfig(early_stopping="sometimes")
    with pytest.raises(ValueError, match="early_stopping must be one of"):
        BeamSearchConfig(early_stopping=1)
    with pytest.raises(ValueError, match="length_penalty must be a number"):
        BeamSearchConfig(length_penalty=float("nan"))
    config = BeamSearchConfig(num_beams=2)
    with pytest.raises(ValueError, match="num_beams must satisfy"):
        config.num_beams = -1
    with pytest.raises(ValueError, match="cache must be one of"):
        beam_search(model, ids, config, attention_mask=mask, cache="int8")
    with pytest.raises(ValueError, match="max_new_tokens must be <="):
        beam_search(model, ids, BeamSearchConfig(num_beams=2, max_new_tokens=60), attention_mask=mask)


def test_measure_block_sharing_rows(model):
    rows = measure_block_sharing(model, PROMPTS, num_beams=(2, 4), block_sizes=(1, 16), max_new_tokens=6)
    assert [(r["num_beams"], r["block_size"]) for r in rows] == [(2, 1), (2, 16), (4, 1), (4, 16)]
    for row in rows:
        assert row["same hypotheses"]  # the block size is bookkeeping: it never changes the result
        assert row["peak_paged"] <= row["peak_contiguous"] and 0 <= row["mean_saved"] < 1
    # One token per block: a shared block is always full, so nothing is ever copied; 16-token blocks
    # hold the prompt's last, partially filled block, which the beams share and then copy on write.
    assert rows[0]["cow_copies"] == rows[2]["cow_copies"] == 0
    assert rows[1]["cow_copies"] > 0 and rows[3]["cow_copies"] > 0
