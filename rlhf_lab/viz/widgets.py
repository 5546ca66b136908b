"""Explorers: a plot with sliders in Jupyter, the same plot as a plain Figure everywhere else.

Every explorer is two functions:

    plot_clip_surrogate(epsilon=0.2, level="token")   pure: arguments in, matplotlib Figure out
    clip_explorer()                                   sliders around it (ipywidgets.interactive)

`make_explorer(plot_fn, fixed=None, **sliders)` builds the second from the first. Inside a Jupyter
kernel with ipywidgets it returns an `ipywidgets.interactive` (the cell shows it; moving a slider
redraws); anywhere else (a script, a test, `use_widgets=False`) it returns `plot_fn`'s Figure for
its default arguments, so a notebook executed headless still leaves a picture behind.

A slider spec is what `ipywidgets.interact` accepts, plus `LogSlider`:

    (min, max, step)            FloatSlider, or IntSlider when all three are ints
    ["a", "b"]                  Dropdown
    True / False                Checkbox
    LogSlider(1e-4, 0.5, 0.2)   FloatLogSlider (values spanning decades, e.g. a clip range)
    an ipywidgets widget        used as is

A slider starts at `plot_fn`'s default for that argument. Sliders only redraw on release
(continuous_update=False): a redraw may run a model forward pass. Every control shows its whole
name (ipywidgets cuts a description at ~80 px by default: "temperat...") and gets a track of
`SLIDER_WIDTH` (the default ~125 px track made a small drag jump from temperature 1 to 5).

Adding an explorer (RoPE, KV-cache memory, ...) is three steps: write `plot_something(...) -> Figure`
with a default for every slider argument, wrap it, and register it so `explore(name)` finds it:

    @register_explorer("rope")
    def rope_explorer(head_dim: int = 64):
        return make_explorer(plot_rope, fixed={"head_dim": head_dim}, base=LogSlider(100, 1e6, 1e4))

    explore("rope")   # in a notebook
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from ..rl.config import RLConfig
from ..rl.gspo import GSPOConfig
from ..rl.losses import clipped_surrogate
from ..sampling import SamplingConfig, explain_filters
from ..util.validation import check_choice, check_number
from .style import (
    ALGO_COLORS,
    CLIP_SHADE_COLOR,
    KEPT_COLOR,
    REMOVED_COLOR,
    figure_png,
    in_notebook,
    new_figure,
)

EXPLORERS: dict[str, Callable] = {}

SLIDER_WIDTH = "560px"  # the whole control, label included; the track gets what the label leaves


def register_explorer(name: str) -> Callable[[Callable], Callable]:
    """Decorator: make an explorer function available as `explore(name, ...)`."""

    def add(explorer: Callable) -> Callable:
        EXPLORERS[name] = explorer
        return explorer

    return add


def explore(name: str, *args, **kwargs):
    """Build a registered explorer by name (see EXPLORERS)."""
    check_choice("name", name, tuple(sorted(EXPLORERS)))
    return EXPLORERS[name](*args, **kwargs)


@dataclass(frozen=True)
class LogSlider:
    """A slider on a log10 scale from `min` to `max`, starting at `value` (or plot_fn's default)."""

    min: float
    max: float
    value: float | None = None


def widgets_available() -> bool:
    if not in_notebook():
        return False
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    return True


def _control(spec, default):
    """The ipywidgets control for one slider spec (see the module docstring)."""
    import ipywidgets

    if isinstance(spec, ipywidgets.Widget):
        return spec
    if isinstance(spec, LogSlider):
        value = spec.value if spec.value is not None else default
        value = spec.min if value is None else value
        control = ipywidgets.FloatLogSlider(value=value, base=10, min=math.log10(spec.min),
                                            max=math.log10(spec.max), step=0.01, readout_format=".2g")
    else:
        start = inspect.Parameter.empty if default is None else default
        control = ipywidgets.interactive.widget_from_abbrev(spec, start)
    if hasattr(control, "continuous_update"):
        control.continuous_update = False
    # the full name, never "temperat..." (make_explorer aligns them)
    control.style.description_width = "initial"
    control.layout.width = SLIDER_WIDTH
    return control


def make_explorer(plot_fn: Callable[..., Figure], fixed: dict | None = None, use_widgets: bool | None = None,
                  dpi: float = 90, **sliders):
    """Sliders around `plot_fn(**fixed, **slider values) -> Figure`, or its static Figure.

    Args:
        plot_fn: a pure plotting function with a default for every slider argument.
        fixed: arguments passed unchanged (a model, a tokenizer, a prompt).
        use_widgets: None = widgets inside a Jupyter kernel when ipywidgets is installed; False = always
            the static Figure; True = always widgets.
        sliders: argument name -> slider spec.
    Returns:
        `ipywidgets.interactive` (its `.kwargs_widgets` are the controls) or a matplotlib Figure.
    """
    fixed = dict(fixed or {})
    parameters = inspect.signature(plot_fn).parameters
    unknown = [name for name in list(sliders) + list(fixed) if name not in parameters]
    if unknown:
        raise ValueError(f"slider and fixed names must be arguments of {plot_fn.__name__} "
                         f"{tuple(parameters)}, got {unknown}")
    if use_widgets is None:
        use_widgets = widgets_available()
    if not use_widgets:
        return plot_fn(**fixed)

    import ipywidgets
    from IPython.display import Image, display

    def show(**values):
        figure = plot_fn(**fixed, **values)
        # PNG bytes render the same under every backend and need no ipympl.
        display(Image(data=figure_png(figure, dpi=dpi), format="png"))

    defaults = {name: None if parameter.default is inspect.Parameter.empty else parameter.default
                for name, parameter in parameters.items()}
    controls = {name: _control(spec, defaults[name]) for name, spec in sliders.items()}
    label_width = f"{max(len(name) for name in controls) * 8 + 12}px" if controls else "initial"
    for control in controls.values():  # one label column: the tracks start and end together
        control.style.description_width = label_width
    return ipywidgets.interactive(show, **controls)


# ----------------------------------------------------------------------------------------------
# sampling: what temperature, top-k, top-p, min-p and the repetition penalty do to the next token


def token_label(tokenizer, token_id: int) -> str:
    """A readable label for one token: the character, '␣' for a space, '<eos>' for specials."""
    vocab = getattr(tokenizer, "id_to_token", None)
    if isinstance(vocab, dict):
        token = vocab.get(token_id)
    elif hasattr(tokenizer, "convert_ids_to_tokens"):
        token = tokenizer.convert_ids_to_tokens(token_id)
    else:
        token = tokenizer.decode([token_id])
    if token is None:
        return f"#{token_id}"
    return "␣" if token == " " else token


@torch.no_grad()
def next_token_logits(model, tokenizer, prompt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits (vocab,) float32 at the last prompt position, input_ids (seq,)) for one prompt."""
    input_ids = torch.tensor(tokenizer.encode(prompt, add_bos=True), dtype=torch.long)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        logits = model(input_ids[None].to(device)).logits[0, -1].float().cpu()
    finally:
        model.train(was_training)
    return logits, input_ids


def plot_next_token_distribution(
    model,
    tokenizer,
    prompt: str = "047+085=",
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    repetition_penalty: float = 1.0,
    top_n: int = 24,
) -> Figure:
    """The model's next-token distribution before and after the sampling filters (2 axes).

    Top: probabilities after the repetition penalty and temperature, the distribution the
    truncation filters (top-k -> top-p -> min-p) look at; bars in KEPT_COLOR survive, bars in
    REMOVED_COLOR get probability 0. Bottom: the renormalised distribution actually sampled from.
    The `top_n` most likely tokens are shown, each bar's gid is "token:<id>".
    """
    config = SamplingConfig(do_sample=True, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                            repetition_penalty=repetition_penalty)
    logits, input_ids = next_token_logits(model, tokenizer, prompt)
    explanation = explain_filters(logits, input_ids, config)
    # The truncation filters see the distribution after the context processors and the temperature.
    before = explanation["probs_raw"]
    for stage in ("repetition_penalty", "no_repeat_ngram", "temperature"):
        if stage in explanation["probs_by_stage"]:
            before = explanation["probs_by_stage"][stage]
    kept = explanation["kept"]
    order = torch.argsort(before, descending=True)[:top_n]
    ids = order.tolist()
    labels = [token_label(tokenizer, i) for i in ids]
    positions = np.arange(len(ids))
    colors = [KEPT_COLOR if kept[i] else REMOVED_COLOR for i in ids]

    fig = new_figure((max(6.0, 0.32 * len(ids) + 2), 5.6))
    top, bottom = fig.subplots(2, 1, sharex=True)
    bars = top.bar(positions, before[order].numpy(), color=colors, edgecolor="none")
    for bar, token_id in zip(bars, ids):
        bar.set_gid(f"token:{token_id}")
    removed_counts: dict[str, int] = {}
    for stage in explanation["removed_by"]:
        if stage is not None:
            removed_counts[stage] = removed_counts.get(stage, 0) + 1
    removed_text = ", ".join(f"{stage}: {count}" for stage, count in removed_counts.items()) or "no filter"
    top.legend(handles=[Patch(color=KEPT_COLOR, label=f"kept: {int(kept.sum())} tokens"),
                        Patch(color=REMOVED_COLOR, label=f"removed by {removed_text}")],
               loc="upper right", frameon=False, fontsize=8)
    stages = " -> ".join(explanation["stages"]) or "no filter active"
    top.set(title=f"next token after {prompt!r}   ({stages})", ylabel="probability before truncation")
    bottom.bar(positions, explanation["probs_final"][order].numpy(), color=colors, edgecolor="none")
    hidden = float(before.sum() - before[order].sum())
    bottom.set(ylabel="probability sampled from",
               xlabel=f"token (the {len(ids)} most likely; the other {len(before) - len(ids)} "
                      f"hold p = {hidden:.3f})")
    bottom.set_xticks(positions, labels)
    for label in bottom.get_xticklabels():
        if len(label.get_text()) > 1:  # "<eos>", "<bos>": upright they overlap their neighbours
            label.set_rotation(90)
    for ax in (top, bottom):
        ax.set_ylim(0, None)
        ax.grid(axis="y", alpha=0.3)
    return fig


@register_explorer("sampling")
def sampling_explorer(model, tokenizer, prompt: str = "047+085=", use_widgets: bool | None = None):
    """Sliders for temperature, top-k, top-p, min-p and the repetition penalty on one prompt."""
    vocab_size = len(tokenizer)
    return make_explorer(
        plot_next_token_distribution, fixed={"model": model, "tokenizer": tokenizer, "prompt": prompt},
        use_widgets=use_widgets,
        temperature=LogSlider(0.1, 4.0), top_k=(0, vocab_size, 1), top_p=(0.05, 1.0, 0.05),
        min_p=(0.0, 0.95, 0.05), repetition_penalty=(0.5, 3.0, 0.1),
    )


# ----------------------------------------------------------------------------------------------
# clipping: PPO / GRPO clip token ratios at 1 +- 0.2, GSPO clips sequence ratios at 1 +- 3e-4

CLIP_DEFAULTS = {  # level -> (epsilon, epsilon_high): the configs' own defaults
    "token": (RLConfig.epsilon, RLConfig.epsilon),  # PPO / GRPO: 0.2
    "sequence": (GSPOConfig.epsilon, GSPOConfig.epsilon_high),  # GSPO paper: 3e-4 / 4e-4
}


def clip_surrogate_curves(ratios: torch.Tensor, advantage: float, epsilon: float, epsilon_high: float):
    """(objective (n,), clipped (n,) bool) along `ratios` (n,); objective = -loss of clipped_surrogate."""
    advantages = torch.full_like(ratios, float(advantage))
    loss, low, high = clipped_surrogate(ratios[None], advantages[None], epsilon, epsilon_high)
    return -loss[0], (low | high)[0]  # min(r A, clip(r, 1-eps, 1+eps_high) A), and where the gradient is 0


def plot_clip_surrogate(epsilon: float | None = None, epsilon_high: float | None = None, level: str = "token",
                        advantage: float = 1.0, num_points: int = 801) -> Figure:
    """min(r A, clip(r, 1-eps, 1+eps_high) A) against the ratio r, in 2 axes: A > 0 and A < 0.

    Shaded: where the clip is active and the gradient with respect to r is zero.
    level="token" (PPO, GRPO: r is one token's pi/pi_old, eps ~ 0.2) or "sequence" (GSPO: r is the
    length-normalised sequence ratio s_i, eps ~ 3e-4, so the x-axis zooms in ~667x).
    epsilon / epsilon_high default to that level's usual values; epsilon_high defaults to epsilon.
    The surrogate line of each axes has gid "surrogate".
    """
    check_choice("level", level, tuple(CLIP_DEFAULTS))
    default_low, default_high = CLIP_DEFAULTS[level]
    if epsilon is None:
        epsilon = default_low
        epsilon_high = default_high if epsilon_high is None else epsilon_high
    epsilon_high = epsilon if epsilon_high is None else epsilon_high
    check_number("epsilon", epsilon, low=0, high=1, low_open=True, high_open=True)
    check_number("epsilon_high", epsilon_high, low=0, low_open=True)
    if not advantage != 0:
        raise ValueError(f"advantage must be non-zero (its sign picks the panel), got {advantage}")

    span = 3 * max(epsilon, epsilon_high)
    ratios = torch.linspace(max(1 - span, 1e-3), 1 + span, num_points, dtype=torch.float64).float()
    color = ALGO_COLORS["gspo" if level == "sequence" else "grpo"]
    name = "s_i = (pi(y)/pi_old(y))^(1/|y|)" if level == "sequence" else "r_t = pi(a_t)/pi_old(a_t)"
    fig = new_figure((10, 4))
    axes = fig.subplots(1, 2)
    for ax, sign in zip(axes, (1, -1)):
        A = sign * abs(advantage)
        objective, clipped = clip_surrogate_curves(ratios, A, epsilon, epsilon_high)
        r = ratios.numpy()
        ax.fill_between(r, 0, 1, where=clipped.numpy(), transform=ax.get_xaxis_transform(),
                        color=CLIP_SHADE_COLOR, alpha=0.4, linewidth=0, label="clipped: gradient 0")
        ax.plot(r, r * A, color="grey", linestyle="--", linewidth=1, label="r A (unclipped)")
        ax.plot(r, objective.numpy(), color=color, linewidth=2, label="min(r A, clip(r) A)", gid="surrogate")
        for bound in (1 - epsilon, 1 + epsilon_high):
            ax.axvline(bound, color="black", linestyle=":", linewidth=0.8)
        ax.ticklabel_format(axis="x", useOffset=False)
        side = "above 1+eps_high: stop pushing up" if sign > 0 else "below 1-eps: stop pushing down"
        ax.set(title=f"A {'>' if sign > 0 else '<'} 0  (A = {A:g}): {side}", xlabel=f"{level} ratio {name}",
               ylabel="surrogate objective (maximised)")
        ax.grid(alpha=0.3)
    axes[0].legend(loc="upper left", frameon=False, fontsize=8)
    fig.suptitle(f"{level}-level clip, eps = {epsilon:g}, eps_high = {epsilon_high:g}")
    return fig


@register_explorer("clip")
def clip_explorer(use_widgets: bool | None = None):
    """Sliders for eps / eps_high and a token/sequence switch that resets them to that level's defaults."""
    explorer = make_explorer(
        plot_clip_surrogate, use_widgets=use_widgets,
        epsilon=LogSlider(1e-4, 0.5, CLIP_DEFAULTS["token"][0]),
        epsilon_high=LogSlider(1e-4, 0.5, CLIP_DEFAULTS["token"][1]),
        level=list(CLIP_DEFAULTS),
    )
    if isinstance(explorer, Figure):
        return explorer
    controls = {control.description: control for control in explorer.kwargs_widgets}

    def use_level_defaults(change) -> None:
        controls["epsilon"].value, controls["epsilon_high"].value = CLIP_DEFAULTS[change["new"]]

    controls["level"].observe(use_level_defaults, names="value")
    return explorer
