"""Pictures for the mechanism notebooks (sampling, KV cache): memory calculator, paged block tables, timings.

    from rlhf_lab.viz.mechanisms import kv_memory_explorer, plot_block_tables, plot_cache_timings
    kv_memory_explorer()                       # sliders: layers, kv heads, head_dim, dtype, batch, length
    plot_block_tables(out.cache, tokens)       # a PagedKVCache after generate(..., cache="paged")
    plot_cache_timings([16, 64], {"static": [...], "none": [...]}, batch=8)

Every function returns a matplotlib Figure (made with `new_figure`, so a notebook shows it once).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from ..model.kv_cache import kv_cache_bytes
from .style import new_figure
from .widgets import make_explorer, register_explorer

KIB, MIB, GIB = 2**10, 2**20, 2**30

SHARED_BLOCK_COLOR = "#e69f00"  # a block referenced by more than one sequence (prefix sharing)
PRIVATE_BLOCK_COLOR = "#56b4e9"  # a block owned by one sequence
FREE_BLOCK_COLOR = "#f2f2f2"  # on the free list


# ----------------------------------------------------------------------------------------------
# KV-cache memory: bytes = 2 * layers * kv_heads * head_dim * seq_len * batch * bytes_per_element


@dataclass(frozen=True)
class KVShape:
    """What the KV-cache size depends on; has the attribute names `kv_cache_bytes` reads."""

    num_hidden_layers: int
    num_key_value_heads: int
    head_dim: int
    bytes_per_element: int = 2

    def bytes_per_token(self) -> int:
        """KV bytes one token adds (all layers, keys and values, batch 1)."""
        return kv_cache_bytes(self, batch=1, seq_len=1, dtype=self.bytes_per_element)

    def nbytes(self, batch: int, seq_len: int) -> int:
        return kv_cache_bytes(self, batch=batch, seq_len=seq_len, dtype=self.bytes_per_element)


# Published configurations (config.json of each model on the Hugging Face Hub).
KV_REFERENCE_MODELS: dict[str, KVShape] = {
    "Llama-2-7B (fp16, MHA)": KVShape(
        num_hidden_layers=32, num_key_value_heads=32, head_dim=128, bytes_per_element=2
    ),
    "Llama-3-8B (bf16, GQA 8 kv heads)": KVShape(
        num_hidden_layers=32, num_key_value_heads=8, head_dim=128, bytes_per_element=2
    ),
}

DTYPE_CHOICES = [("fp32 (4 bytes)", 4), ("fp16 / bf16 (2 bytes)", 2), ("int8 (1 byte)", 1)]


def kv_shape_of(config, bytes_per_element: int = 4) -> KVShape:
    """A `KVShape` from a `ModelConfig` (or a transformers config)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return KVShape(config.num_hidden_layers, kv_heads, head_dim, bytes_per_element)


