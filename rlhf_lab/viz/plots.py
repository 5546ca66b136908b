"""Static plots of a run: the dashboard's panels, comparisons of runs, and PNGs for the CLI.

    plot_history({"grpo": h1, "gspo": h2}, metrics=["reward_mean", "kl_k3"])   # runs side by side
    plot_dashboard(trainer.history, trainer.distributions, trainer.config)     # the dashboard, once
    plot_dashboard(..., view="full")                                           # every panel
    save_training_plots(trainer.history, trainer.distributions, "runs/grpo")   # curves.png, dashboard.png
    smooth(history["loss"], window=20)                                         # trailing mean, for curves

Three dashboards: "rl" for the RL `Trainer`, "sft" (6 panels, `SFT_DASHBOARD_PANELS`: loss, held-out
accuracy, learning rate, gradient norm, step time, throughput) for `SFTTrainer`, and "dpo" (6 panels)
for `DPOTrainer`. The RL dashboard has two views: "main" (`MAIN_PANELS`, six large panels a learner
reads: reward, accuracy, KL, entropy, advantages, rewards per group) and "full" (`DASHBOARD_PANELS`,
twelve: clipping, length, truncation, time per step and the importance ratios too). A panel with no
information in the run so far (on-policy ratios that are all exactly 1, a clip fraction or a truncation
rate that is 0 at every step) becomes a one-line note: in the full view in its place, in the main view
in the line under the panels. `dashboard_kind` picks a kind from the trainer's `dashboard_kind`
attribute or, for a bare history, from its columns; nothing here imports a trainer.

Every `draw_*` function draws one panel into an existing axes and copes with what a real run
produces: the step-0 row (only `eval_accuracy` is set), columns that are missing or all NaN,
no distributions (`keep_distributions=False`), and algorithms without groups (PPO, G = 1).
`LiveDashboard` redraws the same panels while a run trains.

Type is at least `MIN_FONT_SIZE` (9 pt) in every view, so a dashboard stays readable at notebook width.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import torch
from matplotlib.axes import Axes
from matplotlib.colors import to_hex, to_rgb
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter, NullLocator

from ..util.validation import check_choice, check_number
from .style import (
    ALGO_COLORS,
    CLIP_SHADE_COLOR,
    FALLBACK_COLORS,
    MIN_FONT_SIZE,
    SFT_COLOR,
    ZERO_VARIANCE_COLOR,
    algo_color,
    algo_of,
    figure_png,
    metric_label,
    metric_title,
    new_figure,
    note,
)

# Type for the dashboards: nothing below MIN_FONT_SIZE (9 pt).
DASHBOARD_RC = {
    "font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10, "legend.fontsize": 9,
    "xtick.labelsize": 9, "ytick.labelsize": 9, "legend.frameon": False,
    "axes.spines.top": False, "axes.spines.right": False, "axes.formatter.useoffset": False,
    # A fixed title height spares matplotlib measuring every tick label to place each title.
    "axes.titley": 1.02,
}
TITLE_SIZE = 13  # the figure's title (step, time, accuracy)
NOTE_COLOR = "#444444"

MAIN_PANELS = (
    ("reward", "accuracy", "kl"),
    ("entropy", "advantages", "groups"),
)
DASHBOARD_PANELS = (  # the full RL view
    ("reward", "accuracy", "kl", "entropy"),
    ("clip", "length", "truncation", "time"),
    ("advantages", "groups", "token_ratios", "sequence_ratios"),
)
SFT_DASHBOARD_PANELS = (
    ("loss", "eval_accuracy", "lr"),
    ("grad_norm", "step_time", "tokens_per_s"),
)
DPO_DASHBOARD_PANELS = (
    ("loss", "implicit_rewards", "preference_accuracy"),
    ("logps", "held_out", "grad_norm"),
)
SPLIT_DASHBOARD_PANELS = (  # rlhf_lab.distributed.AsyncTrainer: the learner of a rollout/learner split
    ("accuracy", "staleness", "queue"),
    ("clip", "throughput", "step_time"),
)
PANELS = {"rl": DASHBOARD_PANELS, "sft": SFT_DASHBOARD_PANELS, "dpo": DPO_DASHBOARD_PANELS,
          "split": SPLIT_DASHBOARD_PANELS}
DASHBOARD_KINDS = tuple(PANELS)
VIEWS = ("main", "full")
DEFAULT_FIGSIZE = {"rl": (13, 8), "rl-full": (17, 11), "sft": (13, 7), "dpo": (13, 7), "split": (13, 7)}
DEFAULT_METRICS = {  # what plot_history and save_training_plots show when not told
    "rl": ("reward_mean", "accuracy", "eval_accuracy", "kl_k3", "entropy", "clip_frac"),
    "sft": ("loss", "eval_accuracy", "lr", "grad_norm"),
    "dpo": ("loss", "rewards/margins", "rewards/accuracies", "logps/chosen", "logps/rejected",
            "eval_accuracy"),
    "split": ("accuracy", "eval_accuracy", "staleness", "queue_length", "dropped_rollouts", "clip_frac"),
}
GROUP_RELATIVE = ("grpo", "gspo", "rloo")  # equal rewards in a group -> advantage exactly 0
MAX_GROUPS_SHOWN = 48


def dashboard_panels(kind: str = "rl", view: str = "main") -> tuple[tuple[str, ...], ...]:
    """The panel names of a dashboard, row by row (an SFT or DPO dashboard has one view of six)."""
    check_choice("kind", kind, DASHBOARD_KINDS)
    check_choice("view", view, VIEWS)
    if kind == "rl" and view == "main":
        return MAIN_PANELS
    return PANELS[kind]


def dashboard_figsize(kind: str = "rl", view: str = "main") -> tuple[float, float]:
    """Inches of a dashboard figure: large enough that 9-pt type and every title fit."""
    check_choice("kind", kind, DASHBOARD_KINDS)
    check_choice("view", view, VIEWS)
    return DEFAULT_FIGSIZE["rl-full" if kind == "rl" and view == "full" else kind]


# ----------------------------------------------------------------------------------------------
# reading a history that may be empty, partial or NaN


def column(history: pd.DataFrame | None, name: str) -> np.ndarray | None:
    """The column as float numbers, or None when it is missing or has no finite value."""
    if history is None or name not in history.columns:
        return None
    values = pd.to_numeric(history[name], errors="coerce").to_numpy(dtype=float)
    return values if np.isfinite(values).any() else None


def x_values(history: pd.DataFrame, x: str) -> np.ndarray:
    values = column(history, x)
    if values is None:
        values = column(history, "step")
    return values if values is not None else np.arange(len(history), dtype=float)


def x_label(x: str) -> str:
    return metric_label(x if x in ("step", "wall_time") else "step")


def _line(ax: Axes, xs: np.ndarray, ys: np.ndarray, **kwargs) -> None:
    """A line that stays visible when only one or two points are finite (the first steps)."""
    finite = np.isfinite(ys) & np.isfinite(xs)
    if finite.sum() <= 2:
        kwargs.setdefault("marker", "o")
        kwargs.setdefault("markersize", 3)
    ax.plot(xs[finite], ys[finite], **kwargs)


def config_value(config, name: str, default=None):
    return default if config is None else getattr(config, name, default)


def smooth(values, window: int = 5) -> np.ndarray:
    """Trailing moving average over `window` values (fewer at the start: min_periods=1), as floats.

    NaNs are skipped inside the window, so a column with gaps (evaluation steps) still smooths.
    """
    check_number("window", window, low=1, integer=True)
    return pd.Series(np.asarray(values, dtype=float)).rolling(window, min_periods=1).mean().to_numpy()


_rolling_mean = smooth  # plot_history's `smooth` argument hides the function's name inside it


def dashboard_kind(trainer=None, history: pd.DataFrame | None = None) -> str:
    """"rl", "sft" or "dpo": the trainer's `dashboard_kind` attribute, else guessed from the history's
    columns (a DPO history has `rewards/margins`; an SFT history a `loss` and no `reward_mean`)."""
    kind = getattr(trainer, "dashboard_kind", None)
    if kind is not None:
        check_choice("dashboard_kind", kind, DASHBOARD_KINDS)
        return kind
    if history is None and trainer is not None:
        history = getattr(trainer, "history", None)
    columns = history.columns if isinstance(history, pd.DataFrame) else ()
    if "rewards/margins" in columns:
        return "dpo"
    return "sft" if "loss" in columns and "reward_mean" not in columns else "rl"


# ----------------------------------------------------------------------------------------------
# curve panels (x = step or training wall time)


def histogram(ax: Axes, values: np.ndarray, bins: int, color: str, log_if_wide: bool = False) -> None:
    """A filled histogram drawn as one artist (ax.stairs): far cheaper to redraw than ax.hist's bars.

    log_if_wide: log counts when they span more than a decade, so that rare values stay visible.
    """
    counts, edges = np.histogram(values, bins=bins)
    count_scale(ax, "log" if log_if_wide and counts.max() >= 20 else "linear")
    ax.stairs(counts, edges, fill=True, color=color, alpha=0.85)


def count_scale(ax: Axes, scale: str) -> None:
    """Switch the y-axis of a histogram between linear and log counts (only when it changes)."""
    if ax.get_yscale() == scale:
        return
    ax.set_yscale(scale)
    if scale == "log":
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))  # 1, 10, 100
        ax.yaxis.set_minor_formatter(NullFormatter())
    else:
        ax.yaxis.set_major_locator(MaxNLocator(nbins=4, integer=True))


# The dashboard has no legends (they were a large share of a redraw): each title says which line is which,
# on a second line where the first names the quantity.


def draw_reward(ax: Axes, history: pd.DataFrame, x: str = "step", color: str = "C0") -> None:
    """Mean reward with a +-1 std band (dark) and the min-max range (light)."""
    xs, mean = x_values(history, x), column(history, "reward_mean")
    ax.set(title="Reward per answer\nmean, +-1 std (dark), min-max (light)", xlabel=x_label(x),
           ylabel="reward")
    if mean is None:
        return note(ax, "no training step yet")
    low, high = column(history, "reward_min"), column(history, "reward_max")
    std = column(history, "reward_std")
    if low is not None and high is not None:
        ax.fill_between(xs, low, high, color=color, alpha=0.12, linewidth=0)
    if std is not None:
        ax.fill_between(xs, mean - std, mean + std, color=color, alpha=0.3, linewidth=0)
    _line(ax, xs, mean, color=color)


def draw_accuracy(ax: Axes, history: pd.DataFrame, x: str = "step", color: str = "C0") -> None:
    """Rollout accuracy (sampled at the training temperature) and held-out greedy accuracy (dots)."""
    xs = x_values(history, x)
    ax.set(title="Accuracy\nheld-out (dots), training samples (line)", xlabel=x_label(x),
           ylabel="fraction correct", ylim=(-0.03, 1.03))
    rollout, held_out = column(history, "accuracy"), column(history, "eval_accuracy")
    if rollout is None and held_out is None:
        return note(ax, "no accuracy yet")
    if rollout is not None:
        _line(ax, xs, rollout, color=color, alpha=0.6)
    if held_out is not None:
        finite = np.isfinite(held_out)
        ax.plot(xs[finite], held_out[finite], linestyle=":", marker="o", markersize=4, color=color,
                markeredgecolor="black")


def draw_lines(ax: Axes, history: pd.DataFrame, names_styles: Sequence[tuple[str, str]], title: str,
               ylabel: str, x: str = "step", color: str = "C0", empty: str = "no data yet") -> bool:
    """Several columns in one colour, told apart by line style. Returns False when none had data."""
    xs = x_values(history, x)
    ax.set(title=title, xlabel=x_label(x), ylabel=ylabel)
    drawn = False
    for name, style in names_styles:
        ys = column(history, name)
        if ys is not None:
            _line(ax, xs, ys, color=color, linestyle=style)
            drawn = True
    if not drawn:
        note(ax, empty)
    return drawn


def isolated_spikes(values: np.ndarray) -> np.ndarray:
    """Mask of isolated spikes: at most two consecutive points far above the rest, not at the end.

    "Far above": more than the 98th percentile plus three times the range from min(0, 2nd percentile)
    to it. A rise that lasts, or that is still going on at the last point, is no spike (it is what the
    plot must show). Fewer than 20 finite points: no spikes.
    """
    spikes = np.zeros(len(values), dtype=bool)
    finite = np.isfinite(values)
    if finite.sum() < 20:
        return spikes
    low, high = np.quantile(values[finite], [0.02, 0.98])
    threshold = high + 3 * max(high - min(low, 0.0), 1e-12)
    above = finite & (values > threshold)
    index = 0
    while index < len(values):
        if not above[index]:
            index += 1
            continue
        end = index
        while end < len(values) and above[end]:
            end += 1
        if end - index <= 2 and end < len(values):
            spikes[index:end] = True
        index = end
    return spikes


def draw_kl(ax: Axes, history: pd.DataFrame, x: str = "step", color: str = "C0") -> None:
    """KL to the reference, k1 and k3. Isolated spikes (one step's k3 of 48 nats/token among values of
    0.05) would flatten the curve: the y-range then covers the rest, and each spike is marked at the
    top edge, the largest with its value and step."""
    # Both estimators average over sampled tokens: k1 = log pi_old - log pi_ref is unbiased but can
    # go negative, k3 = ratio - 1 - log ratio is always >= 0 (Schulman, "Approximating KL divergence").
    drawn = draw_lines(ax, history, [("kl_k1", "-"), ("kl_k3", "--")],
                       "KL to the reference (nats per token)\nk1 solid, k3 dashed", "nats per token", x,
                       color)
    if not drawn:
        return
    xs = x_values(history, x)
    series = {name: values for name in ("kl_k1", "kl_k3") if (values := column(history, name)) is not None}
    spikes = {name: isolated_spikes(values) for name, values in series.items()}
    if not any(mask.any() for mask in spikes.values()):
        return
    rest = np.concatenate([values[np.isfinite(values) & ~spikes[name]] for name, values in series.items()])
    low, high = min(float(rest.min()), 0.0), float(rest.max())
    pad = 0.08 * max(high - low, 1e-9)
    ax.set_ylim(low - pad, high + 5 * pad)  # headroom for the label above the curve
    marks = [(values[i], xs[i], name) for name, values in series.items()
             for i in np.flatnonzero(spikes[name])]
    for _, step, _ in marks:
        ax.plot([step], [1.0], marker="v", markersize=7, color=color, transform=ax.get_xaxis_transform(),
                clip_on=False)
    value, step, name = max(marks)
    more = f"; {len(marks) - 1} more marked" if len(marks) > 1 else ""
    text = f"{name[-2:]} = {value:.3g} at step {step:.0f}, off the scale{more}"
    # Centre the label on the spike, shifted inwards as far as it needs to stay inside the panel.
    xmin, xmax = ax.get_xlim()
    where = (step - xmin) / (xmax - xmin) if xmax > xmin else 0.5
    width_pt = ax.get_position().width * ax.figure.get_figwidth() * 72
    half = min(0.5, 0.5 * len(text) * 0.6 * MIN_FONT_SIZE / width_pt)  # DejaVu Sans: ~0.6 em per character
    ax.text(min(max(where, half), 1 - half), 0.93, text, transform=ax.transAxes, ha="center", va="top",
            fontsize=MIN_FONT_SIZE, color=NOTE_COLOR, gid="kl-spike",
            bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.9, "pad": 1})


def draw_entropy(ax: Axes, history: pd.DataFrame, x: str = "step", color: str = "C0") -> None:
    draw_lines(ax, history, [("entropy", "-")], "Policy entropy (nats per token)\nof the sampled tokens",
               "nats per token", x, color)


def draw_clip(ax: Axes, history: pd.DataFrame, x: str = "step", color: str = "C0", config=None) -> None:
    if config_value(config, "clip", True) is False:
        ax.set(title="Clipped tokens", xlabel=x_label(x), ylabel="fraction of tokens")
        return note(ax, "this run does not clip\n(plain importance-weighted PG)")
    drawn = draw_lines(ax, history, [("clip_frac_low", "--"), ("clip_frac_high", "-")],
                       "Clipped tokens\nbelow 1-eps dashed, above 1+eps solid", "fraction of tokens", x,
                       color)
    total = column(history, "clip_frac")
    never_clipped = total is not None and np.nanmax(np.abs(total)) == 0
    if drawn and never_clipped and config_value(config, "on_policy", False):
        ax.text(0.02, 0.95, "0: on-policy, every ratio is 1", transform=ax.transAxes, va="top",
                fontsize=MIN_FONT_SIZE)


def draw_length(ax: Axes, history: pd.DataFrame, x: str = "step", color: str = "C0",
                max_length: int | None = None) -> None:
    drawn = draw_lines(ax, history, [("completion_len_mean", "-"), ("completion_len_max", "--")],
                       "Answer length (tokens)\nmean solid, longest dashed", "tokens", x, color)
    if drawn and max_length:
        ax.axhline(max_length, color="black", linewidth=0.8, linestyle=":")
        ax.text(0.02, max_length, " budget", va="bottom", fontsize=MIN_FONT_SIZE,
                transform=ax.get_yaxis_transform())


def draw_truncation(ax: Axes, history: pd.DataFrame, x: str = "step", color: str = "C0") -> None:
    draw_lines(ax, history, [("truncation_rate", "-")],
               "Answers cut at the length budget\n(no end-of-sequence token)",
               "fraction of answers", x, color)


def draw_step_time(ax: Axes, history: pd.DataFrame, x: str = "step", color: str = "C0") -> None:
    """Stacked seconds per step: sampling (generation) and the gradient update."""
    xs = x_values(history, x)
    ax.set(title="Time per step (seconds)\nsampling plain, update hatched", xlabel=x_label(x),
           ylabel="seconds")
    rollout, update = column(history, "rollout_time"), column(history, "update_time")
    if rollout is None or update is None:
        return note(ax, "no training step yet")
    rows = np.isfinite(rollout) & np.isfinite(update) & np.isfinite(xs)
    ax.stackplot(xs[rows], rollout[rows], update[rows], colors=[color, color], alpha=0.8, hatch=["", "///"])


# ----------------------------------------------------------------------------------------------
# distribution panels (the latest step)


def draw_advantages(ax: Axes, distributions, color: str = "C0") -> None:
    """Histogram of the per-completion advantages of one step."""
    ax.set(xlabel="advantage (one per answer)", ylabel="answers")
    if distributions is None or distributions.advantages.numel() == 0:
        ax.set_title("Advantages")
        return note(ax, "no distributions recorded\n(keep_distributions=False or no step yet)")
    advantages = distributions.advantages.float().numpy()
    finite = advantages[np.isfinite(advantages)]
    zeros = int(np.sum(finite == 0))
    ax.set_title(f"Advantages at step {distributions.step}\n{zeros} of {finite.size} exactly 0 (no signal)")
    if finite.size and zeros == finite.size:
        ax.axvline(0, color=color, linewidth=2)
        return note(ax, f"all {finite.size} advantages are 0:\nno learning signal this step")
    histogram(ax, finite, 30, color)
    ax.axvline(0, color="black", linewidth=0.8)


def draw_groups(ax: Axes, distributions, color: str = "C0", algo: str | None = None) -> None:
    """One column of G dots per prompt: the rewards of its G completions. Equal rewards are grey."""
    if distributions is None or distributions.rewards.numel() == 0:
        ax.set(title="Rewards per prompt group", xlabel="prompt group", ylabel="reward")
        return note(ax, "no distributions recorded")
    rewards = distributions.rewards.float()
    G = int(distributions.num_generations)
    if G < 2 or rewards.numel() % G:
        # PPO samples one completion per prompt; its baseline is the critic, not a group.
        ax.set(title=f"Rewards at step {distributions.step}\n(G={G}: no groups)", xlabel="reward",
               ylabel="answers")
        histogram(ax, rewards.numpy(), 20, color)
        return None
    groups = rewards.view(-1, G)[:MAX_GROUPS_SHOWN]  # (num_prompts, G)
    equal = (groups.max(dim=1).values == groups.min(dim=1).values).numpy()
    offsets = np.linspace(-0.3, 0.3, G)  # spread the G dots so equal rewards form a flat row
    positions = np.arange(len(groups))[:, None] + offsets[None, :]
    values = groups.numpy()
    no_signal = ", A = 0" if (algo or "").lower() in GROUP_RELATIVE else ""
    ax.scatter(positions[~equal].ravel(), values[~equal].ravel(), s=9, color=color)
    ax.scatter(positions[equal].ravel(), values[equal].ravel(), s=9, color=ZERO_VARIANCE_COLOR)
    total = rewards.numel() // G
    shown = "" if total <= MAX_GROUPS_SHOWN else f" (first {MAX_GROUPS_SHOWN})"
    ax.set(title=f"Rewards per prompt group, G={G}\n{int(equal.sum())}/{len(groups)} all equal{shown}",
           xlabel=f"prompt group (grey: all G rewards equal{no_signal})", ylabel="reward")


def draw_ratios(ax: Axes, ratios: torch.Tensor | None, level: str = "token", color: str = "C0",
                clip_range: tuple[float, float] | None = None) -> None:
    """Histogram of the importance ratios pi_theta / pi_old over every pass of a step.

    level: "token" (one ratio per token) or "sequence" (one per completion: GSPO's s_i, for the
    others exp(mean_t log r_t)). clip_range: (1 - eps_low, 1 + eps_high), drawn when this level is
    the one the algorithm clips; the shaded ranges are where the clip can act.
    """
    what = "token ratio pi/pi_old" if level == "token" else "sequence ratio s_i"
    ax.set(title=f"Importance ratios, one per {'token' if level == 'token' else 'answer'}", xlabel=what,
           ylabel="tokens" if level == "token" else "answers")
    if ratios is None or ratios.numel() == 0:
        return note(ax, "no ratios recorded")
    values = ratios.float()
    values = values[torch.isfinite(values)].numpy()
    if values.size and np.all(values == 1.0):
        # On-policy (one pass, one minibatch) pi_old is pi_theta itself: r = 1 and the clip is idle.
        count_scale(ax, "linear")
        ax.bar([1.0], [values.size], width=0.02, color=color)
        ax.set_xlim(0.9, 1.1)
        ax.set_ylim(0, 1.6 * values.size)  # headroom: the note sits above the bar, not on it
        ax.text(0.5, 0.97, f"all {values.size} ratios are exactly 1\n(on-policy: the clip never acts)",
                transform=ax.transAxes, ha="center", va="top", fontsize=MIN_FONT_SIZE, color="#555555",
                bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1})
        return None
    histogram(ax, values, 40, color, log_if_wide=True)  # the tails, where the clip acts, are few
    if clip_range is not None:
        low, high = clip_range
        # Keep both bounds in view: where the ratios sit relative to the clip is the point.
        margin = 0.15 * (high - low)
        xmin, xmax = ax.get_xlim()
        xmin, xmax = min(xmin, low - margin), max(xmax, high + margin)
        for bound in (low, high):
            ax.axvline(bound, color="black", linestyle="--", linewidth=0.8)
        ax.axvspan(xmin, low, color=CLIP_SHADE_COLOR, alpha=0.25, linewidth=0)
        ax.axvspan(high, xmax, color=CLIP_SHADE_COLOR, alpha=0.25, linewidth=0)
        ax.set_xlim(xmin, xmax)
        outside = float(np.mean((values < low) | (values > high)))
        ax.set_title(f"Importance ratios, one per {'token' if level == 'token' else 'answer'}\n"
                     f"{outside:.1%} outside the clip range")


def clip_range_of(config) -> tuple[float, float] | None:
    if config is None or config_value(config, "clip", True) is False:
        return None
    low = config_value(config, "eps_low", config_value(config, "epsilon"))
    if low is None:
        return None
    high = config_value(config, "eps_high", None)
    high = low if high is None else high
    return 1.0 - float(low), 1.0 + float(high)


def clipped_level(config) -> str:
    """Which ratio the loss clips: GSPO clips the sequence ratio, every other method the token ratio."""
    level = str(config_value(config, "importance_sampling_level", "token"))
    return "sequence" if level.startswith("sequence") else "token"


# ----------------------------------------------------------------------------------------------
# the whole dashboard


def make_dashboard_axes(fig: Figure, kind: str = "rl", view: str = "main") -> dict[str, Axes]:
    """The panels of `kind` ("rl", "sft", "dpo") and `view` ("main" or "full"; see `dashboard_panels`),
    keyed by name. Fixed margins (no layout engine) keep redraws cheap; the bottom margin leaves a line
    for the note under the panels."""
    panels = dashboard_panels(kind, view)
    rows, cols = len(panels), len(panels[0])
    with matplotlib.rc_context(DASHBOARD_RC):
        grid = fig.add_gridspec(rows, cols, left=0.05 if cols > 3 else 0.06, right=0.985,
                                bottom=0.13 if rows < 3 else 0.07, top=0.87 if rows < 3 else 0.9,
                                wspace=0.3 if cols > 3 else 0.28, hspace=0.6 if rows < 3 else 0.75)
        axes = {name: fig.add_subplot(grid[row, col]) for row, names in enumerate(panels)
                for col, name in enumerate(names)}
    # x in whole numbers: steps, or prompt groups
    whole = {"reward", "accuracy", "kl", "entropy", "clip", "length", "truncation", "time", "groups"}
    for name, ax in axes.items():
        # Few ticks and no grid: tick labels and grid lines are most of what a redraw renders.
        ax.xaxis.set_major_locator(MaxNLocator(nbins=4, integer=kind != "rl" or name in whole))
        counts = name in ("advantages", "token_ratios", "sequence_ratios")
        ax.yaxis.set_major_locator(MaxNLocator(nbins=4, integer=counts))
        ax.xaxis.set_label_coords(0.5, -0.13 if rows < 3 else -0.17)  # fixed, like the titles
    if kind == "sft":
        loss = axes["loss"]
        loss.set_yscale("log")  # cross-entropy falls by orders of magnitude
        # 1-2-5 ticks: labelled whether the loss spans a tenth of a decade or several decades
        loss.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        loss.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        loss.yaxis.set_minor_locator(NullLocator())
    return axes


def reset_axes(ax: Axes) -> None:
    """Remove what the last redraw plotted but keep the axes and its ticks.

    Much cheaper than `ax.clear()`, which throws the tick objects away: rebuilding them dominated
    the cost of a redraw.
    """
    for container in list(ax.containers):
        container.remove()
    for artist in [*ax.lines, *ax.collections, *ax.patches, *ax.texts]:
        artist.remove()
    if ax.get_legend() is not None:
        ax.get_legend().remove()
    ax.set_axis_on()  # a panel that was a one-line note may have data now
    ax.relim()
    ax.autoscale(enable=True)


def latest(distributions):
    """The last StepDistributions of a list (or the one given, or None)."""
    if distributions is None:
        return None
    if isinstance(distributions, Sequence):
        return distributions[-1] if len(distributions) else None
    return distributions


def _all_equal_to(tensor: torch.Tensor | None, value: float) -> int:
    """How many values `tensor` holds when every finite one equals `value` (0 when not, or when empty)."""
    if tensor is None or tensor.numel() == 0:
        return 0
    values = tensor.float()
    values = values[torch.isfinite(values)]
    return int(values.numel()) if values.numel() and bool((values == value).all()) else 0


def idle_panels(history: pd.DataFrame | None, distributions=None, config=None) -> dict[str, str]:
    """The RL panels that carry no information in this run so far, each with the one line that replaces it.

    - "clip": the run does not clip, or no token was clipped at any step (on-policy every ratio is 1);
    - "token_ratios", "sequence_ratios": every ratio of the latest step is exactly 1 (on-policy);
    - "truncation": no completion hit the length budget at any step.
    """
    history = history if history is not None else pd.DataFrame({"step": []})
    dist = latest(distributions)
    on_policy = bool(config_value(config, "on_policy", False))
    notes = {}
    if config_value(config, "clip", True) is False:
        notes["clip"] = "Clipping: this run does not clip (plain importance-weighted policy gradient)."
    else:
        clipped = [c for name in ("clip_frac", "clip_frac_low", "clip_frac_high")
                   if (c := column(history, name)) is not None]
        if clipped and all(np.nanmax(np.abs(c)) == 0 for c in clipped):
            why = "on-policy, every ratio is exactly 1" if on_policy else "no ratio left the clip range"
            notes["clip"] = f"Clipping: no token was clipped at any step ({why})."
    for level, tensor in (("token", None if dist is None else dist.token_ratios),
                          ("sequence", None if dist is None else dist.sequence_ratios)):
        count = _all_equal_to(tensor, 1.0)
        if count:
            notes[f"{level}_ratios"] = (f"{level.capitalize()} ratios: all {count} are exactly 1 at step "
                                        f"{dist.step} (on-policy: pi_old is pi_theta).")
    truncation = column(history, "truncation_rate")
    if truncation is not None and np.nanmax(truncation) == 0:
        notes["truncation"] = "Truncation: no answer hit the length budget at any step."
    return notes


def idle_note(ax: Axes, text: str) -> None:
    """Replace a panel by its note, centred and wrapped to the panel's width (axes and ticks hidden)."""
    ax.set_axis_off()
    width_pt = ax.get_position().width * ax.figure.get_figwidth() * 72
    chars = max(20, int(width_pt / (0.6 * MIN_FONT_SIZE)))  # DejaVu Sans: about 0.6 em per character
    ax.text(0.5, 0.5, textwrap.fill(text, chars), transform=ax.transAxes, ha="center", va="center",
            fontsize=MIN_FONT_SIZE + 1, color=NOTE_COLOR)


