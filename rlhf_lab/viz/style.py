"""One look for every plot: a colour per algorithm, axis labels with units, and figure plumbing.

The palette is Okabe & Ito's (2008) colour-blind-safe set, so PPO, GRPO, GSPO and the baselines
stay distinguishable for every reader, in every notebook and in the CLI's PNGs.

Figures are made by `new_figure`, never left registered with pyplot: a notebook then shows a
returned figure exactly once (as the cell's value or through `display`), and a long session does
not pile up open figures. Outside a Jupyter kernel figures are pure Agg, so scripts and CI never
need a display. `show(fig)` puts a figure in a notebook once, as a small PNG, and forgets it.
"""

from __future__ import annotations

import io
import re
import sys

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

ALGO_COLORS: dict[str, str] = {
    "ppo": "#0072b2",  # blue
    "grpo": "#d55e00",  # vermillion
    "gspo": "#009e73",  # bluish green
    "rloo": "#cc79a7",  # reddish purple
    "reinforce": "#e69f00",  # orange
    "remax": "#56b4e9",  # sky blue
    # preference optimisation: Paul Tol's colour-blind-safe "muted" wine and teal (Okabe & Ito's are used up)
    "dpo": "#882255",  # wine
    "ipo": "#44aa99",  # teal
}
# Runs whose label names no algorithm, in this order: neutral colours first, so that such a run is never
# read as an algorithm's (no yellow: it vanishes on white).
FALLBACK_COLORS = ("#000000", "#7f7f7f", "#8c564b", "#332288", "#999933", "#117733", "#aa4499", "#661100",
                   "#6699cc", "#888888", "#ddcc77")
SFT_COLOR = "#000000"  # the SFT dashboard's curves: supervised learning is the baseline RL starts from

KEPT_COLOR = "#4477aa"  # a token the sampling filters keep
REMOVED_COLOR = "#cccccc"  # a token they remove (probability exactly 0 afterwards)
ZERO_VARIANCE_COLOR = "#9a9a9a"  # a GRPO group whose G rewards are all equal: advantage 0, no signal
CLIP_SHADE_COLOR = "#f4d35e"  # ratio range where the clip is active and the gradient is zero

# Axis labels with units, keyed by the column names of `Trainer.history` (rl/metrics.py).
METRIC_LABELS: dict[str, str] = {
    "step": "step",
    "wall_time": "training time (s)",
    "step_time": "time per step (s)",
    "loss": "training loss (nats/token)",
    "rollout_time": "rollout time (s)",
    "update_time": "update time (s)",
    "reward_mean": "reward (mean per completion)",
    "reward_std": "reward std",
    "reward_min": "reward min",
    "reward_max": "reward max",
    "frac_zero_std_groups": "zero-variance groups (fraction)",
    "accuracy": "rollout accuracy (fraction)",
    "eval_accuracy": "held-out greedy accuracy (fraction)",
    "kl_k1": "KL to reference, k1 (nats/token)",
    "kl_k3": "KL to reference, k3 (nats/token)",
    "entropy": "entropy (nats/token)",
    "clip_frac_low": "clipped at 1-eps (fraction of tokens)",
    "clip_frac_high": "clipped at 1+eps (fraction of tokens)",
    "clip_frac": "clipped (fraction of tokens)",
    "ratio_mean": "token ratio pi/pi_old (mean)",
    "ratio_min": "token ratio pi/pi_old (min)",
    "ratio_max": "token ratio pi/pi_old (max)",
    "seq_ratio_mean": "sequence ratio (mean)",
    "seq_ratio_min": "sequence ratio (min)",
    "seq_ratio_max": "sequence ratio (max)",
    "adv_mean": "advantage (mean)",
    "adv_std": "advantage (std)",
    "completion_len_mean": "completion length (tokens)",
    "completion_len_max": "longest completion (tokens)",
    "truncation_rate": "truncated, no EOS (fraction)",
    "policy_loss": "policy loss",
    "value_loss": "value loss",
    "value_clip_frac": "value clipped (fraction of tokens)",
    "explained_variance": "explained variance of the critic",
    "kl_penalty": "KL penalty in the reward (nats/token)",
    "kl_coef": "KL coefficient",
    "grad_norm": "gradient norm (before clipping)",
    "lr": "learning rate",
    "tokens_per_s": "throughput (completion tokens/s)",
    "num_rollout_rows": "completions per step",
    "sampled_zero_std_frac": "zero-variance groups sampled (fraction)",
    "mem_params_bytes": "parameter memory (bytes)",
    "mem_optimizer_bytes": "optimiser memory (bytes)",
    "mem_peak_bytes": "peak memory (bytes)",
    # DPO (TRL's names): implicit rewards beta * log(pi / pi_ref) and sequence log-probs
    "rewards/chosen": "implicit reward of chosen",
    "rewards/rejected": "implicit reward of rejected",
    "rewards/margins": "implicit reward margin (chosen - rejected)",
    "rewards/accuracies": "pairs ranked right (fraction)",
    "logps/chosen": "log pi(chosen) (nats per completion)",
    "logps/rejected": "log pi(rejected) (nats per completion)",
    "eval_gold_reward": "held-out gold reward (mean, greedy)",
    "eval_rewards/accuracies": "held-out pairs ranked right (fraction)",
    "eval_rewards/margins": "held-out implicit reward margin",
    "eval_logps/chosen": "held-out log pi(chosen) (nats per completion)",
    "eval_logps/rejected": "held-out log pi(rejected) (nats per completion)",
    "pairs": "pairs per step",
    # reward models (preferences/reward_model.py)
    "batch_accuracy": "pairs ranked right in the batch (fraction)",
    "train_accuracy": "training pairs ranked right (fraction)",
    "eval_gold_accuracy": "held-out pairs ranked as the gold does (fraction)",
}

