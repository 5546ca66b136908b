"""Seeing fine-tuning (SFT and RL): a live training dashboard, comparison plots and interactive explorers.

    from rlhf_lab.viz import LiveDashboard, plot_history, show, smooth, clip_explorer
    trainer = Trainer(config, callbacks=[LiveDashboard()])   # redraws while train() runs (SFTTrainer too)
    LiveDashboard(view="full")                                # all 12 RL panels instead of the main six
    dashboard_guide()                                         # what healthy and failing curves look like
    show(step_diagram("ppo"))                                 # one PPO / GRPO / DPO step as a data flow
    show(rlhf_stages_diagram())                               # pretrained -> SFT -> reward model -> RL; DPO
    plot_history({"grpo": grpo.history, "gspo": gspo.history}, metrics=["reward_mean", "kl_k3"],
                 title="GRPO vs GSPO")                        # small multiples, one line per run
    show(fig)                                                 # a figure once, as a small PNG in a notebook
    smooth(history["loss"], window=20)                        # trailing mean for a noisy curve
    clip_explorer()                                           # sliders in Jupyter, a Figure elsewhere

One colour per algorithm everywhere: `ALGO_COLORS` in style.py; two runs on one plot never share one
(`run_colors`).
"""

from . import mechanisms, rope_plots  # noqa: E402,F401  (registers the RoPE and KV-cache explorers)
from .dashboard import LiveDashboard
from .diagrams import dpo_step_diagram, grpo_step_diagram, ppo_step_diagram, rlhf_stages_diagram, step_diagram
from .guide import DASHBOARD_GUIDE, dashboard_guide
from .plots import (
    DASHBOARD_PANELS,
    DPO_DASHBOARD_PANELS,
    MAIN_PANELS,
    SFT_DASHBOARD_PANELS,
    VIEWS,
    dashboard_kind,
    dashboard_panels,
    draw_dashboard,
    draw_dpo_dashboard,
    draw_sft_dashboard,
    idle_panels,
    make_dashboard_axes,
    plot_dashboard,
    plot_history,
    run_colors,
    save_training_plots,
    smooth,
)
from .style import (
    ALGO_COLORS,
    METRIC_LABELS,
    METRIC_TITLES,
    MIN_FONT_SIZE,
    algo_color,
    figure_png,
    in_notebook,
    metric_title,
    new_figure,
    show,
)
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
    "ALGO_COLORS", "DASHBOARD_GUIDE", "DASHBOARD_PANELS", "DPO_DASHBOARD_PANELS", "EXPLORERS", "MAIN_PANELS",
    "METRIC_LABELS", "METRIC_TITLES", "MIN_FONT_SIZE", "SFT_DASHBOARD_PANELS", "VIEWS", "LiveDashboard",
    "LogSlider", "algo_color", "clip_explorer", "dashboard_guide", "dashboard_kind", "dashboard_panels",
    "dpo_step_diagram", "draw_dashboard", "draw_dpo_dashboard", "draw_sft_dashboard", "explore", "figure_png",
    "grpo_step_diagram", "idle_panels", "in_notebook", "make_dashboard_axes", "make_explorer", "metric_title",
    "new_figure", "plot_clip_surrogate", "plot_dashboard", "plot_history", "plot_next_token_distribution",
    "ppo_step_diagram", "register_explorer", "rlhf_stages_diagram", "run_colors", "sampling_explorer",
    "save_training_plots", "show", "smooth", "step_diagram",
]