def dashboard_note(history: pd.DataFrame | None, distributions=None, config=None,
                   shown: Sequence[str] = ()) -> str:
    """The line under the main RL view: what the panels it leaves out say in this run.

    Idle panels (`idle_panels`) in a sentence; clipping or truncation that did happen as the latest
    step's fraction; and how to see every panel.
    """
    history = history if history is not None else pd.DataFrame({"step": []})
    idle = idle_panels(history, distributions, config)
    on_policy = bool(config_value(config, "on_policy", False))
    ratio_panels = {"token_ratios", "sequence_ratios"}
    ratios_idle = bool(ratio_panels & set(idle)) and not ratio_panels & set(shown)
    parts = []
    if "clip" not in shown:
        clip = column(history, "clip_frac")
        if config_value(config, "clip", True) is False:
            parts.append("this run does not clip")
        elif "clip" in idle and ratios_idle and on_policy:
            parts.append("on-policy: every importance ratio is exactly 1 and nothing is clipped")
            ratios_idle = False  # said
        elif "clip" in idle:
            parts.append("no token was clipped at any step")
        elif clip is not None:
            parts.append(f"clipped at the last step: {clip[np.isfinite(clip)][-1]:.1%} of tokens")
    if ratios_idle:
        parts.append("every importance ratio is exactly 1 (on-policy)")
    if "truncation" not in shown:
        truncation = column(history, "truncation_rate")
        if "truncation" in idle:
            parts.append("no answer hit the length budget")
        elif truncation is not None:
            finite = truncation[np.isfinite(truncation)]
            parts.append(f"answers cut at the length budget at {int(np.sum(finite > 0))} of {finite.size} "
                         f"steps (at most {finite.max():.1%})")
    hidden = [name for row in DASHBOARD_PANELS for name in row if name not in shown]
    if not hidden:
        return ""
    more = 'LiveDashboard(view="full") shows all 12 panels.'
    return ("In this run: " + "; ".join(parts) + ".\n" + more) if parts else more