# Plot titles in words, keyed like METRIC_LABELS: a learner reads "Clipped tokens", not `clip_frac`.
METRIC_TITLES: dict[str, str] = {
    "wall_time": "Training time",
    "step_time": "Time per step",
    "loss": "Training loss",
    "rollout_time": "Time spent sampling",
    "update_time": "Time spent on the update",
    "reward_mean": "Mean reward",
    "reward_std": "Spread of the rewards (std)",
    "reward_min": "Lowest reward",
    "reward_max": "Highest reward",
    "frac_zero_std_groups": "Groups with equal rewards",
    "sampled_zero_std_frac": "Sampled groups with equal rewards",
    "accuracy": "Accuracy of the sampled answers",
    "eval_accuracy": "Held-out accuracy (greedy)",
    "kl_k1": "KL to the reference (k1)",
    "kl_k3": "KL to the reference (k3)",
    "entropy": "Policy entropy",
    "clip_frac_low": "Tokens clipped below (ratio < 1 - eps)",
    "clip_frac_high": "Tokens clipped above (ratio > 1 + eps)",
    "clip_frac": "Clipped tokens",
    "ratio_mean": "Mean token importance ratio",
    "ratio_min": "Smallest token importance ratio",
    "ratio_max": "Largest token importance ratio",
    "seq_ratio_mean": "Mean sequence importance ratio",
    "seq_ratio_min": "Smallest sequence importance ratio",
    "seq_ratio_max": "Largest sequence importance ratio",
    "adv_mean": "Mean advantage",
    "adv_std": "Spread of the advantages (std)",
    "completion_len_mean": "Answer length",
    "completion_len_max": "Longest answer",
    "truncation_rate": "Answers cut at the length budget",
    "policy_loss": "Policy loss",
    "value_loss": "Critic (value) loss",
    "value_clip_frac": "Clipped value predictions",
    "explained_variance": "How much of the return the critic explains",
    "kl_penalty": "KL penalty in the reward",
    "kl_coef": "KL coefficient",
    "grad_norm": "Gradient norm",
    "lr": "Learning rate",
    "tokens_per_s": "Throughput",
    "num_rollout_rows": "Completions per step",
    "mem_params_bytes": "Parameter memory",
    "mem_optimizer_bytes": "Optimiser memory",
    "mem_peak_bytes": "Peak memory",
    "rewards/chosen": "Implicit reward of the chosen answer",
    "rewards/rejected": "Implicit reward of the rejected answer",
    "rewards/margins": "Implicit reward margin",
    "rewards/accuracies": "Pairs ranked right",
    "logps/chosen": "Log-probability of the chosen answer",
    "logps/rejected": "Log-probability of the rejected answer",
    "eval_gold_reward": "Held-out gold reward",
    "eval_rewards/accuracies": "Held-out pairs ranked right",
    "eval_rewards/margins": "Held-out implicit reward margin",
    "eval_logps/chosen": "Held-out log-probability of chosen",
    "eval_logps/rejected": "Held-out log-probability of rejected",
    "pairs": "Pairs per step",
    "batch_accuracy": "Batch pairs ranked right",
    "train_accuracy": "Training pairs ranked right",
    "eval_gold_accuracy": "Held-out pairs ranked as the gold does",
}


