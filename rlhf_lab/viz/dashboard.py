"""`LiveDashboard`: one figure that redraws itself while `Trainer.train()` or `SFTTrainer.train()` runs.

    from rlhf_lab.viz import LiveDashboard
    trainer = Trainer(config, callbacks=[LiveDashboard()])    # or trainer.add_callback(LiveDashboard())
    trainer.train()
    Trainer(config, callbacks=[LiveDashboard(view="full")])  # every panel
    sft = SFTTrainer(sft_config, tokenizer, callbacks=[LiveDashboard()])   # the SFT view
    sft.train()

An RL trainer gets six large panels by default (`view="main"`, see plots.py): reward (mean, std band,
min-max band), accuracy (held-out as dots, rollout as a line), KL to the reference (k1, k3; an isolated
spike is marked instead of flattening the curve), entropy, and for the latest step the advantages and
the rewards of each prompt group. A line under them says what the panels left out show in this run
(on-policy: every importance ratio is exactly 1 and nothing is clipped). `view="full"` adds clip
fractions, completion length, truncation rate, time per step and the token- and sequence-level
importance ratios (twelve panels); there a panel with no information becomes a one-line note.
`rlhf_lab.viz.DASHBOARD_GUIDE` says what healthy and failing curves look like. An SFT trainer (its
`dashboard_kind` is "sft"; a trainer without the attribute is told by its history's columns) gets
six: training loss, held-out accuracy, learning rate, gradient norm, time per step and throughput.
A DPO trainer ("dpo") gets six: loss, implicit rewards, preference accuracy, the log-probs of the
chosen and rejected completions, the held-out metrics and the gradient norm.
The dashboard imports no trainer: it reads `history`, `config` and those attributes.

Where the frames go:
- Inside a Jupyter kernel (JupyterLab, VS Code, Colab, headless nbclient): one output image,
  `display(..., display_id=True)` once, then `handle.update(...)`. The figure is rendered to PNG
  by Agg ourselves instead of handing IPython the Figure, so it works under any matplotlib backend
  (inline, %matplotlib widget, qt) and without ipympl, and a saved notebook keeps the last frame.
- Anywhere else (a script, the CLI, terminal IPython): PNG files in `png_dir`, Agg only, no display.
`mode="notebook"|"png"` forces one.

Cost. A redraw (six or twelve axes rendered by Agg, PNG-encoded) takes ~0.1-0.3 s on a laptop CPU, and a
lab RL step ~0.5-1 s. A redraw happens at most every `refresh_every` steps, never sooner than
`min_interval` seconds after the last one, and (the `max_overhead` guard) only after enough
training that drawing adds at most that fraction to the run's time: after a redraw that took d
seconds the next waits d / max_overhead seconds. So the default slows training by <= 10% on any
machine, whatever the step time. `bench/dashboard_overhead.py` measures it. The end of training
(Stop / KeyboardInterrupt included: the trainer calls `on_train_end` from `finally`) always draws
a last frame.

A dashboard never stops training: a drawing error becomes one warning (`last_error` keeps it)
unless `raise_errors=True`, which the tests use.
"""

from __future__ import annotations

import statistics
import time
import warnings
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ..train.callbacks import Callback
from ..util.validation import check_choice, check_number, check_optional
from .plots import VIEWS, dashboard_figsize, dashboard_kind, draw_figure, make_dashboard_axes
from .style import figure_png, in_notebook

MODES = ("auto", "notebook", "png")


