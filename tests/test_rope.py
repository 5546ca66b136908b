"""RoPE: frequencies, cos/sin and rotation against Hugging Face transformers, plus RoPE's properties."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb
from transformers.models.llama.modeling_llama import rotate_half as hf_rotate_half

from rlhf_lab.model.rope import (
    ROPE_TYPES,
    RotaryEmbedding,
    apply_rope,
    half_split_to_interleaved,
    interleaved_to_half_split,
    rope_inv_freq,
    rotate_half,
)
from rlhf_lab.viz.rope_plots import angle_precision_error, relative_score, rope_decay_bound, rotate_2d


def hf_config(head_dim: int, base: float, rope_scaling: dict | None, max_pos: int) -> LlamaConfig:
    """A LlamaConfig carrying the same RoPE settings (transformers 5.x: everything in rope_parameters)."""
    rope_parameters = {"rope_type": "default", **(rope_scaling or {}), "rope_theta": base}
    return LlamaConfig(
        hidden_size=4 * head_dim, num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim,
        max_position_embeddings=max_pos, rope_parameters=rope_parameters, vocab_size=32,
    )


def hf_inv_freq(head_dim, base, rope_scaling, max_pos, seq_len=None):
    config = hf_config(head_dim, base, rope_scaling, max_pos)
    rope_type = config.rope_parameters["rope_type"]
    if rope_type == "default":  # 5.x keeps the default formula on the model's rotary class
        return LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    return ROPE_INIT_FUNCTIONS[rope_type](config, torch.device("cpu"), seq_len=seq_len)


# (head_dim, base, rope_scaling, max_position_embeddings, seq_len)
INV_FREQ_CASES = {
    "default": (64, 10000.0, None, 128, None),
    "default_base_500k": (128, 500000.0, None, 128, None),
    "linear": (32, 10000.0, {"rope_type": "linear", "factor": 4.0}, 128, None),
    "dynamic_at_max": (32, 10000.0, {"rope_type": "dynamic", "factor": 2.0}, 128, None),
    "dynamic_beyond_max": (32, 10000.0, {"rope_type": "dynamic", "factor": 2.0}, 128, 1000),
    "dynamic_base_1e6": (64, 1e6, {"rope_type": "dynamic", "factor": 3.0}, 256, 2049),
    "yarn": (
        64,
        10000.0,
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512},
        2048,
        None,
    ),
    "yarn_mscale_betas": (
        64,
        10000.0,
        {
            "rope_type": "yarn",
            "factor": 40.0,
            "original_max_position_embeddings": 4096,
            "mscale": 1.0,
            "mscale_all_dim": 0.707,
            "beta_fast": 16,
            "beta_slow": 2,
        },
        163840,
        None,
    ),
    "yarn_attention_factor_no_truncate": (
        32,
        10000.0,
        {
            "rope_type": "yarn",
            "factor": 8.0,
            "attention_factor": 1.3,
            "original_max_position_embeddings": 256,
            "truncate": False,
        },
        2048,
        None,
    ),
    "yarn_factor_from_lengths": (
        64,
        10000.0,
        {"rope_type": "yarn", "factor": None, "original_max_position_embeddings": 512},
        2048,
        None,
    ),
    "llama3": (
        128,
        500000.0,
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        131072,
        None,
    ),
}


@pytest.mark.parametrize("case", list(INV_FREQ_CASES))
def test_inv_freq_and_attention_scaling_equal_transformers(case):
    head_dim, base, rope_scaling, max_pos, seq_len = INV_FREQ_CASES[case]
    ours, our_scaling = rope_inv_freq(head_dim, base, rope_scaling, max_pos, seq_len=seq_len)
    theirs, their_scaling = hf_inv_freq(head_dim, base, rope_scaling, max_pos, seq_len)
    assert ours.dtype == torch.float32 and ours.shape == (head_dim // 2,)
    torch.testing.assert_close(ours, theirs, atol=0, rtol=0)  # same float32 operations: bit for bit
    assert our_scaling == pytest.approx(their_scaling, abs=1e-12)
    default, _ = rope_inv_freq(head_dim, base, None, max_pos)
    if case.startswith(("linear", "dynamic_beyond", "dynamic_base", "yarn", "llama3")):
        assert (ours / default - 1).abs().max() > 0.1, "scaling should change the frequencies"


def test_inv_freq_textbook_values():
    inv_freq, scaling = rope_inv_freq(8, 10000.0)
    torch.testing.assert_close(inv_freq, torch.tensor([1.0, 0.1, 0.01, 0.001]))  # 10000^(-2i/8)
    assert scaling == 1.0
    _, yarn_scaling = rope_inv_freq(8, rope_scaling={"rope_type": "yarn", "factor": 4.0})
    assert yarn_scaling == pytest.approx(0.1 * math.log(4.0) + 1)  # YaRN's sqrt(1/t)
    linear, _ = rope_inv_freq(8, rope_scaling={"rope_type": "linear", "factor": 2.0})
    torch.testing.assert_close(linear, inv_freq / 2)


def test_llama3_case_covers_all_three_bands():
    # guards the llama3 parity case above: kept, blended and divided frequencies must all occur
    theta, _ = rope_inv_freq(128, 500000.0)
    scaled, _ = rope_inv_freq(128, 500000.0, INV_FREQ_CASES["llama3"][2], 131072)
    ratio = theta / scaled
    assert (ratio == 1).any() and torch.isclose(ratio, torch.tensor(8.0)).any()
    assert ((ratio > 1.01) & (ratio < 7.99)).any()


def test_legacy_type_key_equals_rope_type():
    legacy, _ = rope_inv_freq(32, rope_scaling={"type": "linear", "factor": 2.0})
    modern, _ = rope_inv_freq(32, rope_scaling={"rope_type": "linear", "factor": 2.0})
    assert torch.equal(legacy, modern)
    assert set(ROPE_TYPES) == {"default", "linear", "dynamic", "yarn", "llama3"}


ROTARY_CASES = {
    "default": (16, 10000.0, None, 64),
    "linear": (16, 10000.0, {"rope_type": "linear", "factor": 2.0}, 64),
    "yarn": (32, 10000.0, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}, 64),
    "llama3": (32, 500000.0, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 32}, 256),
}


@pytest.mark.parametrize("case", list(ROTARY_CASES))
def test_cos_sin_equal_transformers(case):
    head_dim, base, rope_scaling, max_pos = ROTARY_CASES[case]
    ours = RotaryEmbedding(head_dim, base, rope_scaling, max_pos)
    theirs = LlamaRotaryEmbedding(hf_config(head_dim, base, rope_scaling, max_pos))
    position_ids = torch.randint(0, max_pos, (3, 7), generator=torch.Generator().manual_seed(0))
    cos, sin = ours(position_ids)
    hf_cos, hf_sin = theirs(torch.zeros(1, dtype=torch.float32), position_ids)
    assert cos.shape == (3, 7, head_dim // 2) and cos.dtype == torch.float32
    half = head_dim // 2
    # HF returns cat(freqs, freqs): both halves equal ours
    for hf_table, table in ((hf_cos, cos), (hf_sin, sin)):
        torch.testing.assert_close(hf_table[..., :half], table, atol=0, rtol=0)
        torch.testing.assert_close(hf_table[..., half:], table, atol=0, rtol=0)
    if case == "yarn":  # cos^2 + sin^2 = attention_scaling^2
        torch.testing.assert_close(cos**2 + sin**2, torch.full_like(cos, ours.attention_scaling**2))
        assert ours.attention_scaling > 1.1


def test_dynamic_ntk_follows_transformers_across_calls():
    head_dim, max_pos, scaling = 32, 64, {"rope_type": "dynamic", "factor": 3.0}
    ours = RotaryEmbedding(head_dim, 10000.0, scaling, max_pos)
    theirs = LlamaRotaryEmbedding(hf_config(head_dim, 10000.0, scaling, max_pos))
    original = ours.inv_freq.clone()
    generator = torch.Generator().manual_seed(1)
    # grow past the max, shrink (but stay above: HF keeps the stretched base), grow, drop below (reset)
    for length in (10, 100, 80, 300, 63, 64, 65, 1000, 5):
        position_ids = torch.randint(0, length, (2, 9), generator=generator)
        position_ids[0, 0] = length - 1  # max(position_ids) + 1 == length
        cos, sin = ours(position_ids)
        hf_cos, hf_sin = theirs(torch.zeros(1), position_ids)
        torch.testing.assert_close(cos, hf_cos[..., : head_dim // 2], atol=0, rtol=0)
        torch.testing.assert_close(sin, hf_sin[..., : head_dim // 2], atol=0, rtol=0)
        torch.testing.assert_close(ours.inv_freq, theirs.inv_freq, atol=0, rtol=0)
        if length == 300:
            expected, _ = rope_inv_freq(head_dim, 10000.0, scaling, max_pos, seq_len=300)
            torch.testing.assert_close(ours.inv_freq, expected)
            assert ours.inv_freq[-1] < 0.5 * original[-1]  # NTK stretched the slow frequencies
    assert torch.equal(ours.inv_freq, original)  # the last call (length 5) restored the trained ones


def test_inv_freq_buffer_is_float32_and_not_saved():
    rope = RotaryEmbedding(16, 10000.0, None, 64)
    assert "inv_freq" not in rope.state_dict() and len(rope.state_dict()) == 0
    expected = rope.inv_freq.clone()
    rope.to(torch.bfloat16)
    assert rope.inv_freq.dtype == torch.float32 and torch.equal(rope.inv_freq, expected)
    position_ids = torch.arange(1000)[None]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cos, sin = rope(position_ids)
    assert cos.dtype == torch.float32
    exact = position_ids[..., None].double() * expected.double()
    assert (cos.double() - exact.cos()).abs().max() < 1e-3


def test_rotate_half_equals_transformers():
    x = torch.randn(2, 3, 5, 8)
    assert torch.equal(rotate_half(x), hf_rotate_half(x))


def test_apply_rope_half_split_equals_transformers():
    generator = torch.Generator().manual_seed(2)
    q, k = torch.randn(2, 4, 6, 16, generator=generator), torch.randn(2, 2, 6, 16, generator=generator)
    position_ids = torch.randint(0, 500, (2, 6), generator=generator)
    cos, sin = RotaryEmbedding(16)(position_ids)
    hf_q, hf_k = apply_rotary_pos_emb(q, k, torch.cat((cos, cos), -1), torch.cat((sin, sin), -1))
    torch.testing.assert_close(apply_rope(q, cos, sin), hf_q, atol=0, rtol=0)  # same arithmetic, same bits
    torch.testing.assert_close(apply_rope(k, cos, sin), hf_k, atol=0, rtol=0)
    # low precision in, same dtype out, rotated in float32 underneath
    q_bf16 = apply_rope(q.bfloat16(), cos, sin)
    assert q_bf16.dtype == torch.bfloat16
    torch.testing.assert_close(q_bf16.float(), apply_rope(q.bfloat16().float(), cos, sin), atol=0.05,
                               rtol=0.01)


def complex_reference(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Meta's llama: pairs (2i, 2i+1) as complex numbers times e^{i m theta_i}. angles (batch, seq, d/2)."""
    x_complex = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    freqs_cis = torch.polar(torch.ones_like(angles), angles).unsqueeze(1)  # (batch, 1, seq, d/2)
    return torch.view_as_real(x_complex * freqs_cis).flatten(-2)