def metric_label(name: str) -> str:
    return METRIC_LABELS.get(name, name.replace("_", " "))


def metric_title(name: str) -> str:
    """A plot title in words for a history column ("clip_frac" -> "Clipped tokens"); an unknown column
    gets its name with spaces for "_" and "/"."""
    if name in METRIC_TITLES:
        return METRIC_TITLES[name]
    words = re.sub(r"[_/]+", " ", name).strip()
    return words[:1].upper() + words[1:]


def algo_of(name: str | None) -> str | None:
    """The algorithm a run label names ("grpo beta=0.04" -> "grpo", "gspo-token" -> "gspo"), or None."""
    if not name:
        return None
    key = str(name).lower()
    if key in ALGO_COLORS:
        return key
    for algo in sorted(ALGO_COLORS, key=len, reverse=True):  # "gspo-token" -> gspo, not "ppo"
        if key.startswith(algo):
            return algo
    return None


def algo_color(name: str | None, index: int = 0) -> str:
    """The colour of an algorithm; a run label such as "grpo beta=0.04" gets its algorithm's colour.

    A label that names no algorithm gets FALLBACK_COLORS[index] (cycled). For several runs on one plot
    use `plots.run_colors`, which never gives two runs the same colour.
    """
    algo = algo_of(name)
    if algo is not None:
        return ALGO_COLORS[algo]
    return FALLBACK_COLORS[index % len(FALLBACK_COLORS)]


def in_notebook() -> bool:
    """True inside a Jupyter kernel (JupyterLab, VS Code, Colab, nbclient); False in a script or in
    terminal IPython."""
    ipython = sys.modules.get("IPython")  # never import IPython just to ask
    if ipython is None:
        return False
    shell = ipython.get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def new_figure(figsize: tuple[float, float] = (6.4, 4.0), layout: str | None = "constrained") -> Figure:
    """A Figure that pyplot does not track (see the module docstring)."""
    if in_notebook():
        # Going through pyplot once loads the kernel's backend (matplotlib-inline), which teaches
        # IPython to render a Figure as a PNG. Closing it right away stops the inline backend from
        # showing it a second time at the end of the cell.
        import matplotlib.pyplot as plt

        fig = plt.figure(figsize=figsize, layout=layout)
        plt.close(fig)
        return fig
    fig = Figure(figsize=figsize, layout=layout)
    FigureCanvasAgg(fig)
    return fig


def figure_png(fig: Figure, dpi: float | str = 72) -> bytes:
    """PNG bytes of a figure (savefig renders PNG with Agg under every backend).

    dpi="figure" keeps the figure's own dpi, which lets Agg reuse its renderer between redraws.
    zlib level 1: a preview that is redrawn often should encode fast, not small.
    """
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, pil_kwargs={"compress_level": 1})
    return buffer.getvalue()


def show(fig: Figure, dpi: float = 80) -> None:
    """Display `fig` once in a notebook as a small PNG (keeps the saved notebook light), then close it.

    Outside a Jupyter kernel nothing is displayed; the figure is only released from pyplot, if pyplot
    holds it, so that a script calling `show` neither blocks nor leaks open figures.
    """
    if in_notebook():
        from IPython.display import Image, display

        display(Image(data=figure_png(fig, dpi=dpi), format="png"))
    pyplot = sys.modules.get("matplotlib.pyplot")  # never import pyplot just to close
    if pyplot is not None:
        pyplot.close(fig)


MIN_FONT_SIZE = 9  # points: the smallest type of any figure, so that it stays readable at notebook width


def note(ax, text: str, fontsize: float = MIN_FONT_SIZE) -> None:
    """Centred grey message in an axes that has nothing (yet) to plot."""
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", fontsize=fontsize,
            color="#555555", wrap=True)