def draw_dashboard(axes: Mapping[str, Axes], history: pd.DataFrame | None, distributions=None, config=None,
                   x: str = "step", max_length: int | None = None, algo: str | None = None) -> str:
    """Clear and redraw every panel in `axes` (the main or the full view). A panel with no information in
    the run so far (`idle_panels`) becomes a one-line note. Returns the figure title (`dashboard_title`)."""
    history = history if history is not None else pd.DataFrame({"step": []})
    algo = algo or config_value(config, "algo", None)
    color = algo_color(algo)
    dist = latest(distributions)
    idle = idle_panels(history, dist, config)
    clip_range, level = clip_range_of(config), clipped_level(config)
    draw = {
        "reward": lambda ax: draw_reward(ax, history, x, color),
        "accuracy": lambda ax: draw_accuracy(ax, history, x, color),
        "kl": lambda ax: draw_kl(ax, history, x, color),
        "entropy": lambda ax: draw_entropy(ax, history, x, color),
        "clip": lambda ax: draw_clip(ax, history, x, color, config),
        "length": lambda ax: draw_length(ax, history, x, color, max_length),
        "truncation": lambda ax: draw_truncation(ax, history, x, color),
        "time": lambda ax: draw_step_time(ax, history, x, color),
        "advantages": lambda ax: draw_advantages(ax, dist, color),
        "groups": lambda ax: draw_groups(ax, dist, color, algo),
        "token_ratios": lambda ax: draw_ratios(ax, None if dist is None else dist.token_ratios, "token",
                                               color, clip_range if level == "token" else None),
        "sequence_ratios": lambda ax: draw_ratios(ax, None if dist is None else dist.sequence_ratios,
                                                  "sequence", color,
                                                  clip_range if level == "sequence" else None),
    }
    # The full view's twelve panels are narrower: a point smaller titles keep them clear of each other.
    rc = DASHBOARD_RC if len(axes) <= 6 else {**DASHBOARD_RC, "axes.titlesize": 10}
    with matplotlib.rc_context(rc):
        for name, ax in axes.items():
            reset_axes(ax)
            if name in idle:
                ax.set_title("")
                idle_note(ax, idle[name])
            else:
                draw[name](ax)
    return dashboard_title(history, algo)


