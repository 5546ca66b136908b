"""The lab's Llama against Hugging Face transformers, built in-process (no download)."""

from __future__ import annotations

import errno
import json

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from rlhf_lab.model import (
    CheckpointError,
    DynamicCache,
    LlamaModel,
    ModelConfig,
    StaticCache,
    from_hf,
    from_pretrained,
    save_pretrained,
    to_hf,
)
from rlhf_lab.model.rope import half_split_to_interleaved

ATOL = 1e-5

HF_CASES = {
    "mha": dict(num_attention_heads=4, num_key_value_heads=4),
    "gqa_kv1": dict(num_attention_heads=4, num_key_value_heads=1),
    "gqa_kv2_theta": dict(num_attention_heads=4, num_key_value_heads=2, rope_parameters={"rope_type": "default", "rope_theta": 500.0}),
    "linear": dict(num_key_value_heads=2, rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}),
    "dynamic": dict(num_key_value_heads=2, max_position_embeddings=8,
                    rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}),
    "yarn": dict(num_key_value_heads=1, max_position_embeddings=32,
                 rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                                  "original_max_position_embeddings": 8}),
    "llama3_tied": dict(num_key_value_heads=2, tie_word_embeddings=True, max_position_embeddings=64,
                        rope_parameters={"rope_type": "llama3", "factor": 8.0, "rope_theta": 10000.0,
                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 16}),
}


def make_hf(seed: int = 0, **overrides) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    kwargs = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                  rms_norm_eps=1e-6, tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                  initializer_range=0.2)  # large init so logits are far from uniform
    kwargs.update(overrides)
    config = LlamaConfig(**kwargs)
    config._attn_implementation = "eager"
    return LlamaForCausalLM(config).eval()


