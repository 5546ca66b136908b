"""Llama, Qwen2 and Qwen3 through the lab's model: parity with transformers built in-process.

Each case builds a small random transformers model (fp32, eager attention), copies it into the lab's
model with `from_hf`, and demands equal logits on a left-padded batch, `to_hf` round trips, and the
lab's cached greedy decoding equals transformers' `generate`. The tolerance is derived from fp32
epsilon and the length of the sums on the way to a logit (`parity_tolerance`, see
tests/test_checkpoints.py): two correct implementations differ only by summation order.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_checkpoints import SIGMAS, parity_tolerance

from rlhf_lab.model import (
    CheckpointError,
    LlamaModel,
    ModelConfig,
    config_from_hf,
    from_hf,
    from_pretrained,
    to_hf,
)
from rlhf_lab.model.hf import save_pretrained
from rlhf_lab.sampling import SamplingConfig, generate

transformers = pytest.importorskip("transformers")

VOCAB, HIDDEN = 96, 64
COMMON = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=96, num_hidden_layers=2,
              max_position_embeddings=64, rms_norm_eps=1e-6, pad_token_id=0, bos_token_id=1, eos_token_id=2)

# (id, transformers config class, kwargs): GQA everywhere, tied and untied, every family option.
CASES = [
    (
        "llama-gqa-tied",
        "LlamaConfig",
        dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
    ),
    (
        "llama-bias-headdim-untied",
        "LlamaConfig",
        dict(
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=24,
            attention_bias=True,
            mlp_bias=True,
            tie_word_embeddings=False,
            rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0},
        ),
    ),
    (
        "qwen2-gqa-tied",
        "Qwen2Config",
        dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True, rope_theta=1e6),
    ),
    (
        "qwen2-untied",
        "Qwen2Config",
        dict(num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=False),
    ),
    (
        "qwen3-gqa-tied",
        "Qwen3Config",
        dict(
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            tie_word_embeddings=True,
            rope_theta=1e6,
        ),
    ),
    (
        "qwen3-untied-yarn",
        "Qwen3Config",
        dict(
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=16,
            tie_word_embeddings=False,
            rope_parameters={
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 16,
                "rope_theta": 10000.0,
            },
        ),
    ),
]


def build_hf(class_name: str, kwargs: dict, seed: int = 0, common: dict = COMMON):
    """A random transformers model whose every parameter matters: weights of std 0.1 (logits of
    order 1, not the near-zero ones of the 0.02 default), random norm gains and biases (a q_norm
    left out or a bias dropped changes the logits by far more than the tolerance)."""
    config = getattr(transformers, class_name)(**common, **kwargs)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").float().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
            else:
                param.normal_(0.0, 0.1)
    return model


def padded_batch(seed: int = 1):
    """Three rows of different lengths, left-padded: (ids (3, 11), attention_mask, position_ids)."""
    g = torch.Generator().manual_seed(seed)
    lengths = [11, 7, 4]
    ids = torch.zeros((3, 11), dtype=torch.long)
    mask = torch.zeros((3, 11), dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, 11 - n:] = torch.randint(3, VOCAB, (n,), generator=g)
        mask[row, 11 - n:] = 1
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, position_ids


@pytest.fixture(scope="module", params=CASES, ids=[c[0] for c in CASES])
def pair(request):
    _, class_name, kwargs = request.param
    hf = build_hf(class_name, kwargs)
    return hf, from_hf(hf).eval()


def test_config_maps_every_family_option(pair):
    hf, lab = pair
    c = lab.config
    assert c.model_type == hf.config.model_type
    assert c.head_dim == getattr(hf.config, "head_dim", None) or HIDDEN // c.num_attention_heads
    assert c.tie_word_embeddings == hf.config.tie_word_embeddings
    names = {n for n, _ in lab.named_parameters()}
    assert any("q_norm" in n for n in names) == (c.model_type == "qwen3")
    assert any(n.endswith("q_proj.bias") for n in names) == (c.model_type == "qwen2" or c.attention_bias)
    assert any(n.endswith("o_proj.bias") for n in names) == c.attention_bias


def test_logits_match_transformers_on_a_padded_batch(pair):
    hf, lab = pair
    ids, mask, position_ids = padded_batch()
    with torch.no_grad():
        expected = hf(input_ids=ids, attention_mask=mask, position_ids=position_ids).logits
        got = lab(ids, attention_mask=mask).logits  # the lab derives the same position ids from the mask
    real = mask.bool()  # padded positions' outputs are never used (and each library fills them its own way)
    atol, rtol = parity_tolerance(lab.config, expected)
    torch.testing.assert_close(got[real], expected[real], atol=atol, rtol=rtol)


def test_sdpa_equals_eager(pair):
    """The fused kernel computes the same softmax(q k^T / sqrt(D) + mask) v: fp32 summation order only."""
    _, lab = pair
    sdpa = LlamaModel(ModelConfig.from_dict({**lab.config.to_dict(), "attn_implementation": "sdpa"}))
    sdpa.load_state_dict(lab.state_dict())
    ids, mask, _ = padded_batch(2)
    with torch.no_grad():
        eager_logits = lab(ids, attention_mask=mask).logits
        sdpa_logits = sdpa.eval()(ids, attention_mask=mask).logits
    real = mask.bool()
    atol, rtol = parity_tolerance(lab.config, eager_logits)
    torch.testing.assert_close(sdpa_logits[real], eager_logits[real], atol=atol, rtol=rtol)


def test_to_hf_round_trips(pair, tmp_path):
    hf, lab = pair
    back = to_hf(lab)
    assert type(back) is type(hf)
    for name, tensor in hf.state_dict().items():
        if name in back.state_dict():
            assert torch.equal(back.state_dict()[name], tensor), name  # a copy: bit-equal
    # and through a saved folder: transformers' own loader reads what the lab wrote
    save_pretrained(lab, tmp_path / "ckpt")
    reloaded = from_pretrained(tmp_path / "ckpt")
    auto = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "ckpt", attn_implementation="eager").float()
    ids, mask, position_ids = padded_batch(3)
    with torch.no_grad():
        a = reloaded(ids, attention_mask=mask).logits
        b = lab(ids, attention_mask=mask).logits
        c = auto(input_ids=ids, attention_mask=mask, position_ids=position_ids).logits
    assert torch.equal(a, b)
    atol, rtol = parity_tolerance(lab.config, c)
    torch.testing.assert_close(a[mask.bool()], c[mask.bool()], atol=atol, rtol=rtol)


def test_cached_greedy_generation_equals_transformers_generate(pair):
    hf, lab = pair
    ids, mask, _ = padded_batch(4)
    steps = 8
    # Both decode exactly `steps` tokens (no stop at EOS), so a random model's early EOS ends nothing.
    ours = generate(lab, ids, SamplingConfig(do_sample=False, max_new_tokens=steps), attention_mask=mask,
                    stop_at_eos=False).completion_ids
    with torch.no_grad():
        theirs = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=steps, min_new_tokens=steps,
                             do_sample=False, pad_token_id=0, eos_token_id=None)[:, ids.shape[1]:]
    assert torch.equal(ours, theirs)


# ---------------------------------------------------------------------------------------- refusals

REFUSED = [
    ("qwen2", {"use_sliding_window": True}, "use_sliding_window"),
    ("qwen3", {"layer_types": ["full_attention", "sliding_attention"]}, "layer_types"),
    ("llama", {"hidden_act": "gelu"}, "hidden_act"),
    ("llama", {"attention_dropout": 0.1}, "attention_dropout"),
    ("llama", {"rope_scaling": {"rope_type": "longrope", "factor": 2.0}}, "rope_type"),
    ("mistral", {}, "model_type"),
    ("qwen3", {"mlp_bias": True}, "mlp_bias"),
]


@pytest.mark.parametrize("model_type,options,named", REFUSED, ids=[r[2] + "-" + r[0] for r in REFUSED])
def test_unsupported_options_are_refused_by_name(model_type, options, named):
    config = {"model_type": model_type, **COMMON, "num_attention_heads": 4, "num_key_value_heads": 2,
              **options}
    with pytest.raises((CheckpointError, ValueError), match=named):
        config_from_hf(config)


# ------------------------------------------------------------------------------ bf16 on the CPU

UNIT_ROUNDOFF_BF16 = torch.finfo(torch.bfloat16).eps / 2  # 2^-8: bf16 keeps 8 significant bits


def test_bf16_autocast_stays_close_to_fp32():
    """Under bf16 autocast every matmul input is rounded to 8 significant bits (relative error up to
    u = 2^-8 per factor), while norms, RoPE, softmax and the logits stay fp32. A dot product of
    rounded random-sign terms keeps a relative error ~u; the errors of the 9 products per layer
    (q, k, v, o, gate, up, down, q.k, weights.v) add like a random walk along the residual stream,
    so |logit error| ~ u * sqrt(stages) * scale, with scale = max|logit|, and SIGMAS standard
    deviations bound the largest of the batch: 0.24 here, where 0.026 is measured on one x86 CPU.
    Resetting Qwen3's q_norm gains to 1 (a norm silently not loaded) moves the logits by 0.75."""
    hf = build_hf("Qwen3Config", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32))
    lab = from_hf(hf).eval()
    ids, mask, _ = padded_batch()
    with torch.no_grad():
        fp32 = lab(ids, attention_mask=mask).logits
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf16 = lab(ids, attention_mask=mask).logits
    assert bf16.dtype == torch.float32  # the logits are computed in fp32 under autocast
    stages = 9 * lab.config.num_hidden_layers + 1
    atol = SIGMAS * UNIT_ROUNDOFF_BF16 * math.sqrt(stages) * fp32.abs().max().item()
    real = mask.bool()
    error = (bf16[real] - fp32[real]).abs().max().item()
    assert error <= atol, f"bf16 logits differ by {error:.3g} > {atol:.3g}"
    assert error > 0  # autocast really ran in bf16 (else this test would test nothing)