class LiveDashboard(Callback):
    """A trainer callback that keeps one dashboard figure up to date.

    Args:
        refresh_every: redraw at most every this many steps.
        min_interval: seconds that must pass between two redraws.
        max_overhead: drawing may add at most this fraction to the training time (None: no guard).
        x: "step" or "wall_time" (seconds of training, evaluation excluded) for the curves.
        mode: "auto" (notebook inside a Jupyter kernel, else png), "notebook" or "png".
        png_dir: where png mode writes `dashboard.png` (overwritten at each redraw).
        keep_frames: png mode also keeps every frame as `step_000040.png`.
        view: "main" (six large panels for RL) or "full" (all twelve); SFT and DPO have six in both.
        figsize, dpi: size of the figure (inches; default `plots.dashboard_figsize(kind, view)`, 13 x 8 for
            the main RL view) and of the image (dots per inch).
        raise_errors: re-raise drawing errors instead of warning (for tests).
    """

    def __init__(self, refresh_every: int = 5, min_interval: float = 1.0, max_overhead: float | None = 0.1,
                 x: str = "step", mode: str = "auto", png_dir: str | Path = "dashboard_frames",
                 keep_frames: bool = False, figsize: tuple[float, float] | None = None, dpi: float = 72,
                 raise_errors: bool = False, view: str = "main") -> None:
        check_number("refresh_every", refresh_every, low=1, integer=True)
        check_number("min_interval", min_interval, low=0)  # seconds
        check_optional(check_number, "max_overhead", max_overhead, low=0, high=1, low_open=True,
                       high_open=True)
        check_choice("x", x, ("step", "wall_time"))
        check_choice("mode", mode, MODES)
        check_choice("view", view, VIEWS)
        self.refresh_every = refresh_every
        self.min_interval = min_interval
        self.max_overhead = max_overhead
        self.x = x
        self.mode = mode
        self.png_dir = Path(png_dir)
        self.keep_frames = keep_frames
        self.dpi = dpi
        self.raise_errors = raise_errors
        self.view = view
        # The figure is ours alone (no pyplot): nothing else shows it, closes it or redraws it.
        self.figsize = figsize
        self.kind = "rl"  # the panels the figure holds now; switched at the first draw for an SFT trainer
        self.figure = Figure(figsize=figsize or dashboard_figsize(self.kind, view), dpi=dpi)
        FigureCanvasAgg(self.figure)
        self.axes = make_dashboard_axes(self.figure, self.kind, view)
        self.distributions = None  # latest StepDistributions
        self.handle = None  # IPython DisplayHandle of the current train() call
        self.draw_times: list[float] = []  # seconds per redraw (render + PNG + display)
        self.last_error: Exception | None = None
        self._steps_since_draw = 0
        self._last_draw_end = 0.0
        self._warned = False

    # ------------------------------------------------------------------------------------------
    # Callback hooks

    def on_train_begin(self, trainer) -> None:
        self.handle = None  # each train() call gets its own output, in the cell that runs it
        previous = getattr(trainer, "distributions", None)  # train() again: start from its last step
        self.distributions = previous[-1] if previous else None
        self.draw(trainer)

    def on_step_end(self, trainer, metrics: dict, distributions=None) -> None:
        if distributions is not None:
            self.distributions = distributions
        self._steps_since_draw += 1
        if self.due():
            self.draw(trainer)

    def on_train_end(self, trainer) -> None:
        self.draw(trainer)  # the final frame stays in the notebook / in png_dir

    # ------------------------------------------------------------------------------------------

    @property
    def resolved_mode(self) -> str:
        if self.mode != "auto":
            return self.mode
        return "notebook" if in_notebook() else "png"

    def due(self) -> bool:
        """Whether the step that just ended should be drawn (see the module docstring)."""
        if self._steps_since_draw < self.refresh_every:
            return False
        since = time.perf_counter() - self._last_draw_end
        wait = self.min_interval
        if self.max_overhead is not None and self.draw_times:
            draw = statistics.median(self.draw_times[-5:])  # one slow frame (a busy machine) is noise
            wait = max(wait, draw / self.max_overhead)  # draw / wait <= max_overhead
        return since >= wait

    def draw(self, trainer) -> None:
        """Redraw now from `trainer.history`, `trainer.config` and the latest distributions."""
        start = time.perf_counter()
        try:
            history = trainer.history
            config = getattr(trainer, "config", None)
            kind = dashboard_kind(trainer, history)
            if kind != self.kind:
                self._make_panels(kind)
            max_length = getattr(trainer, "max_completion_length", None)
            draw_figure(self.figure, self.axes, kind, history, self.distributions, config, self.x, max_length)
            step = int(history["step"].max()) if "step" in history.columns and len(history) else 0
            self._publish(step)
        except Exception as exc:  # a plot must never cost a training run
            self.last_error = exc
            if self.raise_errors:
                raise
            if not self._warned:
                warnings.warn(f"LiveDashboard could not draw ({type(exc).__name__}: {exc}); training goes on",
                              RuntimeWarning, stacklevel=2)
                self._warned = True
        finally:
            self._last_draw_end = time.perf_counter()
            self.draw_times.append(self._last_draw_end - start)
            self._steps_since_draw = 0

    def _make_panels(self, kind: str) -> None:
        """Replace the panels by those of `kind` (the same Figure, so a notebook's output keeps its place)."""
        self.figure.clear()
        self.figure.set_size_inches(self.figsize or dashboard_figsize(kind, self.view))
        self.axes = make_dashboard_axes(self.figure, kind, self.view)
        self.kind = kind

    def _publish(self, step: int) -> None:
        png = figure_png(self.figure, dpi="figure")
        if self.resolved_mode == "notebook":
            from IPython.display import Image, display

            image = Image(data=png, format="png")
            if self.handle is None:
                self.handle = display(image, display_id=True)
            else:
                self.handle.update(image)
            return
        self.png_dir.mkdir(parents=True, exist_ok=True)
        (self.png_dir / "dashboard.png").write_bytes(png)
        if self.keep_frames:
            (self.png_dir / f"step_{step:06d}.png").write_bytes(png)

    def _repr_png_(self) -> bytes:
        """`dash` as the last line of a cell shows the latest frame again."""
        return figure_png(self.figure, dpi="figure")

    @property
    def total_draw_time(self) -> float:
        return sum(self.draw_times)
