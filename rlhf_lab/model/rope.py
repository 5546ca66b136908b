"""Rotary position embeddings (RoPE), the way Llama uses them.

RoPE (Su et al., RoFormer, arXiv 2104.09864) encodes position m by rotating every 2-D pair of a query
or key vector by the angle m * theta_i, with theta_i = base^(-2i/d) for i = 0 .. d/2 - 1. A rotation
preserves dot products up to the *difference* of the angles, so

    <R_m q, R_n k> = <q, R_{n-m} k>      depends only on the offset m - n.

This file holds the mechanism, everything the model needs:

- `rope_inv_freq`: the frequencies theta_i, plus the context-extension variants Hugging Face
  transformers supports ("linear", "dynamic", "yarn", "llama3"), with HF's parameter names and values
  (see transformers' `modeling_rope_utils.py`); `read_rope_scaling` validates a `rope_scaling` dict.
- `RotaryEmbedding`: position_ids -> (cos, sin), always computed in float32.
- `apply_rope`: rotate q or k, in either pairing convention (HF/GPT-NeoX half-split or Meta's
  interleaved pairs), and the weight permutation that converts between the two.

The notebook's exhibits (the long-term decay bound, the precision of angles in low-precision dtypes,
2-D rotations and relative-position scores) live beside the pictures, in `rlhf_lab.viz.rope_plots`.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..util.validation import check_bool, check_choice, check_number, check_optional

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3")

# Every key `rope_scaling` may hold (Hugging Face's names). "type" is the pre-4.45 name of "rope_type".
_ROPE_SCALING_KEYS = (
    "rope_type", "type", "rope_theta", "factor", "original_max_position_embeddings",
    "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor",
    "low_freq_factor", "high_freq_factor", "truncate",
)

# YaRN's ramp ends, in turns within the original context (arXiv 2309.00071; HF's values when unset or 0).
YARN_BETA_FAST, YARN_BETA_SLOW = 32, 1


# ---------------------------------------------------------------------------------------------
# Frequencies
# ---------------------------------------------------------------------------------------------


def check_head_dim(head_dim: int) -> None:
    """Raise ValueError unless head_dim is a positive even integer (RoPE rotates pairs of dimensions)."""
    check_number("head_dim", head_dim, low=1, integer=True)
    if head_dim % 2:
        raise ValueError(f"head_dim must be even (RoPE rotates pairs of dimensions), got {head_dim}")


def read_rope_scaling(rope_scaling: dict | None, base: float) -> dict:
    """Validate `rope_scaling` and return a copy with a single `rope_type` key (legacy `type` folded in).

    Used by `rope_inv_freq`, `RotaryEmbedding` and `ModelConfig`, so a bad dict fails where it is given.
    A `rope_theta` key (transformers 5.x keeps it in `rope_parameters`) must equal `base` and is dropped.
    """
    if rope_scaling is None:
        return {"rope_type": "default"}
    if not isinstance(rope_scaling, dict):
        raise ValueError(f"rope_scaling must be a dict or None, got {type(rope_scaling).__name__}")
    unknown = sorted(set(rope_scaling) - set(_ROPE_SCALING_KEYS))
    if unknown:
        raise ValueError(f"unknown rope_scaling key(s) {unknown}; allowed keys: {list(_ROPE_SCALING_KEYS)}")
    params = dict(rope_scaling)
    legacy_type = params.pop("type", None)
    rope_type = params.setdefault("rope_type", legacy_type or "default")
    if legacy_type is not None and legacy_type != rope_type:
        raise ValueError(f"rope_scaling has rope_type={rope_type!r} but legacy type={legacy_type!r}; "
                         "give one")
    check_choice("rope_type", rope_type, ROPE_TYPES)
    # transformers 5.x keeps rope_theta inside rope_parameters; accept it, but only if it agrees with base.
    rope_theta = params.pop("rope_theta", None)
    if rope_theta is not None and rope_theta != base:
        raise ValueError(f"rope_scaling['rope_theta']={rope_theta} disagrees with base={base}; "
                         "pass base only")

    if rope_type == "default":
        extra = sorted(set(params) - {"rope_type"})
        if extra:
            raise ValueError(f"rope_type 'default' takes no scaling parameters, got {extra}")
        return params

    factor = params.get("factor")
    if factor is None and rope_type == "yarn" and "original_max_position_embeddings" in params:
        pass  # DeepSeek-style yarn: factor = max_position_embeddings / original, computed in rope_inv_freq
    else:
        check_number("rope_scaling['factor']", factor, low=1)

    check_optional(check_number, "rope_scaling['original_max_position_embeddings']",
                   params.get("original_max_position_embeddings"), low=1, integer=True)
    for name in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim"):
        check_optional(check_number, f"rope_scaling[{name!r}]", params.get(name))
    check_optional(check_number, "rope_scaling['attention_factor']", params.get("attention_factor"),
                   low=0, low_open=True)
    check_optional(check_bool, "rope_scaling['truncate']", params.get("truncate"))

    if rope_type == "llama3":  # both factors are required: there is no HF default for them
        for name in ("low_freq_factor", "high_freq_factor"):
            check_number(f"rope_scaling[{name!r}]", params.get(name), low=0, low_open=True)
        if params["high_freq_factor"] <= params["low_freq_factor"]:
            raise ValueError(
                "rope_scaling['high_freq_factor'] must be > rope_scaling['low_freq_factor'], got "
                f"{params['high_freq_factor']} <= {params['low_freq_factor']}"
            )
    return params


def _default_inv_freq(head_dim: int, base: float) -> torch.Tensor:
    """theta_i = base^(-2i/d), i = 0 .. d/2 - 1, as float32 of shape (head_dim // 2,)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim  # 2i / d
    return 1.0 / (base**exponents)  # theta_i = 1 / base^(2i/d)


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's temperature fix (arXiv 2309.00071 eq. 22): sqrt(1/t) = 0.1 * mscale * ln(factor) + 1."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def rope_inv_freq(
    head_dim: int,
    base: float = 10000.0,
    rope_scaling: dict | None = None,
    max_position_embeddings: int = 2048,
    seq_len: int | torch.Tensor | None = None,
) -> tuple[torch.Tensor, float]:
    """RoPE's inverse frequencies theta_i and the factor cos/sin get multiplied by.

    Same values as transformers' `ROPE_INIT_FUNCTIONS` (`modeling_rope_utils.py`), with its key names:

    - "default":  theta_i = base^(-2i/d).
    - "linear":   position interpolation (Chen et al. 2023): theta_i / factor, i.e. positions squeezed
                  by `factor` into the trained range.
    - "dynamic":  NTK-aware scaling applied only once the sequence outgrows the trained length:
                  base' = base * (factor * L / max_pos - (factor - 1))^(d / (d - 2)),
                  L = max(seq_len, max_position_embeddings).
    - "yarn":     (Peng et al., arXiv 2309.00071) per-frequency blend: fast dimensions (many turns
                  within `original_max_position_embeddings`) keep theta_i, slow ones get theta_i / factor,
                  a linear ramp between `beta_fast` and `beta_slow` turns; cos/sin scaled by
                  attention_factor = 0.1 ln(factor) + 1 (or the mscale / mscale_all_dim ratio).
    - "llama3":   (Llama 3.1) wavelengths shorter than original / high_freq_factor are kept, longer
                  than original / low_freq_factor divided by factor, smooth blend in between.

    Args:
        head_dim: d, the per-head size (even).
        base: the RoPE base ("rope_theta"), 10000 in Llama 1/2, 500000 in Llama 3.
        rope_scaling: None or a dict with "rope_type" (legacy "type") and that type's parameters.
        max_position_embeddings: the model's context length (dynamic scaling starts beyond it; yarn and
            llama3 use it as `original_max_position_embeddings` when that key is missing, like HF).
        seq_len: current length, used by "dynamic" only (an int, or a 0-dim integer tensor as
            `RotaryEmbedding` passes it: then base' is computed in float32, exactly like HF's forward).

    Returns:
        inv_freq: float32 (head_dim // 2,), and attention_scaling: float (1.0 except for yarn).
    """
    check_head_dim(head_dim)
    check_number("base", base, low=1, low_open=True)  # base = 1 would give every pair the same angle
    check_number("max_position_embeddings", max_position_embeddings, low=1, integer=True)
    params = read_rope_scaling(rope_scaling, base)
    rope_type = params["rope_type"]
    d = head_dim

    if rope_type == "default":
        return _default_inv_freq(d, base), 1.0

    if rope_type == "linear":
        return _default_inv_freq(d, base) / params["factor"], 1.0  # theta_i / factor

    if rope_type == "dynamic":
        factor = params["factor"]
        if isinstance(seq_len, torch.Tensor):
            # HF's forward passes max(position_ids) + 1 as a 0-dim tensor, which makes base' a float32
            # tensor rather than a Python float; follow the same path so cos/sin agree bit for bit.
            length = seq_len.clamp_min(max_position_embeddings)
        else:
            length = max_position_embeddings
            if seq_len is not None:
                length = max(int(seq_len), max_position_embeddings)
        # base' = base * (factor * L / max_pos - (factor - 1))^(d / (d - 2)); equals base while L <= max_pos
        ntk_base = base * ((factor * length / max_position_embeddings) - (factor - 1)) ** (d / (d - 2))
        return _default_inv_freq(d, ntk_base), 1.0

    original = params.get("original_max_position_embeddings") or max_position_embeddings
    factor = params.get("factor")

    if rope_type == "yarn":
        if factor is None:  # DeepSeek-V3 style: the factor is the ratio of the two context lengths
            factor = max_position_embeddings / original
            if factor < 1:
                raise ValueError(
                    "rope_scaling['factor'] is missing and max_position_embeddings / "
                    f"original_max_position_embeddings = {factor} < 1"
                )
        attention_factor = params.get("attention_factor")
        if attention_factor is None:
            mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
            if mscale and mscale_all_dim:
                attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
            else:
                attention_factor = _yarn_mscale(factor)  # 0.1 ln(s) + 1
        # HF treats 0/None as "use the paper's default"
        beta_fast = params.get("beta_fast") or YARN_BETA_FAST
        beta_slow = params.get("beta_slow") or YARN_BETA_SLOW

        def dim_for_turns(turns: float) -> float:
            # the (fractional) pair index i whose wavelength 2*pi/theta_i fits `turns` times in `original`:
            # i = d * ln(original / (2 pi turns)) / (2 ln base)
            return d * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(base))

        low, high = dim_for_turns(beta_fast), dim_for_turns(beta_slow)
        if params.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, d - 1)  # HF clamps to d - 1 (not d/2 - 1); kept for parity
        if low == high:
            high += 0.001  # avoid dividing by zero in the ramp

        theta = _default_inv_freq(d, base)  # extrapolation: keep the trained frequency
        theta_interpolated = 1.0 / (factor * base ** (torch.arange(0, d, 2).float() / d))  # theta_i / s
        # 0 for the fast dimensions, 1 for the slow ones
        ramp = ((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
        keep = 1 - ramp  # w_i, the weight on the unscaled frequency
        inv_freq = theta_interpolated * (1 - keep) + theta * keep  # (1 - w_i) theta_i / s + w_i theta_i
        return inv_freq, float(attention_factor)

    # llama3
    low_freq_factor, high_freq_factor = params["low_freq_factor"], params["high_freq_factor"]
    theta = _default_inv_freq(d, base)
    wavelen = 2 * math.pi / theta  # lambda_i = 2 pi / theta_i, in tokens
    low_freq_wavelen = original / low_freq_factor  # longer than this: interpolate fully
    high_freq_wavelen = original / high_freq_factor  # shorter than this: keep
    scaled = torch.where(wavelen > low_freq_wavelen, theta / factor, theta)
    # in between: (1 - s) theta / factor + s theta, s = (original / lambda - low) / (high - low)
    smooth = (original / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, blended, scaled), 1.0


# ---------------------------------------------------------------------------------------------
# position_ids -> (cos, sin)
# ---------------------------------------------------------------------------------------------


class RotaryEmbedding(nn.Module):
    """Turns position ids into the cos/sin tables `apply_rope` needs (one module shared by all layers).

    `inv_freq` is a non-persistent buffer: it follows `.to(device)` but is not saved in the state_dict
    (it is a function of the config; old HF checkpoints that still carry `rotary_emb.inv_freq` keys can
    drop them). A dtype cast such as `model.to(torch.bfloat16)` leaves it in float32: bf16 keeps only 8
    significant bits, so theta_i would be off by up to 0.2% and the angle of position 1000 by up to 2 radians.

    "dynamic" scaling mirrors HF's `LlamaRotaryEmbedding`: when max(position_ids) + 1 grows beyond the
    longest length seen so far (initially max_position_embeddings), inv_freq is recomputed for that length;
    once a call is shorter than max_position_embeddings again, the original frequencies come back.
    """

    def __init__(
        self,
        head_dim: int,
        base: float = 10000.0,
        rope_scaling: dict | None = None,
        max_position_embeddings: int = 2048,
    ) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.base = base
        self.rope_scaling = None if rope_scaling is None else dict(rope_scaling)
        self.max_position_embeddings = max_position_embeddings
        self.rope_type = read_rope_scaling(rope_scaling, base)["rope_type"]
        inv_freq, self.attention_scaling = rope_inv_freq(head_dim, base, rope_scaling,
                                                         max_position_embeddings)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("original_inv_freq", inv_freq.clone(), persistent=False)
        self.max_seq_len_cached = max_position_embeddings  # longest length inv_freq was built for (dynamic)

    def _apply(self, fn, recurse=True):
        # Module.to(dtype) / .half() would round the frequencies; keep them float32 on whatever device.
        kept = {name: getattr(self, name) for name in ("inv_freq", "original_inv_freq")}
        super()._apply(fn, recurse)
        for name, before in kept.items():
            after = getattr(self, name)
            if after.dtype != torch.float32:
                setattr(self, name, before.to(device=after.device))
        return self

    def _update_dynamic(self, position_ids: torch.Tensor) -> None:
        seq_len = position_ids.max().cpu() + 1  # 0-dim tensor, see rope_inv_freq
        if seq_len > self.max_seq_len_cached:  # longer than ever: stretch the base further
            inv_freq, self.attention_scaling = rope_inv_freq(
                self.head_dim, self.base, self.rope_scaling, self.max_position_embeddings, seq_len=seq_len
            )
            self.inv_freq = inv_freq.to(self.inv_freq.device)
            self.max_seq_len_cached = int(seq_len)
        if seq_len < self.max_position_embeddings < self.max_seq_len_cached:  # short again: exact freqs
            self.inv_freq = self.original_inv_freq.clone()
            self.max_seq_len_cached = self.max_position_embeddings

    def forward(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """position_ids (batch, seq) int -> (cos, sin), each float32 (batch, seq, head_dim // 2).

        cos[b, t, i] = attention_scaling * cos(position_ids[b, t] * theta_i), same for sin.
        """
        if self.rope_type == "dynamic":
            self._update_dynamic(position_ids)
        # Under autocast a matmul-style product would drop to bf16 and lose the angle; keep float32.
        with torch.autocast(device_type=position_ids.device.type, enabled=False):
            angles = position_ids[..., None].float() * self.inv_freq.float()  # m * theta_i: (batch, seq, d/2)
            cos, sin = angles.cos(), angles.sin()
            if self.attention_scaling != 1.0:
                cos, sin = cos * self.attention_scaling, sin * self.attention_scaling
        return cos, sin

    def extra_repr(self) -> str:
        return (f"head_dim={self.head_dim}, base={self.base}, rope_type={self.rope_type!r}, "
                f"max_position_embeddings={self.max_position_embeddings}")


# ---------------------------------------------------------------------------------------------
# Rotating q and k
# ---------------------------------------------------------------------------------------------


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """GPT-NeoX / HF helper: (x1, x2) -> (-x2, x1) on the two halves of the last dim.

    x (..., d) -> (..., d). With it, half-split RoPE reads x * cat(cos, cos) + rotate_half(x) * cat(sin, sin).
    """
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               interleaved: bool = False) -> torch.Tensor:
    """Rotate each pair of dims of x by its angle: (a, b) -> (a cos - b sin, a sin + b cos).

    Args:
        x: queries or keys, (batch, heads, seq, head_dim), any float dtype.
        cos, sin: (batch, seq, head_dim // 2) from `RotaryEmbedding`, broadcast over heads; or already
            shaped to broadcast against x: (batch, 1, seq, head_dim // 2), or (seq, head_dim // 2) when every
            row has the same positions.
        interleaved: which dims form pair i.
            False: (i, i + d/2), the half-split layout of HF transformers and GPT-NeoX: with a, b the two
            halves of x, x * [cos | cos] + rotate_half(x) * [sin | sin] = [a cos - b sin | b cos + a sin].
            True: (2i, 2i + 1), Meta's llama, which views x as d/2 complex numbers times e^{i m theta_i}.

    Returns:
        x rotated, same shape and dtype as x. The arithmetic is done in float32 (float64 for float64
        inputs), like Meta's reference; HF instead rounds cos/sin to the model dtype first.
    """
    low_precision = x.dtype not in (torch.float32, torch.float64)
    x_c = x.float() if low_precision else x  # fp16/bf16 -> fp32; fp32 and fp64 stay as they are
    if cos.dim() == 3:
        cos, sin = cos.unsqueeze(-3), sin.unsqueeze(-3)  # (batch, 1, seq, d/2), shared by all heads
    cos, sin = cos.to(x_c.dtype), sin.to(x_c.dtype)
    if interleaved:
        first, second = x_c[..., 0::2], x_c[..., 1::2]
        rotated_first = first * cos - second * sin  # a' = a cos - b sin
        rotated_second = second * cos + first * sin  # b' = b cos + a sin
        out = torch.stack(  # put each pair back side by side: (..., d/2, 2) -> (..., d)
            (rotated_first, rotated_second), dim=-1).flatten(-2)
    else:
        cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)  # dims i, i + d/2: one angle
        out = x_c * cos + rotate_half(x_c) * sin
    return out.to(x.dtype)


def interleaved_to_half_split(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Reorder q_proj / k_proj output rows from Meta's interleaved pairs to HF's half-split pairs.

    Within each head, row 2i + r (r = 0, 1) moves to row r * d/2 + i, exactly what transformers'
    `convert_llama_weights_to_hf.py` does:
    w.view(num_heads, d // 2, 2, in).transpose(1, 2).reshape(num_heads * d, in).

    Why only q and k: RoPE acts on q and k just before their dot product. Permuting the dims of q and k
    by the same permutation P leaves q . k unchanged (P is orthogonal) and turns every interleaved pair
    (2i, 2i+1) into the half-split pair (i, i + d/2), so the rotation matches too: the attention scores are
    identical. v and o never get rotated and q . k does not care about the order of dims, so their
    weights stay as they are. The permutation is per head (pairs never cross heads), so for k pass
    num_key_value_heads.

    Args:
        weight: (num_heads * head_dim, in_features) Linear weight, or its (num_heads * head_dim,) bias.
        num_heads: number of heads this projection produces.
    Returns:
        a new tensor of the same shape.
    """
    head_dim = _head_dim_of(weight, num_heads)
    rows = weight.reshape(num_heads, head_dim // 2, 2, -1)  # [h, i, r] = row 2i + r
    return rows.transpose(1, 2).reshape(weight.shape)  # [h, r, i] = row r * d/2 + i


def half_split_to_interleaved(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Inverse of `interleaved_to_half_split`: row r * d/2 + i of each head moves to row 2i + r.

    weight: (num_heads * head_dim, in_features) or (num_heads * head_dim,); returns the same shape.
    Needed only for q_proj and k_proj (see `interleaved_to_half_split`).
    """
    head_dim = _head_dim_of(weight, num_heads)
    rows = weight.reshape(num_heads, 2, head_dim // 2, -1)  # [h, r, i] = row r * d/2 + i
    return rows.transpose(1, 2).reshape(weight.shape)  # [h, i, r] = row 2i + r


def _head_dim_of(weight: torch.Tensor, num_heads: int) -> int:
    if weight.dim() not in (1, 2):
        raise ValueError("weight must be a Linear weight (out, in) or bias (out,), "
                         f"got shape {tuple(weight.shape)}")
    check_number("num_heads", num_heads, low=1, integer=True)
    out_features = weight.shape[0]
    if out_features % num_heads or (out_features // num_heads) % 2:
        raise ValueError(
            f"weight rows ({out_features}) must split into num_heads={num_heads} heads of even size"
        )
    return out_features // num_heads