def format_bytes(n: float) -> str:
    """1536 -> '1.5 KiB' (binary units, as memory is counted)."""
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def plot_kv_memory(
    num_hidden_layers: int = 32,
    num_key_value_heads: int = 8,
    head_dim: int = 128,
    bytes_per_element: int = 2,
    batch: int = 1,
    seq_len: int = 4096,
    references: Mapping[str, KVShape] | None = None,
) -> Figure:
    """KV-cache memory against sequence length for one configuration and a few reference models (2 axes).

    Left: bytes for `batch` sequences of length 1 .. 4 * seq_len (log-log), the chosen length marked.
    Right: bytes per token of each model. The configuration's line has gid "kv:yours".
    """
    references = KV_REFERENCE_MODELS if references is None else references
    yours = KVShape(int(num_hidden_layers), int(num_key_value_heads), int(head_dim), int(bytes_per_element))
    batch, seq_len = int(batch), int(seq_len)
    lengths = np.unique(np.geomspace(1, 4 * max(seq_len, 1), 200).astype(int))
    fig = new_figure((11, 4))
    left, right = fig.subplots(1, 2, width_ratios=(3, 2))
    for i, (name, shape) in enumerate(references.items()):
        left.plot(lengths, [shape.nbytes(batch, int(s)) / GIB for s in lengths], color=f"C{i + 1}",
                  linewidth=1.2, linestyle="--", label=name)
    total = yours.nbytes(batch, seq_len)
    left.plot(lengths, [yours.nbytes(batch, int(s)) / GIB for s in lengths], color="black", linewidth=2,
              label="your configuration", gid="kv:yours")
    left.plot([seq_len], [total / GIB], "o", color="black")
    left.annotate(format_bytes(total), (seq_len, total / GIB), textcoords="offset points", xytext=(6, -12))
    left.set(
        xscale="log",
        yscale="log",
        xlabel="sequence length (tokens)",
        ylabel=f"KV cache, batch {batch} (GiB)",
        title="2 * layers * kv_heads * head_dim * seq * batch * bytes",
    )
    left.grid(alpha=0.3, which="both")
    left.legend(fontsize=8, frameon=False, loc="upper left")

    names = ["your configuration", *references]
    per_token = [yours.bytes_per_token()] + [shape.bytes_per_token() for shape in references.values()]
    colors = ["black"] + [f"C{i + 1}" for i in range(len(references))]
    bars = right.barh(np.arange(len(names)), [b / KIB for b in per_token], color=colors)
    for bar, value in zip(bars, per_token):
        right.annotate(format_bytes(value), (bar.get_width(), bar.get_y() + bar.get_height() / 2),
                       textcoords="offset points", xytext=(3, -3), fontsize=8)
    right.set_yticks(np.arange(len(names)), [n.replace(" (", "\n(") for n in names], fontsize=8)
    right.invert_yaxis()
    right.set(xscale="log", xlabel="KV bytes per token (KiB, log)", title="per token, batch 1")
    right.set_xlim(min(per_token) / KIB / 4, max(per_token) / KIB * 20)
    fig.suptitle(
        f"layers {yours.num_hidden_layers}, kv heads {yours.num_key_value_heads}, head_dim "
        f"{yours.head_dim}, {yours.bytes_per_element} B/element: {format_bytes(yours.bytes_per_token())} "
        f"per token, {format_bytes(total)} for {batch} x {seq_len} tokens"
    )
    return fig


@register_explorer("kv_memory")
def kv_memory_explorer(start: KVShape | None = None, batch: int = 1, seq_len: int = 4096,
                       references: Mapping[str, KVShape] | None = None, use_widgets: bool | None = None):
    """Sliders for the KV-memory formula, starting at `start` (default Llama-3-8B), `batch` and `seq_len`."""
    s = start or KV_REFERENCE_MODELS["Llama-3-8B (bf16, GQA 8 kv heads)"]

    def kv_memory(num_hidden_layers=s.num_hidden_layers, num_key_value_heads=s.num_key_value_heads,
                  head_dim=s.head_dim, bytes_per_element=s.bytes_per_element, batch=batch, seq_len=seq_len):
        return plot_kv_memory(
            num_hidden_layers,
            num_key_value_heads,
            head_dim,
            bytes_per_element,
            batch,
            seq_len,
            references=references,
        )

    return make_explorer(
        kv_memory, use_widgets=use_widgets,
        num_hidden_layers=(1, 128, 1), num_key_value_heads=(1, 128, 1), head_dim=(8, 256, 8),
        bytes_per_element=DTYPE_CHOICES, batch=(1, 256, 1), seq_len=(128, 131072, 128),
    )


# ----------------------------------------------------------------------------------------------
# Paged KV cache: block tables and the physical pool


