"""Seeing fine-tuning (SFT and RL): a live training dashboard, comparison plots and interactive explorers.

    from rlhf_lab.viz import LiveDashboard, plot_history, show, smooth, clip_explorer
    trainer = Trainer(config, callbacks=[LiveDashboard()])   # redraws while train() runs (SFTTrainer too)
    plot_history({"grpo": grpo.history, "gspo": gspo.history}, metrics=["reward_mean", "kl_k3"],
                 title="GRPO vs GSPO")                        # small multiples, one line per run
    show(fig)                                                 # a figure once, as a small PNG in a notebook
    smooth(history["loss"], window=20)                        # trailing mean for a noisy curve
    clip_explorer()                                           # sliders in Jupyter, a Figure elsewhere

One colour per algorithm everywhere: `ALGO_COLORS` in style.py.
"""

from . import mechanisms, rope_plots  # noqa: E402,F401  (registers the RoPE and KV-cache explorers)
from .dashboard import LiveDashboard
from .plots import (
    DASHBOARD_PANELS,
    DPO_DASHBOARD_PANELS,
    SFT_DASHBOARD_PANELS,
    dashboard_kind,
    draw_dashboard,
    draw_dpo_dashboard,
    draw_sft_dashboard,
    make_dashboard_axes,
    plot_dashboard,
    plot_history,
    save_training_plots,
    smooth,
)
from .style import ALGO_COLORS, METRIC_LABELS, algo_color, figure_png, in_notebook, new_figure, show
from .widgets import (
    EXPLORERS,
    LogSlider,
    clip_explorer,
    explore,
    make_explorer,
    plot_clip_surrogate,
    plot_next_token_distribution,
    register_explorer,
    sampling_explorer,
)

__all__ = [
    "ALGO_COLORS", "DASHBOARD_PANELS", "DPO_DASHBOARD_PANELS", "EXPLORERS", "METRIC_LABELS", "SFT_DASHBOARD_PANELS", "LiveDashboard",
    "LogSlider", "algo_color", "clip_explorer", "dashboard_kind", "draw_dashboard", "draw_dpo_dashboard", "draw_sft_dashboard",
    "explore", "figure_png", "in_notebook", "make_dashboard_axes", "make_explorer", "new_figure",
    "plot_clip_surrogate", "plot_dashboard", "plot_history", "plot_next_token_distribution",
    "register_explorer", "sampling_explorer", "save_training_plots", "show", "smooth",
]