def padded_batch(vocab: int, lengths: list[int], seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded random batch: ids (B, T) and attention mask (B, T)."""
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    ids = torch.randint(3, vocab, (len(lengths), T), generator=g)
    mask = torch.zeros(len(lengths), T, dtype=torch.long)
    for row, n in enumerate(lengths):
        mask[row, T - n:] = 1
        ids[row, : T - n] = 0
    return ids, mask


@pytest.mark.parametrize("case", sorted(HF_CASES))
def test_from_hf_logits_equal_on_padded_batch(case):
    hf = make_hf(**HF_CASES[case])
    lab = from_hf(hf)
    ids, mask = padded_batch(97, [12, 7, 12, 3])
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask).logits
        out = lab(ids, attention_mask=mask).logits
    real = mask.bool()  # padding positions are never used; HF and the lab treat them differently
    torch.testing.assert_close(out[real], ref[real], atol=ATOL, rtol=ATOL)


@pytest.mark.parametrize("case", sorted(HF_CASES))
def test_gradients_equal_transformers(case):
    """Every parameter's gradient of a cross-entropy on the logits, against transformers' on the same
    weights and padded batch (the logits test above checks the forward only). The two write the same
    function with different ops (RoPE, grouped attention, the fused RMSNorm), so the float32 sums are
    grouped differently. A gradient entry is a sum over the batch's n real tokens, chained through the
    layers: a few times n float32 eps of the largest entry (measured: 8.5-16.6 eps, n = 34)."""
    hf = make_hf(**HF_CASES[case])
    lab = from_hf(hf)
    ids, mask = padded_batch(97, [12, 7, 12, 3])
    real = mask.bool()  # padding positions are never used (see above): the loss reads real ones only
    targets = torch.randint(3, 97, ids.shape, generator=torch.Generator().manual_seed(2))
    torch.nn.functional.cross_entropy(hf(input_ids=ids, attention_mask=mask).logits[real], targets[real]).backward()
    torch.nn.functional.cross_entropy(lab(ids, attention_mask=mask).logits[real], targets[real]).backward()
    n, eps = int(real.sum()), torch.finfo(torch.float32).eps
    for name, param in lab.named_parameters():
        expected = hf.get_parameter(name).grad
        tolerance = 4 * n * eps * expected.abs().max().item()
        torch.testing.assert_close(param.grad, expected, atol=tolerance, rtol=0, msg=lambda m, name=name: f"{name}: {m}")


def test_dynamic_rope_beyond_max_length_matches_hf():
    hf = make_hf(**HF_CASES["dynamic"])  # max_position_embeddings 8, sequence 20: NTK rescales
    lab = from_hf(hf)
    ids = torch.randint(3, 97, (2, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(lab(ids).logits, hf(input_ids=ids).logits, atol=ATOL, rtol=ATOL)


@pytest.mark.parametrize("case", ["gqa_kv1", "llama3_tied", "linear"])
def test_to_hf_round_trip(case):
    hf = make_hf(**HF_CASES[case])
    lab = from_hf(hf)
    back = to_hf(lab)
    for name, tensor in hf.state_dict().items():
        torch.testing.assert_close(back.state_dict()[name], tensor, atol=0, rtol=0)
    ids, mask = padded_batch(97, [9, 5])
    with torch.no_grad():
        torch.testing.assert_close(back(input_ids=ids, attention_mask=mask).logits,
                                   hf(input_ids=ids, attention_mask=mask).logits, atol=ATOL, rtol=ATOL)


def small_config(**kw) -> ModelConfig:
    base = dict(vocab_size=59, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.2)
    base.update(kw)
    return ModelConfig(**base)


def test_saved_folder_loads_in_transformers_with_equal_logits(tmp_path):
    torch.manual_seed(0)
    lab = LlamaModel(small_config(rope_theta=2000.0)).eval()
    folder = save_pretrained(lab, tmp_path / "ckpt")
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    hf = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    again = from_pretrained(folder)
    ids, mask = padded_batch(59, [10, 4, 7])
    with torch.no_grad():
        ref = lab(ids, attention_mask=mask).logits
        torch.testing.assert_close(hf(input_ids=ids, attention_mask=mask).logits[mask.bool()], ref[mask.bool()],
                                   atol=ATOL, rtol=ATOL)
        torch.testing.assert_close(again(ids, attention_mask=mask).logits, ref, atol=0, rtol=0)


def test_interleaved_rope_with_permuted_weights_equals_half_split():
    torch.manual_seed(0)
    half = LlamaModel(small_config()).eval()
    inter = LlamaModel(small_config(rope_interleaved=True)).eval()
    state = half.state_dict()
    unpermuted = dict(state)
    for name in state:
        if name.endswith("q_proj.weight"):
            state[name] = half_split_to_interleaved(state[name], 4)
        elif name.endswith("k_proj.weight"):
            state[name] = half_split_to_interleaved(state[name], 2)
    inter.load_state_dict(state)
    ids, mask = padded_batch(59, [11, 6])
    with torch.no_grad():
        ref = half(ids, attention_mask=mask).logits
        torch.testing.assert_close(inter(ids, attention_mask=mask).logits, ref, atol=ATOL, rtol=ATOL)
        inter.load_state_dict(unpermuted)  # same weights, other pairing: clearly different model
        assert (inter(ids, attention_mask=mask).logits - ref).abs().max() > 1e-2
        # and to_hf undoes the permutation for transformers
        inter.load_state_dict(state)
        hf = to_hf(inter)
        torch.testing.assert_close(hf(input_ids=ids, attention_mask=mask).logits[mask.bool()], ref[mask.bool()],
                                   atol=ATOL, rtol=ATOL)


@pytest.mark.parametrize("cache_cls", ["dynamic", "static"])
def test_prefill_then_cached_steps_equal_full_forward(cache_cls):
    torch.manual_seed(0)
    model = LlamaModel(small_config()).eval()
    ids, mask = padded_batch(59, [9, 5, 7], seed=4)
    extra = torch.randint(3, 59, (3, 4), generator=torch.Generator().manual_seed(5))
    full_ids = torch.cat([ids, extra], 1)
    full_mask = torch.cat([mask, torch.ones_like(extra)], 1)
    cache = DynamicCache() if cache_cls == "dynamic" else StaticCache(model.config, 3, 13)
    with torch.no_grad():
        full = model(full_ids, attention_mask=full_mask).logits
        step_logits = [model(ids, attention_mask=mask, cache=cache).logits[:, -1]]
        for t in range(3):
            step_logits.append(
                model(extra[:, t : t + 1], attention_mask=full_mask[:, : ids.shape[1] + t + 1], cache=cache).logits[:, -1]
            )
    for t, logits in enumerate(step_logits):
        torch.testing.assert_close(logits, full[:, ids.shape[1] - 1 + t], atol=1e-5, rtol=1e-5)


def test_value_head_zero_initialised_and_saved(tmp_path):
    model = LlamaModel(small_config(value_head=True)).eval()
    ids = torch.randint(3, 59, (2, 5))
    assert model(ids).values.shape == (2, 5)
    assert torch.count_nonzero(model(ids).values) == 0
    with torch.no_grad():
        model.value_head.bias.fill_(0.5)
    folder = save_pretrained(model, tmp_path / "with_value")
    assert (folder / "value_head.safetensors").is_file()
    again = from_pretrained(folder)
    assert torch.allclose(again(ids).values, torch.full((2, 5), 0.5))


@pytest.mark.parametrize(
    "field, kwargs",
    [
        ("hidden_size", dict(hidden_size=30, num_attention_heads=4)),
        ("num_key_value_heads", dict(num_attention_heads=4, num_key_value_heads=3)),
        ("num_key_value_heads", dict(num_attention_heads=2, num_key_value_heads=4)),
        ("vocab_size", dict(vocab_size=0)),
        ("num_hidden_layers", dict(num_hidden_layers=-1)),
        ("intermediate_size", dict(intermediate_size=0)),
        ("rope_type", dict(rope_scaling={"rope_type": "cubic", "factor": 2.0})),
        ("head_dim", dict(head_dim=7)),
        ("rope_theta", dict(rope_theta=1.0)),
        ("rms_norm_eps", dict(rms_norm_eps=0.0)),
        ("eos_token_id", dict(eos_token_id=59)),
        ("value_head", dict(value_head=1)),
        # the whole rope_scaling dict is checked at construction, not first in LlamaModel(config)
        ("factor", dict(rope_scaling={"rope_type": "linear", "factor": 0.5})),
        ("low_freq_factor", dict(rope_scaling={"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0})),
        ("rope_theta", dict(rope_theta=500.0, rope_scaling={"rope_type": "linear", "factor": 2.0,
                                                            "rope_theta": 10000.0})),
    ],
)
def test_invalid_config_names_the_field(field, kwargs):
    with pytest.raises(ValueError, match=field):
        small_config(**kwargs)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(vocab_size=0), "vocab_size must satisfy 1 <= vocab_size, got 0"),
        (dict(rope_theta=0.5), "rope_theta must satisfy 1 < rope_theta, got 0.5"),
        (dict(pad_token_id=-1), "pad_token_id must satisfy 0 <= pad_token_id < 59, got -1"),
        (dict(rope_scaling={"rope_type": "cubic"}), "rope_type must be one of .*'default'.*'llama3'"),
    ],
)
def test_invalid_config_message_gives_the_allowed_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        small_config(**kwargs)


def test_rope_scaling_is_normalised_at_construction():
    legacy = small_config(rope_scaling={"type": "linear", "factor": 2.0, "rope_theta": 10000.0})
    assert legacy.rope_scaling == {"factor": 2.0, "rope_type": "linear"}  # legacy key folded, theta dropped
    assert small_config(rope_scaling={"rope_type": "default"}).rope_scaling is None


def test_truncated_checkpoint_raises_clear_error(tmp_path):
    model = LlamaModel(small_config())
    folder = save_pretrained(model, tmp_path / "ckpt")
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        from_pretrained(folder)


def test_mismatched_checkpoint_names_the_tensor(tmp_path):
    folder = save_pretrained(LlamaModel(small_config()), tmp_path / "ckpt")
    config = json.loads((folder / "config.json").read_text())
    config["intermediate_size"] = 80
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="mlp.*shape"):
        from_pretrained(folder)
    with pytest.raises(CheckpointError, match="config.json not found"):
        from_pretrained(tmp_path / "nowhere")


def test_save_is_atomic_when_interrupted(tmp_path, monkeypatch):
    import rlhf_lab.model.hf as hf_module

    model = LlamaModel(small_config())
    folder = save_pretrained(model, tmp_path / "ckpt")
    before = (folder / "model.safetensors").read_bytes()

    def exploding_save(*args, **kwargs):
        raise KeyboardInterrupt

    def disk_full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    with torch.no_grad():
        model.lm_head.weight.add_(1.0)
    for failure, error in ((exploding_save, KeyboardInterrupt), (disk_full, OSError)):
        monkeypatch.setattr(hf_module, "write_bytes", failure)
        with pytest.raises(error) as raised:
            save_pretrained(model, folder)
        assert (folder / "model.safetensors").read_bytes() == before  # old checkpoint untouched
        assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]  # no temp folder left behind
    assert raised.value.filename == str(folder)  # the folder being saved, not a temporary name


def test_backward_reaches_every_parameter():
    torch.manual_seed(0)
    model = LlamaModel(small_config(value_head=True))
    ids, mask = padded_batch(59, [6, 4])
    out = model(ids, attention_mask=mask)
    (out.logits.logsumexp(-1).mean() + out.values.mean()).backward()
    for name, param in model.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), name
    assert model.model.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0