def plot_block_tables(cache, tokens: Sequence[Sequence[str]] | None = None, group_size: int | None = None,
                      title: str | None = None, pool_columns: int = 12) -> Figure:
    """A `PagedKVCache` as a picture (2 axes).

    Left: one row per sequence, one box per logical block, labelled with the physical block it maps to
    (and, if `tokens` is given, the characters stored in it); orange = shared with another sequence,
    blue = private. `group_size` draws a line between the samples of different prompts.
    Right: the physical pool, each block coloured by its reference count (grey = free).
    Boxes have gid "block:<row>:<logical>" (left) and "pool:<id>" (right).

    tokens: for each sequence, one label per token position 0 .. cache.length - 1 (pad shown as given).
    """
    tables = cache.block_table_rows()
    refcount = cache.refcount
    bs, length = cache.block_size, cache.length
    n_rows = len(tables)
    n_cols = max((len(t) for t in tables), default=0)
    pool_rows = int(np.ceil(cache.num_blocks / pool_columns))
    height = max(2.5, 0.42 * max(n_rows, pool_rows) + 1.2)
    fig = new_figure((11, height))
    left, right = fig.subplots(1, 2, width_ratios=(max(n_cols, 1) * 1.6, pool_columns * 0.55))

    for row, table in enumerate(tables):
        for logical, block in enumerate(table):
            shared = refcount[block] > 1
            left.add_patch(Rectangle((logical, row), 0.94, 0.86, facecolor=SHARED_BLOCK_COLOR if shared
                                     else PRIVATE_BLOCK_COLOR, edgecolor="black", linewidth=0.6,
                                     gid=f"block:{row}:{logical}"))
            label = f"#{block}"
            if tokens is not None:
                start, end = logical * bs, min((logical + 1) * bs, length)
                label += " " + "".join(tokens[row][start:end])
            left.text(logical + 0.47, row + 0.43, label, ha="center", va="center", fontsize=7,
                      family="monospace")
        if group_size and row % group_size == 0 and row > 0:
            left.axhline(row - 0.07, color="black", linewidth=1)
    left.set_xlim(-0.1, max(n_cols, 1))
    left.set_ylim(n_rows, -0.1)
    left.set_xticks(np.arange(n_cols) + 0.47, [f"{i * bs}-{(i + 1) * bs - 1}" for i in range(n_cols)],
                    fontsize=7)
    left.set_yticks(np.arange(n_rows) + 0.43, [str(r) for r in range(n_rows)], fontsize=7)
    left.set(xlabel=f"logical block (token positions, block_size {bs})", ylabel="sequence (row)",
             title=f"block tables: {cache.blocks_in_use()} blocks in use vs "
                   f"{cache.blocks_if_contiguous()} without sharing")
    for side in ("top", "right", "bottom", "left"):
        left.spines[side].set_visible(False)

    for block in range(cache.num_blocks):
        r, c = divmod(block, pool_columns)
        count = refcount[block]
        color = FREE_BLOCK_COLOR if count == 0 else SHARED_BLOCK_COLOR if count > 1 else PRIVATE_BLOCK_COLOR
        right.add_patch(Rectangle((c, r), 0.92, 0.86, facecolor=color, edgecolor="#999999", linewidth=0.5,
                                  gid=f"pool:{block}"))
        right.text(c + 0.46, r + 0.43, f"{block}" + (f"\nx{count}" if count > 1 else ""), ha="center",
                   va="center", fontsize=6)
    right.set_xlim(-0.1, pool_columns)
    right.set_ylim(pool_rows, -0.1)
    right.set_aspect("equal")
    right.set_xticks([])
    right.set_yticks([])
    handles = [Patch(facecolor=color, edgecolor="#999999", label=label) for color, label in (
        (SHARED_BLOCK_COLOR, "shared (refcount > 1)"), (PRIVATE_BLOCK_COLOR, "private (refcount 1)"),
        (FREE_BLOCK_COLOR, "free"))]
    right.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=3, fontsize=8,
                 frameon=False)
    right.set_title(f"physical pool: {cache.num_blocks} blocks, {cache.free_blocks()} free\n(xN = refcount)",
                    fontsize=9)
    for side in ("top", "right", "bottom", "left"):
        right.spines[side].set_visible(False)
    if title:
        fig.suptitle(title)
    return fig


# ----------------------------------------------------------------------------------------------
# Timings


def plot_cache_timings(new_tokens: Sequence[int], seconds: Mapping[str, Sequence[float]], batch: int,
                       baseline: str = "none", reference: str = "static") -> Figure:
    """Generation wall time against the number of new tokens, per cache kind, and the speed-up (2 axes).

    seconds: cache kind -> wall time (s) per entry of `new_tokens`. The speed-up is
    seconds[baseline] / seconds[reference]; its line has gid "speedup".
    """
    x = np.asarray(new_tokens)
    fig = new_figure((10, 3.8))
    left, right = fig.subplots(1, 2)
    for i, (kind, values) in enumerate(seconds.items()):
        left.plot(x, values, "o-", color=f"C{i}", label=f'cache="{kind}"')
    left.set(xlabel="new tokens generated", ylabel=f"wall time for batch {batch} (s)",
             title="generate(...) time")
    left.grid(alpha=0.3)
    left.legend(frameon=False, fontsize=8)
    speedup = np.asarray(seconds[baseline]) / np.asarray(seconds[reference])
    right.plot(x, speedup, "o-", color="black", gid="speedup")
    right.axhline(1, color="grey", linestyle=":", linewidth=1)
    for xi, s in zip(x, speedup):
        right.annotate(f"{s:.1f}x", (xi, s), textcoords="offset points", xytext=(0, 6), ha="center",
                       fontsize=8)
    right.set(xlabel="new tokens generated", ylabel=f"speed-up ({baseline} / {reference})",
              title="KV-cache speed-up")
    right.set_ylim(0, None)
    right.grid(alpha=0.3)
    return fig