# ----------------------------------------------------------------------------------------------
# the SFT dashboard


def draw_loss(ax: Axes, history: pd.DataFrame, x: str = "step", color: str = SFT_COLOR) -> None:
    """Training loss per step (faint) and its trailing mean (window ~ 1/20 of the run, at most 50)."""
    xs, loss = x_values(history, x), column(history, "loss")
    ax.set(xlabel=x_label(x), ylabel="cross-entropy (nats/token)")
    if loss is None:
        ax.set_title("Training loss (answer tokens)")
        return note(ax, "no training step yet")
    finite = np.isfinite(loss) & np.isfinite(xs) & (loss > 0)  # > 0: the axis is logarithmic
    window = int(min(50, max(1, finite.sum() // 20)))
    ax.set_title(f"Training loss (answer tokens)\nper step (faint), {window}-step mean" if window > 1
                 else "Training loss (answer tokens)")
    if window > 1:
        ax.plot(xs[finite], loss[finite], color=color, alpha=0.25, linewidth=0.8)
    _line(ax, xs[finite], _rolling_mean(loss[finite], window), color=color)


def draw_eval_accuracy(ax: Axes, history: pd.DataFrame, x: str = "step", color: str = SFT_COLOR) -> None:
    """Held-out greedy exact-match accuracy, one marker per evaluation."""
    xs, held_out = x_values(history, x), column(history, "eval_accuracy")
    ax.set(title="Held-out accuracy (greedy)", xlabel=x_label(x), ylabel="fraction correct",
           ylim=(-0.03, 1.03))
    if held_out is None:
        return note(ax, "no evaluation yet\n(eval_every=0?)")
    finite = np.isfinite(held_out) & np.isfinite(xs)
    ax.plot(xs[finite], held_out[finite], linestyle=":", marker="o", markersize=4, color=color,
            markeredgecolor="black")
    ax.set_title(f"Held-out accuracy (greedy)\n{held_out[finite][-1]:.1%} at the last evaluation")


def draw_grad_norm(ax: Axes, history: pd.DataFrame, x: str = "step", color: str = SFT_COLOR,
                   config=None) -> None:
    """Gradient norm before clipping, with the clipping threshold (max_grad_norm) dotted."""
    drawn = draw_lines(ax, history, [("grad_norm", "-")], "Gradient norm (before clipping)", "L2 norm", x,
                       color, empty="no training step yet")
    max_norm = config_value(config, "max_grad_norm", None)
    if drawn and max_norm:
        ax.axhline(max_norm, color="black", linewidth=0.8, linestyle=":")
        ax.text(0.98, max_norm, "clipped above ", ha="right", va="bottom", fontsize=MIN_FONT_SIZE,
                transform=ax.get_yaxis_transform())


def draw_sft_dashboard(axes: Mapping[str, Axes], history: pd.DataFrame | None, config=None,
                       x: str = "step") -> str:
    """Clear and redraw the six SFT panels. Returns the figure title (task, step, time)."""
    history = history if history is not None else pd.DataFrame({"step": []})
    with matplotlib.rc_context(DASHBOARD_RC):
        for ax in axes.values():
            reset_axes(ax)
        draw_loss(axes["loss"], history, x)
        draw_eval_accuracy(axes["eval_accuracy"], history, x)
        draw_lines(axes["lr"], history, [("lr", "-")], "Learning rate\nwarm-up, then cosine decay",
                   "learning rate", x, SFT_COLOR, empty="no training step yet")
        draw_grad_norm(axes["grad_norm"], history, x, config=config)
        draw_lines(axes["step_time"], history, [("step_time", "-")],
                   "Time per step\nforward + backward + AdamW",
                   "seconds", x, SFT_COLOR, empty="no training step yet")
        draw_lines(axes["tokens_per_s"], history, [("tokens_per_s", "-")],
                   "Throughput\nsupervised tokens per second",
                   "completion tokens per second", x, SFT_COLOR, empty="no training step yet")
    task = config_value(config, "task", None)
    return dashboard_title(history, f"sft {task}" if task else "sft")


# ----------------------------------------------------------------------------------------------
# the DPO dashboard (rlhf_lab.preferences.DPOTrainer's history: TRL's metric names)


def draw_dpo_dashboard(axes: Mapping[str, Axes], history: pd.DataFrame | None, config=None,
                       x: str = "step") -> str:
    """Clear and redraw the six DPO panels: loss, implicit rewards, preference accuracy, the log-probs
    of chosen and rejected completions, the held-out metrics, the gradient norm. Returns the title."""
    history = history if history is not None else pd.DataFrame({"step": []})
    loss_type = config_value(config, "loss_type", "sigmoid")
    name = "ipo" if loss_type == "ipo" else "dpo"
    color = algo_color(name)
    empty = "no training step yet"
    with matplotlib.rc_context(DASHBOARD_RC):
        for ax in axes.values():
            reset_axes(ax)
        draw_lines(axes["loss"], history, [("loss", "-")], f"{name.upper()} loss\nmean over the batch",
                   "loss", x, color, empty=empty)
        draw_lines(axes["implicit_rewards"], history, [("rewards/chosen", "-"), ("rewards/rejected", "--"),
                                                       ("rewards/margins", ":")],
                   "Implicit reward\nchosen solid, rejected dashed, margin dotted", "beta * log(pi / pi_ref)",
                   x, color, empty=empty)
        accuracy = axes["preference_accuracy"]
        draw_lines(accuracy, history, [("rewards/accuracies", "-")],
                   "Pairs ranked right\nbatch (line), held-out (dots)", "fraction of pairs", x, color,
                   empty=empty)
        held_out_pairs, xs = column(history, "eval_rewards/accuracies"), x_values(history, x)
        if held_out_pairs is not None:
            finite = np.isfinite(held_out_pairs) & np.isfinite(xs)
            accuracy.plot(xs[finite], held_out_pairs[finite], linestyle=":", marker="o", markersize=4,
                          color=color, markeredgecolor="black")
        accuracy.set_ylim(-0.03, 1.03)
        draw_lines(axes["logps"], history, [("logps/chosen", "-"), ("logps/rejected", "--")],
                   "Log-probability of an answer\nchosen solid, rejected dashed", "nats per answer", x, color,
                   empty=empty)
        held_out = axes["held_out"]
        draw_eval_accuracy(held_out, history, x, color)
        gold = column(history, "eval_gold_reward")
        if gold is not None:
            finite = np.isfinite(gold) & np.isfinite(xs)
            held_out.plot(xs[finite], gold[finite], linestyle="--", marker="s", markersize=4, color=color,
                          markeredgecolor="black")
            accuracy_now = column(history, "eval_accuracy")[finite][-1]
            held_out.set_title(f"Held-out, greedy\naccuracy (dots) {accuracy_now:.1%}, "
                               f"gold reward (squares) {gold[finite][-1]:.3f}")
            held_out.set_ylabel("fraction correct / mean gold reward")
        draw_grad_norm(axes["grad_norm"], history, x, color, config)
    return dashboard_title(history, name)


def dashboard_title(history: pd.DataFrame, algo: str | None) -> str:
    """The figure title: algorithm, step, seconds of training (evaluation and drawing excluded), the mean
    time per step over the run and over the last 10 steps, and the latest held-out accuracy, each number
    labelled with what it is."""
    name = (algo or "run").upper()
    steps = column(history, "step")
    if steps is None or len(history) == 0:
        return f"{name}: waiting for the first step"
    last_step = int(np.nanmax(steps))
    parts = [f"{name}: step {last_step}"]
    wall = column(history, "wall_time")
    if wall is not None:
        training = float(np.nanmax(wall))
        time_part = f"{training:.1f} s of training"
        step_time = column(history, "step_time")
        if last_step > 0 and step_time is not None:
            recent = step_time[np.isfinite(step_time)][-10:]
            time_part += (f", {training / last_step:.2f} s/step on average "
                          f"(last {len(recent)} steps: {recent.mean():.2f} s/step)")
        parts.append(time_part)
    held_out = column(history, "eval_accuracy")
    if held_out is not None:
        finite = np.isfinite(held_out)
        parts.append(f"held-out accuracy {held_out[finite][-1]:.1%} at step {int(steps[finite][-1])}")
    return "   |   ".join(parts)


def _footnote(fig: Figure):
    """The figure's one line under the panels (a Text made once and reused at every redraw)."""
    for text in fig.texts:
        if text.get_gid() == "dashboard-note":
            return text
    return fig.text(0.01, 0.01, "", ha="left", va="bottom", fontsize=MIN_FONT_SIZE, color=NOTE_COLOR,
                    gid="dashboard-note")


def draw_figure(fig: Figure, axes: Mapping[str, Axes], kind: str, history: pd.DataFrame | None,
                distributions=None, config=None, x: str = "step", max_length: int | None = None,
                algo: str | None = None) -> str:
    """Redraw a whole dashboard figure: its panels, its title and (RL) the note under the panels.
    Returns the title."""
    if kind == "sft":
        title = draw_sft_dashboard(axes, history, config, x)
    elif kind == "dpo":
        title = draw_dpo_dashboard(axes, history, config, x)
    elif kind == "split":
        title = draw_split_dashboard(axes, history, config, x)
    else:
        title = draw_dashboard(axes, history, distributions, config, x, max_length, algo)
        # characters a line holds: DejaVu Sans averages about 0.55 em a character
        chars = int(fig.get_figwidth() * 72 * 0.97 / (0.55 * MIN_FONT_SIZE))
        lines = dashboard_note(history, distributions, config, shown=list(axes)).split("\n")
        _footnote(fig).set_text("\n".join(textwrap.fill(line, chars) for line in lines))
    fig.suptitle(title, fontsize=TITLE_SIZE)
    return title


def plot_dashboard(history: pd.DataFrame | None, distributions=None, config=None, x: str = "step",
                   algo: str | None = None, max_length: int | None = None,
                   figsize: tuple[float, float] | None = None, kind: str | None = None,
                   view: str = "main") -> Figure:
    """The dashboard of a finished (or running) run, as one static Figure. `kind` "rl" | "sft" | "dpo"
    (default: guessed from the history's columns); `view` "main" (six panels) or "full" (every RL panel,
    12); SFT and DPO have six in both."""
    kind = kind or dashboard_kind(history=history)
    fig = new_figure(figsize or dashboard_figsize(kind, view), layout=None)
    axes = make_dashboard_axes(fig, kind, view)
    draw_figure(fig, axes, kind, history, distributions, config, x, max_length, algo)
    return fig


# ----------------------------------------------------------------------------------------------
# comparing runs


def _mix(color: str, other: str, amount: float) -> str:
    rgb, target = np.array(to_rgb(color)), np.array(to_rgb(other))
    return to_hex((1 - amount) * rgb + amount * target)


def _shades(color: str) -> list[str]:
    """Darker and lighter versions of an algorithm's colour, for its second, third, ... run on a plot."""
    return [_mix(color, "black", 0.45), _mix(color, "white", 0.45), _mix(color, "black", 0.7),
            _mix(color, "white", 0.65), _mix(color, "black", 0.25), _mix(color, "white", 0.25)]


def _spare_colors(used: set[str]):
    """Colours for runs that name no algorithm: neutral ones first, then those of algorithms absent from the
    plot, then as many well-spread hues as needed (golden-ratio steps around the hue circle)."""
    absent = [color for color in ALGO_COLORS.values() if color not in used]
    yield from FALLBACK_COLORS
    yield from absent
    hues = matplotlib.colormaps["hsv"]
    k = 0
    while True:
        k += 1
        yield to_hex(hues((k * 0.6180339887) % 1.0))


def distinct_colors(labels: Sequence[str], taken: Sequence[str] = ()) -> list[str]:
    """One colour per run label, never two the same, and none of `taken`.

    A run whose label starts with an algorithm's name ("grpo", "gspo beta=0.04") gets that algorithm's
    colour (ALGO_COLORS) when it is the first run of its algorithm, and a darker or lighter shade of it
    otherwise; a run that names no algorithm gets a neutral colour (black, grey, brown, ...) and after
    those, colours no algorithm on the plot uses.
    """
    labels = list(labels)
    used = {to_hex(color) for color in taken}
    result: list[str | None] = [None] * len(labels)
    algos = [algo_of(label) for label in labels]
    for index, algo in enumerate(algos):  # the first run of each algorithm: its own colour
        if algo is not None and ALGO_COLORS[algo] not in used:
            result[index] = ALGO_COLORS[algo]
            used.add(ALGO_COLORS[algo])
    for index, algo in enumerate(algos):  # more runs of it: shades
        if result[index] is None and algo is not None:
            result[index] = next((c for c in _shades(ALGO_COLORS[algo]) if c not in used), None)
            if result[index] is not None:
                used.add(result[index])
    spare = _spare_colors(used)
    for index in range(len(labels)):
        if result[index] is None:
            result[index] = next(c for c in spare if to_hex(c) not in used)
            used.add(to_hex(result[index]))
    return result


def run_colors(labels: Sequence[str], colors=None) -> list[str]:
    """One colour per run label.

    colors: None gives every run its own colour (`distinct_colors`: by algorithm, with shades for several
    runs of one algorithm); a colormap name gives distinct shades along it (for a sweep of one setting);
    a {label: colour} mapping sets some runs and gives the rest distinct colours other than those; a
    list is used in order (cycled when shorter: runs may then share a colour on purpose, e.g. the seeds
    of one setting).
    """
    labels = list(labels)
    if colors is None:
        return distinct_colors(labels)
    if isinstance(colors, str):
        try:
            colormap = matplotlib.colormaps[colors]
        except KeyError:
            raise ValueError(f"colors must be None, a colormap name, a mapping or a list, got {colors!r}"
                             ) from None
        return [to_hex(colormap(v)) for v in np.linspace(0, 0.85, len(labels))]
    if isinstance(colors, Mapping):
        missing = [run for run in labels if run not in colors]
        others = iter(distinct_colors(missing, taken=[colors[run] for run in labels if run in colors]))
        return [colors[run] if run in colors else next(others) for run in labels]
    colors = list(colors)
    if not colors:
        raise ValueError("colors must not be an empty list")
    return [colors[index % len(colors)] for index in range(len(labels))]


def plot_history(
    histories: pd.DataFrame | Mapping[str, pd.DataFrame],
    metrics: Sequence[str] | None = None,
    x: str = "step",
    smooth: int = 1,
    ncols: int = 3,
    label: str | None = None,
    figsize: tuple[float, float] | None = None,
    title: str | None = None,
    colors: str | Sequence[str] | Mapping[str, str] | None = None,
) -> Figure:
    """Small multiples: one axes per metric, one line per run; evaluations (`eval_accuracy`) as markers.

    Args:
        histories: a `Trainer.history` / `SFTTrainer.history` DataFrame, or {run label: history}.
        metrics: columns of the histories (see rl/metrics.py METRIC_COLUMNS, sft.py HISTORY_COLUMNS); default
            the main ones of an RL run, or of an SFT run when the first history is one.
        x: "step" or "wall_time" (seconds of training, evaluation excluded).
        smooth: window of a trailing moving average (1 = raw); the raw curve stays visible, faint.
        label: the legend label of a single DataFrame (default: its "algo" column if any, else "run").
        title: the figure's title (suptitle), if any.
        colors: None gives every run its own colour (`run_colors`: a label that starts with an algorithm's
            name, "grpo", "gspo beta=0.04", takes its colour, a second run of it a shade of that colour); a
            colormap name ("viridis") gives a sweep shades along it; or a {label: colour} mapping, or a list.
    Returns:
        a Figure with len(metrics) axes.
    """
    check_choice("x", x, ("step", "wall_time"))
    check_number("smooth", smooth, low=1, integer=True)
    if isinstance(histories, pd.DataFrame):
        if label is None:
            has_algo = "algo" in histories.columns and len(histories)
            label = str(histories["algo"].iloc[0]) if has_algo else "run"
        histories = {label: histories}
    if not histories:
        raise ValueError("histories must hold at least one run, got none")
    if metrics is None:
        metrics = DEFAULT_METRICS[dashboard_kind(history=next(iter(histories.values())))]
    metrics = list(metrics)
    if not metrics:
        raise ValueError("metrics must name at least one column, got an empty list")
    line_colors = run_colors(list(histories), colors)
    ncols = max(1, min(ncols, len(metrics)))
    nrows = math.ceil(len(metrics) / ncols)
    fig = new_figure(figsize or (4.2 * ncols, 3.2 * nrows))
    axes = [fig.add_subplot(nrows, ncols, i + 1) for i in range(len(metrics))]
    with matplotlib.rc_context({"axes.grid": True, "grid.alpha": 0.3}):
        for color, (run, history) in zip(line_colors, histories.items()):
            xs = x_values(history, x)
            for ax, metric in zip(axes, metrics):
                ys = column(history, metric)
                if ys is None:
                    continue
                finite = np.isfinite(ys) & np.isfinite(xs)
                if metric == "eval_accuracy" or finite.sum() <= 2:  # sparse: evaluated every few steps
                    ax.plot(xs[finite], ys[finite], marker="o", markersize=4, color=color, label=run)
                elif smooth > 1:
                    smoothed = _rolling_mean(ys[finite], smooth)
                    ax.plot(xs[finite], ys[finite], color=color, alpha=0.25, linewidth=0.8)
                    ax.plot(xs[finite], smoothed, color=color, label=run)
                else:
                    ax.plot(xs[finite], ys[finite], color=color, label=run)
        for ax, metric in zip(axes, metrics):
            ax.set(title=metric_title(metric), xlabel=x_label(x), ylabel=metric_label(metric))
            if not ax.lines:
                note(ax, f"no data for {metric!r}")
        axes[0].legend(loc="best")
    if title:
        fig.suptitle(title)
    return fig


def save_training_plots(history: pd.DataFrame, distributions, out_dir: str | Path, config=None,
                        algo: str | None = None, dpi: float = 100) -> list[Path]:
    """Write curves.png (main metrics against step) and dashboard.png (the full view) into out_dir."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    algo = algo or config_value(config, "algo", None)
    written = []
    curves = plot_history(history, label=algo or "run")
    dashboard = plot_dashboard(history, distributions, config, algo=algo, view="full")
    for name, fig in (("curves.png", curves), ("dashboard.png", dashboard)):
        path = out_dir / name
        path.write_bytes(figure_png(fig, dpi=dpi))
        written.append(path)
    return written


def draw_split_dashboard(axes: Mapping[str, Axes], history: pd.DataFrame | None, config=None,
                         x: str = "step") -> str:
    """The six panels of a rollout/learner split's learner: accuracy, how stale each step's rollout was,
    the queue and the dropped rollouts, the clip fractions, throughput, and where a step's time went
    (waiting for a rollout, sending weights, the learner's own work). Returns the title."""
    history = history if history is not None else pd.DataFrame({"step": []})
    color = algo_color(config_value(config, "algo", None))
    with matplotlib.rc_context(DASHBOARD_RC):
        for ax in axes.values():
            reset_axes(ax)
        draw_accuracy(axes["accuracy"], history, x, color)
        draw_lines(axes["staleness"], history, [("staleness", "-")], "Staleness\nlearner - rollout version",
                   "policy versions", x, color)
        draw_lines(axes["queue"], history, [("queue_length", "-"), ("dropped_rollouts", "--")],
                   "Queue\nlength (solid), dropped in all (dashed)", "rollouts", x, color)
        draw_clip(axes["clip"], history, x, color, config)
        draw_lines(axes["throughput"], history, [("tokens_per_s", "-")], "Throughput\nof the learner's steps",
                   "completion tokens / s", x, color)
        draw_lines(axes["step_time"], history,
                   [("step_time", "-"), ("queue_wait_time", "--"), ("sync_time", ":")],
                   "Time per step (solid)\nrollout wait (dashed), weight sync (dotted)", "seconds", x,
                   color)
    return dashboard_title(history, f"{config_value(config, 'algo', 'rl')} (split)")


def draw_split_diagram(ax: Axes, rollout_workers: int = 1) -> None:
    """The rollout/learner split as boxes and arrows: which process holds which model, what crosses the
    wire and when (rlhf_lab.distributed)."""
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    ax.set(xlim=(0, 10), ylim=(0, 6))
    ax.axis("off")

    def box(x, y, w, h, title, lines, color):
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.08", facecolor=color, alpha=0.25,
                                    edgecolor="black"))
        ax.text(x + w / 2, y + h - 0.3, title, ha="center", va="top", fontsize=10, weight="bold")
        ax.text(x + 0.2, y + h - 0.8, "\n".join(lines), ha="left", va="top", fontsize=8.5, linespacing=1.5)

    box(0.1, 0.6, 3.4, 4.8, "learner (rank 0)", [
        "policy pi_theta, trained (fp32)", "AdamW moments", "reference pi_ref (frozen)",
        "critic V (PPO only)", "recomputes pi_prox = its weights", "  before the update",
        "queue: rollouts <= K versions old", "version v = steps done"], "C0")
    ranks = "rank 1" if rollout_workers == 1 else f"ranks 1..{rollout_workers}"
    box(6.5, 0.6, 3.4, 4.8, f"rollout worker{'s' if rollout_workers > 1 else ''} ({ranks})", [
        "policy copy mu (fp32, bf16 or fp16)", "sampler + KV cache (static / int8)", "reward function",
        "no optimiser, no reference", "samples only with a ticket:", "  granted - dropped <= v + K"], "C1")
    arrow = dict(arrowstyle="-|>", mutation_scale=18, linewidth=1.8)
    ax.add_patch(FancyArrowPatch((3.7, 4.1), (6.4, 4.1), color="C0", **arrow))
    weights = "weights of version v\nafter each step\n(broadcast on group {0, r},\nbucket or per tensor)"
    ax.text(5.05, 4.25, weights, ha="center", va="bottom", fontsize=8)
    ax.add_patch(FancyArrowPatch((6.4, 2.0), (3.7, 2.0), color="C1", **arrow))
    rollout = "rollout: tokens, rewards,\nlog mu (behaviour log-probs),\nits version, stream positions"
    ax.text(5.05, 1.85, rollout, ha="center", va="top", fontsize=8)