def test_interleaved_equals_complex_multiplication():
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 5, 16, generator=generator)
    position_ids = torch.randint(0, 100, (2, 5), generator=generator)
    rope = RotaryEmbedding(16)
    cos, sin = rope(position_ids)
    angles = position_ids[..., None].float() * rope.inv_freq
    torch.testing.assert_close(apply_rope(x, cos, sin, interleaved=True), complex_reference(x, angles),
                               atol=1e-6, rtol=0)
    # it is a different function from half-split on the same vector
    assert (apply_rope(x, cos, sin, interleaved=True) - apply_rope(x, cos, sin)).abs().max() > 0.5


def test_permutation_moves_rows_as_hf_conversion_script():
    head_dim, in_features = 8, 3
    weight = torch.arange(2 * head_dim, dtype=torch.float32)[:, None].repeat(1, in_features)  # row r holds r
    half = interleaved_to_half_split(weight, num_heads=2)
    # head 0: even rows (first of each pair) then odd rows; head 1 the same, offset by head_dim
    assert half[:, 0].tolist() == [0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15]
    literal = weight.view(2, head_dim // 2, 2, in_features).transpose(1, 2).reshape(2 * head_dim, in_features)
    assert torch.equal(half, literal)
    assert torch.equal(half_split_to_interleaved(half, 2), weight)
    bias = torch.randn(4 * head_dim)
    assert torch.equal(interleaved_to_half_split(half_split_to_interleaved(bias, 4), 4), bias)
    with pytest.raises(ValueError, match="num_heads"):
        interleaved_to_half_split(torch.randn(12, 3), num_heads=5)


def _gqa_scores(x, wq, wk, num_heads, num_kv_heads, head_dim, cos, sin, interleaved):
    """(batch, seq, hidden) -> attention logits (batch, heads, seq, seq), keys shared by groups of heads."""
    batch, seq, _ = x.shape
    q = (x @ wq.T).view(batch, seq, num_heads, head_dim).transpose(1, 2)
    k = (x @ wk.T).view(batch, seq, num_kv_heads, head_dim).transpose(1, 2)
    q, k = apply_rope(q, cos, sin, interleaved), apply_rope(k, cos, sin, interleaved)
    k = k.repeat_interleave(num_heads // num_kv_heads, dim=1)  # query head h reads kv head h // group
    return q @ k.transpose(-1, -2) / math.sqrt(head_dim)


@pytest.mark.parametrize("direction", ["half_split_to_interleaved", "interleaved_to_half_split"])
def test_permuted_weights_give_identical_attention_scores(direction):
    num_heads, num_kv_heads, head_dim, hidden = 4, 2, 16, 32
    generator = torch.Generator().manual_seed(4)
    wq = torch.randn(num_heads * head_dim, hidden, generator=generator) / math.sqrt(hidden)
    wk = torch.randn(num_kv_heads * head_dim, hidden, generator=generator) / math.sqrt(hidden)
    x = torch.randn(2, 12, hidden, generator=generator)
    cos, sin = RotaryEmbedding(head_dim)(torch.arange(12).expand(2, 12))
    source_interleaved = direction == "interleaved_to_half_split"
    convert = interleaved_to_half_split if source_interleaved else half_split_to_interleaved
    reference = _gqa_scores(x, wq, wk, num_heads, num_kv_heads, head_dim, cos, sin, source_interleaved)
    converted = _gqa_scores(x, convert(wq, num_heads), convert(wk, num_kv_heads), num_heads, num_kv_heads,
                            head_dim, cos, sin, not source_interleaved)
    torch.testing.assert_close(converted, reference, atol=1e-5, rtol=1e-5)
    # the other convention without the permutation: a different model
    unpermuted = _gqa_scores(x, wq, wk, num_heads, num_kv_heads, head_dim, cos, sin, not source_interleaved)
    assert (unpermuted - reference).abs().max() > 0.3 * reference.abs().max()


@pytest.mark.parametrize("interleaved", [False, True])
def test_score_depends_only_on_relative_position(interleaved):
    generator = torch.Generator().manual_seed(5)
    q, k = torch.randn(32, generator=generator), torch.randn(32, generator=generator)
    for m, n, shift in ((5, 2, 100), (0, 7, 1000), (40, 40, 3)):
        base_score = relative_score(q, k, m, n, interleaved=interleaved)
        shifted = relative_score(q, k, m + shift, n + shift, interleaved=interleaved)
        assert shifted.shape == ()
        assert shifted.item() == pytest.approx(base_score.item(), abs=1e-5)
    # vectorised: many pairs with the same offset give one value; other offsets do not
    m = torch.arange(0, 500, 50)
    same_offset = relative_score(q, k, m, m - 3, interleaved=interleaved)
    assert same_offset.shape == (10,) and (same_offset - same_offset[0]).abs().max() < 1e-4
    other_offsets = relative_score(q, k, torch.full((4,), 20), torch.tensor([16, 10, 0, 19]),
                                   interleaved=interleaved)
    assert (other_offsets - same_offset[0]).abs().min() > 1e-3


def test_rotate_2d():
    rotated = rotate_2d(torch.tensor([1.0, 0.0]), math.pi / 2)
    torch.testing.assert_close(rotated, torch.tensor([0.0, 1.0]), atol=1e-7, rtol=0)
    vecs = torch.randn(5, 2, dtype=torch.float64)
    angles = torch.linspace(0, 6, 5, dtype=torch.float64)
    out = rotate_2d(vecs, angles)
    torch.testing.assert_close(out.norm(dim=-1), vecs.norm(dim=-1))  # rotations keep length
    # rotating both vectors of a dot product by the same angle keeps it
    a, b = torch.tensor([0.3, -1.2]), torch.tensor([2.0, 0.5])
    assert (rotate_2d(a, 1.1) @ rotate_2d(b, 1.1)).item() == pytest.approx((a @ b).item(), abs=1e-6)


def test_rope_decay_bound_values():
    bound = rope_decay_bound(torch.tensor([0, 10, 100, 1000]), head_dim=128)
    assert bound[0].item() == pytest.approx(32.5)  # (1/64) * sum_{j=1..64} j
    assert bound[1].item() == pytest.approx(17.95, abs=0.05)
    assert bound[2].item() == pytest.approx(10.23, abs=0.05)
    assert bound[3].item() == pytest.approx(4.47, abs=0.05)
    # decays on average, though not monotonically
    windows = [rope_decay_bound(torch.arange(c - 5, c + 5), 128).mean() for c in (10, 100, 1000, 10000)]
    assert windows[0] > windows[1] > windows[2] > windows[3]
    wiggle = rope_decay_bound(torch.arange(100, 400), 128).diff()
    assert (wiggle > 0).any() and (wiggle < 0).any()


def test_angle_precision_error():
    far = torch.tensor([1857, 2000])
    for dtype in (torch.float16, torch.bfloat16):
        errors = angle_precision_error(far, dtype=dtype)
        assert (errors["cos"] > 0.1).all() or (errors["sin"] > 0.1).all(), dtype
        assert (torch.maximum(errors["cos"], errors["sin"]) > 0.1).all(), dtype
    errors32 = angle_precision_error(far, dtype=torch.float32)
    assert (errors32["cos"] < 1e-3).all() and (errors32["sin"] < 1e-3).all()
    # positions themselves: fp16 holds every integer up to 2048, bf16 only up to 256
    fp16 = angle_precision_error(torch.arange(0, 2050), dtype=torch.float16)["position"]
    assert (fp16[:2049] == 0).all() and fp16[2049] > 0
    bf16 = angle_precision_error(torch.arange(0, 258), dtype=torch.bfloat16)["position"]
    assert (bf16[:257] == 0).all() and bf16[257] > 0
    # near the start the fp16 angle is only off by theta's own rounding: small
    near = angle_precision_error(torch.arange(0, 8), dtype=torch.float16)
    assert near["cos"][0] == 0 and near["cos"].max() < 2e-3


INVALID = [
    ({"rope_type": "ntk-by-parts", "factor": 2.0}, "rope_type"),
    ({"rope_type": "linear"}, "factor"),
    ({"rope_type": "linear", "factor": 0.5}, "factor"),
    ({"rope_type": "dynamic", "factor": "2"}, "factor"),
    ({"rope_type": "yarn", "factor": 4.0, "attention_factor": -1.0}, "attention_factor"),
    (
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 0},
        "original_max_position_embeddings",
    ),
    ({"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0}, "low_freq_factor"),
    ({"rope_type": "yarn", "factor": 4.0, "beta_fast": "32"}, "beta_fast"),
    ({"rope_type": "yarn", "factor": 4.0, "truncate": 1}, "truncate"),
    (
        {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0},
        "high_freq_factor",
    ),
    ({"rope_type": "linear", "factr": 2.0}, "factr"),
    ({"rope_type": "default", "factor": 2.0}, "factor"),
    ({"type": "linear", "rope_type": "yarn", "factor": 2.0}, "type"),
    ({"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}, "rope_theta"),
]


@pytest.mark.parametrize("rope_scaling,field", INVALID)
def test_invalid_rope_scaling_names_the_field(rope_scaling, field):
    with pytest.raises(ValueError, match=field):
        rope_inv_freq(16, 10000.0, rope_scaling, 64)
    with pytest.raises(ValueError, match=field):
        RotaryEmbedding(16, 10000.0, rope_scaling, 64)


def test_invalid_shapes_name_the_field():
    with pytest.raises(ValueError, match="head_dim"):
        rope_inv_freq(15)
    with pytest.raises(ValueError, match="base must satisfy 1 < base"):  # names the bound too
        rope_inv_freq(16, base=0.0)
    with pytest.raises(ValueError, match="max_position_embeddings must satisfy 1 <="):
        rope_inv_freq(16, max_position_embeddings=0)
    with pytest.raises(ValueError, match=r"rope_scaling\['factor'\] must satisfy 1 <="):
        rope_inv_freq(16, rope_scaling={"rope_type": "linear", "factor": 0.5})
    with pytest.raises(ValueError, match="attention_factor.*None is also allowed"):  # optional key
        rope_inv_freq(16, rope_scaling={"rope_type": "yarn", "factor": 4.0, "attention_factor": "1"})
    with pytest.raises(ValueError, match="rope_type.*default"):  # lists the allowed values
        rope_inv_freq(16, rope_scaling={"rope_type": "su"})
