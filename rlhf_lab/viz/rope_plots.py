"""Pictures of rotary position embeddings (RoPE) for the RoPE notebook, and a RoPE explorer.

Every function is pure. The `plot_*` functions return a matplotlib Figure (made by `new_figure`, so it
is shown once in a notebook and never piles up in pyplot). Beside each picture sits the exhibit it
draws, returning tensors the notebook also prints and the tests check: `rotate_2d`, `relative_score`,
`rope_decay_bound`, `angle_precision_error`. The mechanism itself (frequencies, scaling variants,
`apply_rope`) comes from `rlhf_lab.model.rope`.

    from rlhf_lab.viz.rope_plots import plot_rope_scaling, rope_explorer
    plot_rope_scaling(head_dim=128, factor=4.0, original_max_position_embeddings=2048)
    rope_explorer()          # sliders in Jupyter (pair, position, base); a static Figure elsewhere

Importing this module registers the explorer, so `rlhf_lab.viz.explore("rope")` finds it afterwards.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from matplotlib.figure import Figure

from ..model.rope import YARN_BETA_FAST, YARN_BETA_SLOW, apply_rope, rope_inv_freq
from ..util.validation import check_number
from .style import new_figure
from .widgets import LogSlider, make_explorer, register_explorer

# One colour per RoPE variant (Okabe & Ito), the same in every plot of the notebook.
ROPE_TYPE_COLORS: dict[str, str] = {
    "default": "#000000",
    "linear": "#e69f00",
    "dynamic": "#56b4e9",
    "yarn": "#009e73",
    "llama3": "#cc79a7",
}
DTYPE_COLORS: dict[str, str] = {"float16": "#d55e00", "bfloat16": "#0072b2", "float32": "#009e73"}
Q_COLOR, K_COLOR = "#0072b2", "#d55e00"


def scaling_variants(factor: float = 4.0,
                     original_max_position_embeddings: int = 2048) -> dict[str, dict | None]:
    """The `rope_scaling` dict of each context-extension method, for one extension factor.

    Parameter values are the ones the papers and released configs use: YaRN's beta_fast 32 and
    beta_slow 1 (arXiv 2309.00071), Llama 3.1's low_freq_factor 1 and high_freq_factor 4.
    """
    original = original_max_position_embeddings
    return {
        "default": None,
        "linear": {"rope_type": "linear", "factor": factor},
        "dynamic": {"rope_type": "dynamic", "factor": factor},
        "yarn": {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": original,
                 "beta_fast": float(YARN_BETA_FAST), "beta_slow": float(YARN_BETA_SLOW)},
        "llama3": {"rope_type": "llama3", "factor": factor, "original_max_position_embeddings": original,
                   "low_freq_factor": 1.0, "high_freq_factor": 4.0},
    }


def scaled_frequencies(
    head_dim: int = 128, base: float = 10000.0, factor: float = 4.0,
    original_max_position_embeddings: int = 2048,
) -> dict[str, tuple[torch.Tensor, float]]:
    """rope type -> (inv_freq (head_dim // 2,) float32, attention_scaling), at the extended length.

    "dynamic" is evaluated at seq_len = factor * original (the length the extension is for); below the
    original length it equals "default".
    """
    variants = scaling_variants(factor, original_max_position_embeddings)
    extended = int(round(factor * original_max_position_embeddings))
    return {
        name: rope_inv_freq(head_dim, base, scaling, original_max_position_embeddings,
                            seq_len=extended if name == "dynamic" else None)
        for name, scaling in variants.items()
    }


# ----------------------------------------------------------------------------------------------
# one 2-D pair: a rotation, and why only the offset survives the dot product


def rotate_2d(vec: torch.Tensor, angle) -> torch.Tensor:
    """Rotate 2-D vectors counter-clockwise: (x, y) -> (x cos a - y sin a, x sin a + y cos a).

    vec (..., 2); angle a number or a tensor broadcastable to vec.shape[:-1]. Returns (..., 2).
    """
    vec = torch.as_tensor(vec)
    vec = vec.double() if not vec.is_floating_point() else vec
    angle = torch.as_tensor(angle, dtype=vec.dtype)
    x, y = vec[..., 0], vec[..., 1]
    c, s = angle.cos(), angle.sin()
    return torch.stack((x * c - y * s, x * s + y * c), dim=-1)


def _arrow(ax, vec, color, label=None, alpha=1.0, linestyle="-"):
    ax.annotate("", xy=(float(vec[0]), float(vec[1])), xytext=(0, 0),
                arrowprops=dict(arrowstyle="-|>", color=color, alpha=alpha, linewidth=2, linestyle=linestyle))
    if label:
        ax.text(1.12 * float(vec[0]), 1.12 * float(vec[1]), label, color=color, ha="center", va="center",
                fontsize=10, alpha=alpha)


def plot_rotation_2d(
    q: Sequence[float] = (1.0, 0.25),
    k: Sequence[float] = (0.55, 0.75),
    theta: float = 0.35,
    m: int = 2,
    n: int = 5,
    shift: int = 4,
) -> Figure:
    """One 2-D pair of a query and a key, rotated for two position pairs with the same offset.

    Left: q at position m (angle m theta), k at position n. Right: both moved by `shift`. Both arrows
    turn by shift * theta, so the angle between them, (n - m) theta, and their dot product stay the same.
    Faint arrows: q and k before any rotation (position 0).
    """
    q_vec, k_vec = torch.tensor(q, dtype=torch.float64), torch.tensor(k, dtype=torch.float64)
    fig = new_figure((9.0, 4.4))
    axes = fig.subplots(1, 2)
    circle = np.linspace(0, 2 * np.pi, 200)
    for ax, (pos_q, pos_k) in zip(axes, ((m, n), (m + shift, n + shift))):
        q_rot, k_rot = rotate_2d(q_vec, pos_q * theta), rotate_2d(k_vec, pos_k * theta)
        ax.plot(np.cos(circle), np.sin(circle), color="#dddddd", linewidth=1)
        _arrow(ax, q_vec, Q_COLOR, alpha=0.25, linestyle="--")
        _arrow(ax, k_vec, K_COLOR, alpha=0.25, linestyle="--")
        _arrow(ax, q_rot, Q_COLOR, f"$R_{{{pos_q}}}q$")
        _arrow(ax, k_rot, K_COLOR, f"$R_{{{pos_k}}}k$")
        angle_q, angle_k = math.atan2(q_rot[1], q_rot[0]), math.atan2(k_rot[1], k_rot[0])
        arc = np.linspace(angle_q, angle_q + ((angle_k - angle_q + np.pi) % (2 * np.pi) - np.pi), 50)
        ax.plot(0.35 * np.cos(arc), 0.35 * np.sin(arc), color="grey", linewidth=1.5)
        score = float(q_rot @ k_rot)
        ax.set(
            xlim=(-1.35, 1.35),
            ylim=(-1.35, 1.35),
            aspect="equal",
            xlabel="dimension 2i (first of the pair)",
            ylabel="dimension 2i+1 (second)",
            title=f"m = {pos_q}, n = {pos_k}:  <R_m q, R_n k> = {score:.4f}",
        )
        ax.grid(alpha=0.3)
    fig.suptitle(f"theta = {theta} rad per position: the angle between q and k is (n - m) theta "
                 f"= {(n - m) * theta:.2f} rad in both panels")
    return fig


def plot_pairings(head_dim: int = 8) -> Figure:
    """Which dimensions of one head form rotation pair i, in the two conventions.

    Each square is a dimension of q (or k); its colour and label are its pair index i (frequency theta_i).
    Top: Meta's interleaved pairs (2i, 2i+1). Bottom: GPT-NeoX / HF half-split pairs (i, i + d/2).
    """
    half = head_dim // 2
    colors = [f"C{i % 10}" for i in range(half)]
    layouts = {
        "interleaved (Meta llama): pair i = dims (2i, 2i+1)": [dim // 2 for dim in range(head_dim)],
        "half-split (GPT-NeoX, HF): pair i = dims (i, i + d/2)": [dim % half for dim in range(head_dim)],
    }
    fig = new_figure((0.75 * head_dim + 1.5, 2.6))
    ax = fig.subplots()
    for row, (title, pairs) in enumerate(layouts.items()):
        y = 1 - row
        for dim, pair in enumerate(pairs):
            ax.add_patch(_square(dim, y, colors[pair]))
            ax.text(dim + 0.5, y + 0.45, f"i={pair}", ha="center", va="center", fontsize=9, color="white",
                    fontweight="bold")
            ax.text(dim + 0.5, y + 0.02, f"dim {dim}", ha="center", va="bottom", fontsize=7, color="white")
        ax.text(0.05, y + 0.97, title, fontsize=10, va="center")
    ax.set(xlim=(-0.2, head_dim + 0.2), ylim=(-0.1, 2.15))
    ax.axis("off")
    return fig


def _square(x, y, color):
    from matplotlib.patches import Rectangle

    return Rectangle((x + 0.05, y + 0.05), 0.9, 0.8, facecolor=color, edgecolor="white")


# ----------------------------------------------------------------------------------------------
# relative position and long-range decay


def relative_score(
    q: torch.Tensor,
    k: torch.Tensor,
    m,
    n,
    base: float = 10000.0,
    interleaved: bool = False,
) -> torch.Tensor:
    """The attention logit <R_m q, R_n k> between a query at position m and a key at position n.

    It depends only on m - n: <R_m q, R_n k> = <q, R_m^T R_n k> = <q, R_{n-m} k>.

    Args:
        q, k: (head_dim,) vectors.
        m, n: positions, ints or integer tensors of the same shape (num_pairs,).
    Returns:
        float32 tensor of shape () for int positions, else (num_pairs,).
    """
    head_dim = q.shape[-1]
    m, n = torch.as_tensor(m), torch.as_tensor(n)
    scalar = m.dim() == 0 and n.dim() == 0
    m, n = torch.broadcast_tensors(m.reshape(-1), n.reshape(-1))
    inv_freq, _ = rope_inv_freq(head_dim, base)

    def rotated(vec: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        angles = positions.double()[:, None] * inv_freq.double()  # (num_pairs, d/2)
        x = vec.double().expand(1, 1, len(positions), head_dim)  # (batch=1, heads=1, num_pairs, d)
        return apply_rope(x, angles.cos()[None], angles.sin()[None], interleaved)[0, 0]

    scores = (rotated(q, m) * rotated(k, n)).sum(dim=-1).float()  # (num_pairs,)
    return scores[0] if scalar else scores


def plot_relative_scores(q: torch.Tensor, k: torch.Tensor, num_positions: int = 48, base: float = 10000.0,
                         offsets: Sequence[int] = (0, 1, 4, 16)) -> Figure:
    """The RoPE attention logit <R_m q, R_n k> for every query position m and key position n.

    Left: the (num_positions, num_positions) matrix; it is constant along each diagonal (a Toeplitz
    matrix), because it depends only on m - n. Right: the same logit along a few diagonals against m.
    q, k: (head_dim,).
    """
    positions = torch.arange(num_positions)
    m_grid, n_grid = torch.meshgrid(positions, positions, indexing="ij")
    scores = relative_score(
        q, k, m_grid.reshape(-1), n_grid.reshape(-1), base=base).reshape(num_positions, num_positions)
    fig = new_figure((10.0, 4.2))
    left, right = fig.subplots(1, 2)
    limit = float(scores.abs().max())
    image = left.imshow(scores.numpy(), cmap="RdBu_r", vmin=-limit, vmax=limit, origin="upper")
    fig.colorbar(image, ax=left, label="<R_m q, R_n k>")
    left.set(xlabel="key position n", ylabel="query position m", title="logit for every (m, n)")
    for offset in offsets:
        m_values = torch.arange(offset, num_positions)
        diagonal = relative_score(q, k, m_values, m_values - offset, base=base)
        right.plot(m_values.numpy(), diagonal.numpy(), marker=".", label=f"m - n = {offset}")
    right.set(xlabel="query position m", ylabel="<R_m q, R_{m-offset} k>",
              title="along a diagonal: flat (one value per offset)")
    right.legend(frameon=False, fontsize=8)
    right.grid(alpha=0.3)
    return fig


def logits_at_distance(q: torch.Tensor, k: torch.Tensor, distances: torch.Tensor, base: float = 10000.0
                       ) -> torch.Tensor:
    """<R_0 q, R_delta k> = <q, R_delta k> for many (q, k) pairs and distances.

    q, k: (num_pairs, head_dim); distances: (num_distances,) ints. Returns float32 (num_pairs, num_distances).
    """
    inv_freq, _ = rope_inv_freq(q.shape[-1], base)
    angles = distances.double()[:, None] * inv_freq.double()  # (D, d/2)
    keys = k.float()[:, None, None, :].expand(-1, 1, len(distances), -1)  # (N, heads=1, D, d)
    rotated = apply_rope(keys, angles.cos().float(), angles.sin().float())[:, 0]  # (N, D, d)
    return (rotated * q.float()[:, None, :]).sum(-1)


def rope_decay_bound(distances, head_dim: int = 128, base: float = 10000.0) -> torch.Tensor:
    """RoFormer's long-term decay (section 3.4.3), as the relative bound plotted in the paper.

    |score(m, n)| <= max_j |h_{j+1} - h_j| * sum_{j=1..d/2} |S_j|, with S_j = sum_{k=0}^{j-1} e^{i (m-n)
    theta_k}.
    This returns (1 / (d/2)) * sum_{j=1..d/2} |S_j| (the mean of |S_j|): d/4 + 1/2 = 32.5 at distance 0 for
    d = 128, about 18.0 at 10, 10.2 at 100 and 4.5 at 1000, decaying while it oscillates.

    Args:
        distances: |m - n|, a number or tensor of any shape (float ok).
    Returns:
        float64 tensor with the shape of `distances`.
    """
    distances = torch.as_tensor(distances, dtype=torch.float64)
    theta = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # theta_k, (d/2,)
    phases = torch.polar(torch.ones_like(theta), distances[..., None] * theta)  # e^{i (m-n) theta_k}
    partial_sums = phases.cumsum(dim=-1)  # S_j for j = 1 .. d/2 (S_j holds terms k = 0 .. j-1)
    return partial_sums.abs().mean(dim=-1)  # (1 / (d/2)) sum_j |S_j|


def plot_decay_bound(max_distance: int = 10000, head_dim: int = 128,
                     bases: Sequence[float] = (10000.0, 500000.0), num_points: int = 2000,
                     num_random: int = 256, seed: int = 0) -> Figure:
    """RoFormer's long-term decay bound (section 3.4.3) against the relative distance |m - n| (log x).

    Left: (1/(d/2)) sum_j |S_j| from `rope_decay_bound`, for each base, distances 1 .. max_distance
    (the value at 0 is d/4 + 1/2). Right, everything divided by its value at distance 0 (first base):
    the bound; the logit for q = k = all-ones (= 2 sum_i cos(|m-n| theta_i)); and the root-mean-square
    logit of `num_random` independent Gaussian (q, k) pairs, which does not decay at all.
    """
    distances = torch.unique(torch.cat(
        (torch.arange(1, 50), torch.logspace(0, math.log10(max_distance), num_points).round())).long())
    fig = new_figure((11.0, 4.0))
    left, right = fig.subplots(1, 2)
    for index, base in enumerate(bases):
        bound = rope_decay_bound(distances, head_dim, base)
        left.plot(distances.numpy(), bound.numpy(), color=f"C{index}", linewidth=1.2, label=f"base {base:g}")
    left.set(xscale="log", xlabel="relative distance |m - n| (tokens)", ylabel="(1/(d/2)) sum_j |S_j|",
             title=f"RoFormer's relative upper bound, d = {head_dim}")

    base = bases[0]
    with_zero = torch.cat((torch.zeros(1, dtype=torch.long), distances))
    bound = rope_decay_bound(with_zero, head_dim, base)
    ones = torch.ones(1, head_dim)
    ones_logit = logits_at_distance(ones, ones, with_zero, base)[0]
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(num_random, head_dim, generator=generator)
    k = torch.randn(num_random, head_dim, generator=generator)
    random_rms = logits_at_distance(q, k, with_zero, base).pow(2).mean(0).sqrt()
    x = distances.numpy()
    right.plot(x, (bound[1:] / bound[0]).numpy(), color="C0", linewidth=1.2, label="bound")
    right.plot(x, (ones_logit[1:] / ones_logit[0]).numpy(), color="black", linestyle=":", linewidth=1,
               label="logit, q = k = all-ones")
    right.plot(x, (random_rms[1:] / random_rms[0]).numpy(), color="#d55e00", linewidth=1,
               label=f"RMS logit, {num_random} random (q, k)")
    right.axhline(0, color="grey", linewidth=0.6)
    right.set(xscale="log", xlabel="relative distance |m - n| (tokens)", ylabel="value / value at distance 0",
              title=f"relative to distance 0 (base {base:g})")
    for ax in (left, right):
        ax.grid(alpha=0.3, which="both")
        ax.legend(frameon=False, fontsize=8)
    return fig


# ----------------------------------------------------------------------------------------------
# numerics: angles in fp16 / bf16


def angle_precision_error(
    positions, head_dim: int = 128, base: float = 10000.0, dtype: torch.dtype = torch.float16
) -> dict[str, torch.Tensor]:
    """How wrong RoPE's angles get when m * theta_i is computed in a low-precision dtype.

    The position, theta_i and their product are each rounded to `dtype`; cos and sin of that angle are
    then taken in float64, so the error measured is the angle's alone (the reason HF and Meta force
    float32 here: an fp16 angle gave GPT-NeoX a cos error of ~0.78 at position 1857).

    Args:
        positions: integer positions, (num_positions,) or a list.
    Returns:
        dict of float64 tensors (num_positions,), max over the d/2 frequencies:
        "position": |round_dtype(m) - m| (0 for integers up to 2048 in fp16, up to 256 in bf16),
        "angle": max_i |angle - m theta_i|, "cos" and "sin": max_i |cos(angle) - cos(m theta_i)|, etc.
    """
    positions = torch.as_tensor(positions, dtype=torch.float64).reshape(-1)
    theta = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))  # (d/2,)
    exact = positions[:, None] * theta  # m * theta_i in float64: (P, d/2)
    rounded_positions = positions.to(dtype)
    approx = (rounded_positions[:, None] * theta.to(dtype)).double()  # product rounded to dtype
    return {
        "position": (rounded_positions.double() - positions).abs(),
        "angle": (approx - exact).abs().amax(dim=-1),
        "cos": (approx.cos() - exact.cos()).abs().amax(dim=-1),
        "sin": (approx.sin() - exact.sin()).abs().amax(dim=-1),
    }


def plot_angle_precision(positions: torch.Tensor, head_dim: int = 128, base: float = 10000.0,
                         dtypes: Sequence[torch.dtype] = (torch.float16, torch.bfloat16, torch.float32),
                         ) -> Figure:
    """How wrong m * theta_i gets when it is computed in a low-precision dtype (`angle_precision_error`).

    Left: |round(m) - m|, the error in the position itself (zero up to 256 in bf16, 2048 in fp16).
    Right: max over the d/2 frequencies of |cos(angle) - cos(m theta_i)| (log y; an error of 1 or more
    means the rotation is meaningless). positions: (P,) integers.
    """
    fig = new_figure((10.0, 4.0))
    left, right = fig.subplots(1, 2)
    x = positions.numpy()
    for dtype in dtypes:
        name = str(dtype).removeprefix("torch.")
        errors = angle_precision_error(positions, head_dim, base, dtype)
        color = DTYPE_COLORS.get(name, "grey")
        left.plot(x, errors["position"].numpy(), color=color, linewidth=1, label=name)
        cos_error = errors["cos"].clamp_min(1e-9).numpy()
        right.plot(x, cos_error, color=color, linewidth=0.8, alpha=0.9, label=name)
    for limit, dtype_name in ((256, "bfloat16"), (2048, "float16")):
        for ax in (left, right):
            ax.axvline(limit, color=DTYPE_COLORS[dtype_name], linestyle=":", linewidth=1)
    left.set(xscale="log", xlabel="position m (tokens)", ylabel="|round(m) - m| (positions)",
             title="the position itself (dotted: 256 and 2048)")
    right.set(xscale="log", yscale="log", xlabel="position m (tokens)",
              ylabel="max_i |cos(angle) - cos(m theta_i)|", title=f"cos of the angle, d = {head_dim}")
    for ax in (left, right):
        ax.grid(alpha=0.3, which="both")
        ax.legend(frameon=False, fontsize=8)
    return fig


# ----------------------------------------------------------------------------------------------
# context extension: linear (PI), dynamic NTK, YaRN, llama3


def plot_rope_scaling(head_dim: int = 128, base: float = 10000.0, factor: float = 4.0,
                      original_max_position_embeddings: int = 2048) -> Figure:
    """Per-dimension-pair frequencies of the context-extension methods, at one extension factor.

    Left: wavelength 2 pi / theta_i (tokens, log y) of each pair i; dashed: the trained context and the
    extended one. Pairs whose wavelength exceeds the trained context never saw a full turn in training.
    Right: theta'_i / theta_i, how much each method slows pair i down (1 = untouched, 1/factor =
    positions squeezed like linear interpolation). "dynamic" is shown at seq_len = factor * original.
    """
    original = original_max_position_embeddings
    frequencies = scaled_frequencies(head_dim, base, factor, original)
    default = frequencies["default"][0].double()
    pairs = np.arange(head_dim // 2)
    fig = new_figure((11.0, 4.2))
    left, right = fig.subplots(1, 2)
    for name, (inv_freq, scaling) in frequencies.items():
        style = dict(color=ROPE_TYPE_COLORS[name], linewidth=2 if name == "default" else 1.5,
                     linestyle="--" if name == "default" else "-")
        label = name + (f" (cos, sin x {scaling:.3f})" if scaling != 1.0 else "")
        left.plot(pairs, (2 * math.pi / inv_freq.double()).numpy(), label=label, **style)
        right.plot(pairs, (inv_freq.double() / default).numpy(), label=name, **style)
    for length, text in ((original, "trained context"), (factor * original, f"extended x{factor:g}")):
        left.axhline(length, color="grey", linestyle=":", linewidth=1)
        left.text(0, length * 1.15, f"{text} = {length:g}", fontsize=8, color="#555555")
    right.axhline(1 / factor, color="grey", linestyle=":", linewidth=1)
    left.set(yscale="log", xlabel="dimension pair i", ylabel="wavelength 2 pi / theta_i (tokens)",
             title=f"wavelength per pair (d = {head_dim}, base {base:g})")
    right.set(xlabel="dimension pair i", ylabel="theta'_i / theta_i", ylim=(0, 1.08),
              title=f"slow-down per pair (dotted: 1/factor = {1 / factor:g})")
    for ax in (left, right):
        ax.grid(alpha=0.3, which="both")
    left.legend(frameon=False, fontsize=8)
    return fig


# ----------------------------------------------------------------------------------------------
# the explorer: one pair, one position, one base


def plot_rope_explorer(pair: int = 8, position: int = 100, base: float = 10000.0, head_dim: int = 64,
                       max_position: int = 512) -> Figure:
    """Where RoPE puts one dimension pair at one position, and how that pair compares with the others.

    Left: the unit circle of pair i; dots are positions 0 .. position (darker = later), the arrow is
    the rotation at `position` (angle m theta_i mod 2 pi). Middle: cos(m theta_i) for every pair i and
    position m (pairs on y), the chosen (pair, position) marked. Right: the wavelength of every pair
    (tokens, log y), the chosen one marked.
    """
    check_number("pair", pair, low=0, high=head_dim // 2, high_open=True, integer=True)  # head_dim // 2 pairs
    check_number("position", position, low=0)
    inv_freq, _ = rope_inv_freq(head_dim, base)
    theta = float(inv_freq[pair])
    wavelengths = 2 * math.pi / inv_freq.double()
    fig = new_figure((12.0, 4.0))
    circle_ax, heat_ax, wave_ax = fig.subplots(1, 3, gridspec_kw={"width_ratios": [1, 1.5, 1]})

    circle = np.linspace(0, 2 * np.pi, 200)
    circle_ax.plot(np.cos(circle), np.sin(circle), color="#dddddd", linewidth=1)
    trail = np.arange(0, position + 1, max(1, (position + 1) // 400))
    angles = trail * theta
    circle_ax.scatter(np.cos(angles), np.sin(angles), c=trail, cmap="viridis", s=10, zorder=2)
    angle = position * theta
    _arrow(circle_ax, (math.cos(angle), math.sin(angle)), Q_COLOR)
    circle_ax.set(xlim=(-1.3, 1.3), ylim=(-1.3, 1.3), aspect="equal", xlabel="cos(m theta_i)",
                  ylabel="sin(m theta_i)",
                  title=f"pair {pair}: theta = {theta:.3g} rad/token\nm = {position}: angle {angle:.1f} rad "
                        f"= {angle % (2 * math.pi):.2f} mod 2pi")
    circle_ax.grid(alpha=0.3)

    span = max(max_position, position + 1)
    positions = torch.arange(span, dtype=torch.float64)
    table = torch.cos(positions[None, :] * inv_freq.double()[:, None])  # (d/2, span)
    heat_ax.imshow(table.numpy(), aspect="auto", cmap="RdBu_r", vmin=-1, vmax=1, origin="lower",
                   extent=(-0.5, span - 0.5, -0.5, head_dim // 2 - 0.5), interpolation="nearest")
    heat_ax.axhline(pair, color="black", linewidth=0.8)
    heat_ax.plot([position], [pair], marker="o", markersize=7, markerfacecolor="none",
                 markeredgecolor="black")
    heat_ax.set(xlabel="position m (tokens)", ylabel="dimension pair i", title="cos(m theta_i), base "
                f"{base:g}")

    wave_ax.plot(np.arange(head_dim // 2), wavelengths.numpy(), color="#555555", marker=".", markersize=4)
    wave_ax.plot([pair], [float(wavelengths[pair])], marker="o", color=Q_COLOR, markersize=8)
    wave_ax.axhline(max(position, 1), color=Q_COLOR, linestyle=":", linewidth=1)
    wave_ax.set(yscale="log", xlabel="dimension pair i", ylabel="wavelength 2 pi / theta_i (tokens)",
                title=f"pair {pair}: {float(wavelengths[pair]):.4g} tokens per turn\n"
                      f"(dotted: position {position})")
    wave_ax.grid(alpha=0.3, which="both")
    return fig


@register_explorer("rope")
def rope_explorer(head_dim: int = 64, use_widgets: bool | None = None):
    """Sliders for the dimension pair, the position and the base around `plot_rope_explorer`."""
    return make_explorer(
        plot_rope_explorer, fixed={"head_dim": head_dim}, use_widgets=use_widgets,
        pair=(0, head_dim // 2 - 1, 1), position=(0, 4096, 1), base=LogSlider(100.0, 1e6, 10000.0),
    )
