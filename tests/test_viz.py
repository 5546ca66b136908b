"""The dashboard (RL and SFT), the plots, the notebook helpers and the explorers, headless (Agg), on
hand-made histories and short real runs."""

from __future__ import annotations

import math
import time
from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from rlhf_lab.model import LlamaModel  # noqa: E402
from rlhf_lab.rl import StepDistributions  # noqa: E402
from rlhf_lab.rl.losses import clipped_surrogate  # noqa: E402
from rlhf_lab.rl.metrics import METRIC_COLUMNS  # noqa: E402
from rlhf_lab.sampling import SamplingConfig, explain_filters  # noqa: E402
from rlhf_lab.sft import SFTConfig, SFTTrainer, lab_model_config  # noqa: E402
from rlhf_lab.text.tokenizer import default_tokenizer  # noqa: E402
from rlhf_lab.train.callbacks import Callback  # noqa: E402
from rlhf_lab.viz import (  # noqa: E402
    ALGO_COLORS,
    EXPLORERS,
    SFT_DASHBOARD_PANELS,
    LiveDashboard,
    algo_color,
    clip_explorer,
    dashboard_kind,
    explore,
    make_explorer,
    plot_clip_surrogate,
    plot_dashboard,
    plot_history,
    plot_next_token_distribution,
    sampling_explorer,
    save_training_plots,
    show,
    smooth,
)
from rlhf_lab.viz.style import KEPT_COLOR, REMOVED_COLOR, ZERO_VARIANCE_COLOR, figure_png  # noqa: E402

# ----------------------------------------------------------------------------------------------
# fakes: what a Trainer exposes to a callback


def fake_history(steps: int, nan_columns: tuple[str, ...] = ()) -> pd.DataFrame:
    """Row 0 as the trainer writes it (only eval_accuracy), then `steps` full rows."""
    rng = np.random.default_rng(0)
    rows = [{"step": 0, "wall_time": 0.0, "eval_accuracy": 0.1}]
    for step in range(1, steps + 1):
        row = {column: float(rng.random()) for column in METRIC_COLUMNS}
        row.update(step=step, wall_time=0.5 * step, eval_accuracy=0.5 if step % 2 == 0 else float("nan"))
        for column in nan_columns:
            row[column] = float("nan")
        rows.append(row)
    frame = pd.DataFrame(rows)
    return frame[[c for c in METRIC_COLUMNS if c in frame.columns]]


def fake_distributions(step: int, num_generations: int, num_prompts: int = 6, on_policy: bool = False):
    generator = torch.Generator().manual_seed(step)
    N = num_prompts * num_generations
    rewards = (torch.rand(N, generator=generator) > 0.5).float()
    if num_generations > 1:
        groups = rewards.view(num_prompts, num_generations)
        groups[2:, 0], groups[2:, 1] = 1.0, 0.0  # every other group has different rewards...
        groups[0], groups[1] = 1.0, 0.0  # ...but one is all right and one all wrong: zero variance
    tokens = 5 * N
    if on_policy:
        token_ratios, sequence_ratios = torch.ones(tokens), torch.ones(N)
    else:
        token_ratios = torch.exp(0.1 * torch.randn(tokens, generator=generator))
        sequence_ratios = torch.exp(1e-3 * torch.randn(N, generator=generator))
    return StepDistributions(step=step, advantages=torch.randn(N, generator=generator), rewards=rewards,
                             num_generations=num_generations, token_ratios=token_ratios,
                             sequence_ratios=sequence_ratios)


class FakeTrainer:
    """Grows a history row by row and calls callbacks the way Trainer.train does (Stop included)."""

    def __init__(self, config, history: pd.DataFrame) -> None:
        self.config = config
        self.full_history = history
        self.rows = 1
        self.max_completion_length = 6
        self.stop_reason = None

    @property
    def history(self) -> pd.DataFrame:
        return self.full_history.iloc[: self.rows]

    def run(self, callback: Callback, distributions, *more_callbacks: Callback) -> None:
        callbacks = [callback, *more_callbacks]
        for c in callbacks:
            c.on_train_begin(self)
        try:
            for step in range(1, len(self.full_history)):
                self.rows = step + 1
                metrics = self.full_history.iloc[step].to_dict()
                for c in callbacks:
                    c.on_step_end(self, metrics, distributions(step))
        except KeyboardInterrupt:
            self.stop_reason = "interrupted"
        finally:
            for c in callbacks:
                c.on_train_end(self)


GRPO = SimpleNamespace(algo="grpo", eps_low=0.2, eps_high=0.28, on_policy=False, clip=True)
GSPO = SimpleNamespace(algo="gspo", eps_low=3e-4, eps_high=4e-4, on_policy=False,
                       importance_sampling_level="sequence")
PPO = SimpleNamespace(algo="ppo", eps_low=0.2, eps_high=0.2, on_policy=False)
REINFORCE = SimpleNamespace(algo="reinforce", eps_low=0.2, eps_high=0.2, on_policy=True, clip=False)


@pytest.fixture
def tiny_model():
    torch.manual_seed(0)
    tokenizer = default_tokenizer()
    model = LlamaModel(lab_model_config(tokenizer, hidden_size=32, num_hidden_layers=1, intermediate_size=64))
    return model, tokenizer


def texts_of(fig: Figure) -> str:
    """Every title, note and annotation of a figure, the line under the panels included."""
    return " | ".join([*(t.get_text() for ax in fig.axes for t in [ax.title, *ax.texts]),
                       *(t.get_text() for t in fig.texts)])


# ----------------------------------------------------------------------------------------------
# LiveDashboard


def test_dashboard_writes_pngs_in_a_script(tmp_path):
    dash = LiveDashboard(refresh_every=2, min_interval=0.0, max_overhead=None, png_dir=tmp_path,
                         keep_frames=True, raise_errors=True)
    assert dash.resolved_mode == "png"  # pytest is not a Jupyter kernel
    trainer = FakeTrainer(GRPO, fake_history(1))
    trainer.run(dash, lambda step: fake_distributions(step, 4))
    # begin (step 0) and end (step 1); frames are named by the last step drawn
    assert len(dash.draw_times) == 2 and dash.last_error is None
    assert (tmp_path / "dashboard.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.glob("step_*.png")) == ["step_000000.png", "step_000001.png"]
    assert (tmp_path / "dashboard.png").read_bytes() == (tmp_path / "step_000001.png").read_bytes()


@pytest.mark.parametrize("view", ["main", "full"])
@pytest.mark.parametrize(
    "config, num_generations, on_policy",
    [(GRPO, 4, False), (GSPO, 4, False), (PPO, 1, False), (REINFORCE, 4, True)],
    ids=["grpo", "gspo", "ppo", "reinforce-on-policy"],
)
def test_dashboard_draws_every_algorithm(tmp_path, monkeypatch, config, num_generations, on_policy, view):
    dash = LiveDashboard(refresh_every=100, png_dir=tmp_path, raise_errors=True, view=view)
    published = []
    monkeypatch.setattr(dash, "_publish", published.append)  # render once, below, to keep the test fast
    trainer = FakeTrainer(config, fake_history(4))
    trainer.run(dash, lambda step: fake_distributions(step, num_generations, on_policy=on_policy))
    assert published == [0, 4] and dash.last_error is None  # begin and end
    assert figure_png(dash.figure)[:4] == b"\x89PNG"
    assert len(dash.figure.axes) == (6 if view == "main" else 12)
    assert dash.figure.get_suptitle().startswith(f"{config.algo.upper()}: step 4")
    # every line of the curves is in the algorithm's colour
    colors = {to_hex(line.get_color()) for line in dash.axes["kl"].lines}
    assert colors == {ALGO_COLORS[config.algo]}
    text = texts_of(dash.figure)
    assert ("no groups" in text) == (num_generations == 1)
    assert ("exactly 1" in text) == on_policy  # a panel's note (full) or the line under the panels (main)
    assert ("does not clip" in text) == (config is REINFORCE)


def test_dashboard_panels_show_what_the_step_did(tmp_path, monkeypatch):
    trainer = FakeTrainer(GRPO, fake_history(2))
    dash = LiveDashboard(refresh_every=100, png_dir=tmp_path, raise_errors=True, view="full")
    monkeypatch.setattr(dash, "_publish", lambda step: None)  # the panels' artists are what we check
    trainer.run(dash, lambda step: fake_distributions(step, 4))
    groups = dash.axes["groups"]
    # 2 of 6 groups have equal rewards: their 8 dots are grey, the other 16 in GRPO's colour
    informative, equal = groups.collections
    assert len(informative.get_offsets()) == 16 and len(equal.get_offsets()) == 8
    assert to_hex(equal.get_facecolor()[0]) == ZERO_VARIANCE_COLOR
    assert to_hex(informative.get_facecolor()[0]) == ALGO_COLORS["grpo"]
    assert "2/6 all equal" in groups.get_title()
    # GRPO clips token ratios: the bounds 1 - 0.2 and 1 + 0.28 are drawn there, not on the sequence panel
    token_bounds = sorted(line.get_xdata()[0] for line in dash.axes["token_ratios"].lines)
    assert token_bounds == pytest.approx([0.8, 1.28])
    assert len(dash.axes["sequence_ratios"].lines) == 0


def test_dashboard_copes_with_nan_columns_and_no_distributions(tmp_path, monkeypatch):
    dash = LiveDashboard(refresh_every=100, png_dir=tmp_path, raise_errors=True)
    monkeypatch.setattr(dash, "_publish", lambda step: None)  # rendered explicitly below
    dash.on_train_begin(SimpleNamespace(history=pd.DataFrame(), config=None))  # before the step-0 evaluation
    assert "waiting for the first step" in dash.figure.get_suptitle()
    figure_png(dash.figure)
    dash.on_train_begin(SimpleNamespace(history=fake_history(0), config=None))  # only eval_accuracy
    assert dash.figure.get_suptitle() == (
        "RUN: step 0   |   0.0 s of training   |   held-out accuracy 10.0% at step 0")
    # rows whose KL and clip columns are all NaN, and no distributions at all
    nan_columns = ("kl_k1", "kl_k3", "clip_frac_low", "clip_frac_high")
    trainer = FakeTrainer(PPO, fake_history(3, nan_columns=nan_columns))
    trainer.run(dash, lambda step: None)
    figure_png(dash.figure)
    assert dash.last_error is None
    text = texts_of(dash.figure)
    assert "no data yet" in text and "no distributions recorded" in text
    # a dashboard without raise_errors warns once and never stops training
    broken = LiveDashboard(min_interval=0.0, png_dir=tmp_path)
    with pytest.warns(RuntimeWarning, match="could not draw"):
        broken.on_train_begin(SimpleNamespace(history="not a dataframe", config=None))
    assert broken.last_error is not None


def test_dashboard_refresh_policy(tmp_path, monkeypatch):
    dash = LiveDashboard(refresh_every=3, min_interval=0.0, max_overhead=None, png_dir=tmp_path,
                         raise_errors=True)
    published = []
    monkeypatch.setattr(dash, "_publish", published.append)  # count frames without rendering them
    FakeTrainer(GRPO, fake_history(7)).run(dash, lambda step: None)
    assert published == [0, 3, 6, 7]  # begin, every 3 steps, end
    # min_interval: no redraw sooner than that many seconds after the last one
    slow = LiveDashboard(refresh_every=1, min_interval=3600.0, max_overhead=None, png_dir=tmp_path)
    published.clear()
    monkeypatch.setattr(slow, "_publish", published.append)
    FakeTrainer(GRPO, fake_history(4)).run(slow, lambda step: None)
    assert published == [0, 4]
    # the overhead guard: after a draw of d seconds wait d / 0.1 before the next one
    guarded = LiveDashboard(refresh_every=1, min_interval=0.0, max_overhead=0.1, png_dir=tmp_path)
    guarded.draw_times = [100.0]  # pretend the last draw took 100 s: the next may come 1000 s later
    guarded._steps_since_draw = 5
    guarded._last_draw_end = time.perf_counter() - 990.0
    assert not guarded.due()
    guarded._last_draw_end = time.perf_counter() - 1010.0
    assert guarded.due()
    with pytest.raises(ValueError, match="refresh_every"):
        LiveDashboard(refresh_every=0)
    with pytest.raises(ValueError, match="x must be"):
        LiveDashboard(x="time")


def test_dashboard_keeps_last_frame_when_training_is_interrupted(tmp_path, monkeypatch):
    class Stop(Callback):
        def on_step_end(self, trainer, metrics, distributions):
            if metrics["step"] == 3:
                raise KeyboardInterrupt

    dash = LiveDashboard(refresh_every=100, min_interval=0.0, png_dir=tmp_path, raise_errors=True)
    published = []
    monkeypatch.setattr(dash, "_publish", published.append)
    trainer = FakeTrainer(GRPO, fake_history(6))
    trainer.run(dash, lambda step: fake_distributions(step, 4), Stop())
    assert trainer.stop_reason == "interrupted"
    assert published == [0, 3]  # begin, then the final frame from on_train_end
    assert dash.figure.get_suptitle().startswith("GRPO: step 3")


def test_dashboard_on_a_real_trainer(tmp_path, monkeypatch, tiny_model):
    from rlhf_lab.rl import Trainer, make_config

    model, tokenizer = tiny_model
    config = make_config("grpo", steps=2, prompts_per_step=4, num_generations=4, eval_every=2,
                         eval_examples=8, n_train=100, n_test=20)
    dash = LiveDashboard(refresh_every=1, min_interval=0.0, max_overhead=None, png_dir=tmp_path,
                         raise_errors=True)
    published = []
    monkeypatch.setattr(dash, "_publish", published.append)
    trainer = Trainer(config, model=model, tokenizer=tokenizer)
    trainer.add_callback(dash)
    history = trainer.train()
    assert len(history) == 3 and published == [0, 1, 2, 2]  # begin, each step, end
    assert dash.distributions is trainer.distributions[-1]
    assert dash.figure.get_suptitle().startswith("GRPO: step 2")
    assert "4 prompts" not in dash.axes["groups"].get_title() and "G=4" in dash.axes["groups"].get_title()


# ----------------------------------------------------------------------------------------------
# LiveDashboard on SFT


SFT_PANELS = [name for row in SFT_DASHBOARD_PANELS for name in row]


def tiny_sft_trainer(tiny_model, steps: int, eval_every: int, callbacks=()) -> SFTTrainer:
    model, tokenizer = tiny_model
    config = SFTConfig(task_params={"digits": 2}, n_train=200, n_test=20, steps=steps, batch_size=8,
                       warmup_steps=2, eval_every=eval_every, eval_examples=10)
    return SFTTrainer(config, tokenizer, model=model, callbacks=callbacks)


def test_sft_run_draws_the_sft_dashboard_in_png_mode(tmp_path, tiny_model):
    dash = LiveDashboard(refresh_every=2, min_interval=0.0, max_overhead=None, mode="png", png_dir=tmp_path,
                         keep_frames=True, raise_errors=True)
    trainer = tiny_sft_trainer(tiny_model, steps=6, eval_every=3, callbacks=[dash])
    history = trainer.train()
    assert dash.last_error is None and dash.kind == "sft"
    # begin, every 2 steps while training (2, 4, 6), end
    assert len(dash.draw_times) == 5, (
        f"expected 5 draws, got {len(dash.draw_times)}: is on_step_end redrawing?")
    assert sorted(p.name for p in tmp_path.glob("step_*.png")) == [
        "step_000000.png", "step_000002.png", "step_000004.png", "step_000006.png"]
    assert (tmp_path / "dashboard.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list(dash.axes) == SFT_PANELS and len(dash.figure.axes) == 6
    assert dash.figure.get_suptitle().startswith("SFT ADDITION: step 6")
    loss_line = dash.axes["loss"].lines[-1]
    assert len(loss_line.get_xdata()) == 6 and dash.axes["loss"].get_yscale() == "log"
    (markers,) = dash.axes["eval_accuracy"].lines  # evaluations at steps 0, 3, 6 only
    assert list(markers.get_xdata()) == [0, 3, 6] and markers.get_marker() == "o"
    assert list(dash.axes["lr"].lines[0].get_ydata()) == history["lr"].iloc[1:].tolist()
    clip_lines = [line for line in dash.axes["grad_norm"].lines if line.get_linestyle() == ":"]
    assert clip_lines and clip_lines[0].get_ydata()[0] == trainer.config.max_grad_norm
    for name in ("step_time", "tokens_per_s"):
        assert len(dash.axes[name].lines[0].get_xdata()) == 6, f"{name} panel is empty"


def test_sft_dashboard_draws_a_last_frame_when_interrupted(tmp_path, monkeypatch, tiny_model):
    class Stop(Callback):
        def on_step_end(self, trainer, metrics, distributions=None):
            if metrics["step"] == 3:
                raise KeyboardInterrupt

    dash = LiveDashboard(refresh_every=100, min_interval=0.0, mode="png", png_dir=tmp_path, raise_errors=True)
    published = []
    monkeypatch.setattr(dash, "_publish", published.append)
    trainer = tiny_sft_trainer(tiny_model, steps=6, eval_every=0, callbacks=[dash, Stop()])
    history = trainer.train()
    assert trainer.stop_reason == "interrupted" and history["step"].tolist() == [0, 1, 2, 3]
    assert published == [0, 3], "Stop must still draw a final frame (on_train_end)"
    assert dash.figure.get_suptitle().startswith("SFT ADDITION: step 3")
    assert "no evaluation yet" in texts_of(dash.figure)


def test_dashboard_kind_and_switching_panels(tmp_path, monkeypatch):
    sft_history = pd.DataFrame({"step": [0, 1, 2], "loss": [math.nan, 3.0, 2.5],
                                "eval_accuracy": [0.0, math.nan, 0.1]})
    assert dashboard_kind(SimpleNamespace(dashboard_kind="sft")) == "sft"
    assert dashboard_kind(history=sft_history) == "sft"
    assert dashboard_kind(history=fake_history(2)) == "rl"
    assert dashboard_kind(SimpleNamespace(history=pd.DataFrame())) == "rl"
    with pytest.raises(ValueError, match="dashboard_kind"):
        dashboard_kind(SimpleNamespace(dashboard_kind="bogus"))
    # one dashboard reused: an SFT trainer (told by its columns), then an RL one
    dash = LiveDashboard(refresh_every=100, png_dir=tmp_path, raise_errors=True)
    monkeypatch.setattr(dash, "_publish", lambda step: None)
    dash.draw(SimpleNamespace(history=sft_history, config=None))
    assert dash.kind == "sft" and len(dash.figure.axes) == 6
    assert dash.figure.get_suptitle().startswith("SFT: step 2")
    FakeTrainer(GRPO, fake_history(2)).run(dash, lambda step: None)
    assert dash.kind == "rl" and len(dash.figure.axes) == 6 and set(dash.axes) >= {"kl", "groups"}
    fig = plot_dashboard(sft_history)
    assert len(fig.axes) == 6 and [ax.get_title() for ax in fig.axes][1] == (
        "Held-out accuracy (greedy)\n10.0% at the last evaluation")
    plt.close(fig)


# ----------------------------------------------------------------------------------------------
# notebook helpers


def test_smooth_is_a_trailing_mean_that_starts_short():
    values = [1.0, 2.0, 3.0, float("nan"), 5.0]
    smoothed = smooth(values, window=2)
    assert isinstance(smoothed, np.ndarray)
    np.testing.assert_allclose(smoothed, [1.0, 1.5, 2.5, 3.0, 5.0])  # NaN skipped inside its window
    np.testing.assert_allclose(smooth(pd.Series([4.0, 0.0, 2.0], index=[7, 8, 9])), [4.0, 2.0, 2.0])
    np.testing.assert_allclose(smooth([1.0, 5.0], window=1), [1.0, 5.0])
    with pytest.raises(ValueError, match="window"):
        smooth(values, window=0)


def test_show_displays_once_in_a_notebook_and_closes(monkeypatch):
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda obj: shown.append(obj))
    fig = plt.figure(figsize=(2, 2))  # registered with pyplot: show must release it
    fig.add_subplot().plot([0, 1])
    assert show(fig) is None and shown == []  # a script: nothing is displayed...
    assert fig.number not in plt.get_fignums()  # ...and the figure is closed
    monkeypatch.setattr("rlhf_lab.viz.style.in_notebook", lambda: True)
    small = Figure(figsize=(4, 2))
    small.add_subplot().plot([0, 1])
    show(small, dpi=50)
    (image,) = shown
    assert isinstance(image, IPython.display.Image) and image.data[:4] == b"\x89PNG"
    width = int.from_bytes(image.data[16:20], "big")
    assert width == 200, f"dpi=50 at 4 inches should give 200 pixels, got {width}"


def test_plot_history_title_colours_and_sft_defaults():
    runs = {f"grpo eps={eps}": fake_history(4) for eps in (0.1, 0.2, 0.3)}
    fig = plot_history(runs, metrics=["reward_mean", "eval_accuracy"], title="epsilon sweep")
    assert fig.get_suptitle() == "epsilon sweep"
    # by default the first GRPO run is GRPO's colour and the others shades of it, never the same colour
    colours = [to_hex(line.get_color()) for line in fig.axes[0].lines if line.get_label().startswith("grpo")]
    assert colours[0] == ALGO_COLORS["grpo"] and len(set(colours)) == 3
    plt.close(fig)
    fig = plot_history(runs, metrics=["reward_mean", "eval_accuracy"], colors="viridis")
    labelled = [line for line in fig.axes[0].lines if line.get_label().startswith("grpo")]
    assert len({to_hex(line.get_color()) for line in labelled}) == 3
    assert all(line.get_marker() == "o" for line in fig.axes[1].lines), "evaluations are drawn as markers"
    plt.close(fig)
    fig = plot_history(runs, metrics=["reward_mean"], colors={"grpo eps=0.1": "#123456"})
    assert to_hex(fig.axes[0].lines[0].get_color()) == "#123456"
    plt.close(fig)
    with pytest.raises(ValueError, match="colors"):
        plot_history(runs, metrics=["reward_mean"], colors="no-such-colormap")
    sft_history = pd.DataFrame({"step": [0, 1, 2], "loss": [math.nan, 3.0, 2.5],
                                "eval_accuracy": [0.0, math.nan, 0.1],
                                "lr": [math.nan, 1e-3, 2e-3], "grad_norm": [math.nan, 1.0, 0.5]})
    fig = plot_history({"sft": sft_history})
    assert [ax.get_title() for ax in fig.axes] == ["Training loss", "Held-out accuracy (greedy)",
                                                   "Learning rate", "Gradient norm"]
    plt.close(fig)


# ----------------------------------------------------------------------------------------------
# static plots


def test_plot_history_compares_algorithms_with_their_colours():
    histories = {"grpo": fake_history(5), "gspo": fake_history(5), "my run": fake_history(5)}
    fig = plot_history(histories, metrics=["reward_mean", "eval_accuracy", "kl_k3"], x="wall_time")
    assert len(fig.axes) == 3
    reward_ax = fig.axes[0]
    line_colors = [to_hex(line.get_color()) for line in reward_ax.lines]
    assert line_colors[:2] == [ALGO_COLORS["grpo"], ALGO_COLORS["gspo"]]
    assert reward_ax.get_xlabel() == "training time (s)"
    # eval_accuracy: only the finite evaluations (steps 0, 2, 4) are plotted
    assert len(fig.axes[1].lines[0].get_xdata()) == 3
    plt.close(fig)
    assert algo_color("gspo-token") == ALGO_COLORS["gspo"] and algo_color("PPO") == ALGO_COLORS["ppo"]
    with pytest.raises(ValueError, match="x must be"):
        plot_history(fake_history(2), x="time")


def test_plot_dashboard_and_save_training_plots(tmp_path):
    fig = plot_dashboard(fake_history(3), [fake_distributions(3, 4)], GSPO)
    assert len(fig.axes) == 6
    assert len(plot_dashboard(fake_history(3), [fake_distributions(3, 4)], GSPO, view="full").axes) == 12
    with pytest.raises(ValueError, match="view must be one of"):
        plot_dashboard(fake_history(3), view="everything")
    plt.close(fig)
    paths = save_training_plots(fake_history(3), None, tmp_path / "plots", config=GRPO)
    assert [p.name for p in paths] == ["curves.png", "dashboard.png"]
    assert all(p.stat().st_size > 1000 for p in paths)


# ----------------------------------------------------------------------------------------------
# explorers


def test_sampling_plot_colours_removed_tokens(tiny_model):
    model, tokenizer = tiny_model
    settings = dict(temperature=0.7, top_k=12, top_p=0.6, min_p=0.0, repetition_penalty=1.3)
    fig = plot_next_token_distribution(model, tokenizer, "47+85=", top_n=tokenizer.vocab_size, **settings)
    assert len(fig.axes) == 2
    ids = torch.tensor(tokenizer.encode("47+85=", add_bos=True))
    with torch.no_grad():
        logits = model(ids[None]).logits[0, -1]
    kept = explain_filters(logits, ids, SamplingConfig(**settings))["kept"]
    bars = [patch for patch in fig.axes[0].patches if (patch.get_gid() or "").startswith("token:")]
    assert len(bars) == tokenizer.vocab_size
    for bar in bars:
        token_id = int(bar.get_gid().split(":")[1])
        assert to_hex(bar.get_facecolor()) == (KEPT_COLOR if kept[token_id] else REMOVED_COLOR)
    assert 0 < int(kept.sum()) <= 12  # top-k 12 then top-p removed something
    # the lower panel is the distribution sampled from: removed tokens have probability 0
    final_heights = [patch.get_height() for patch in fig.axes[1].patches]
    removed_heights = [height for height, bar in zip(final_heights, bars)
                       if to_hex(bar.get_facecolor()) == REMOVED_COLOR]
    assert removed_heights and max(removed_heights) == 0.0
    assert sum(final_heights) == pytest.approx(1.0, abs=1e-5)
    plt.close(fig)


@pytest.mark.parametrize("level, epsilon, epsilon_high", [("token", 0.2, 0.28), ("sequence", None, None)])
def test_clip_plot_matches_clipped_surrogate(level, epsilon, epsilon_high):
    fig = plot_clip_surrogate(epsilon, epsilon_high, level=level, advantage=1.5)
    assert len(fig.axes) == 2
    low, high = (0.2, 0.28) if level == "token" else (3e-4, 4e-4)  # sequence: GSPO's defaults
    for ax, advantage in zip(fig.axes, (1.5, -1.5)):
        (line,) = [line for line in ax.lines if line.get_gid() == "surrogate"]
        ratios = torch.tensor(line.get_xdata(), dtype=torch.float32)
        loss, _, _ = clipped_surrogate(ratios[None], torch.full((1, len(ratios)), advantage), low, high)
        np.testing.assert_allclose(line.get_ydata(), -loss[0].numpy(), rtol=1e-6, atol=1e-7)
        # the x-axis spans the clip window: 1 +- 3 eps (GSPO's is about 667x narrower than GRPO's)
        assert ratios.max().item() == pytest.approx(1 + 3 * max(low, high), rel=1e-5)
    plt.close(fig)
    with pytest.raises(ValueError, match="level must be one of"):
        plot_clip_surrogate(level="token-ish")


def test_explorers_fall_back_to_a_figure_headless(tiny_model):
    model, tokenizer = tiny_model
    sampling = sampling_explorer(model, tokenizer)
    clip = clip_explorer()
    assert isinstance(sampling, Figure) and len(sampling.axes) == 2
    assert isinstance(clip, Figure) and len(clip.axes) == 2
    assert set(EXPLORERS) >= {"sampling", "clip"}
    assert isinstance(explore("clip"), Figure)
    for fig in (sampling, clip):
        plt.close(fig)
    with pytest.raises(ValueError, match="arguments of plot_clip_surrogate"):
        make_explorer(plot_clip_surrogate, temperature=(0.1, 2.0, 0.1))


def test_make_explorer_builds_widgets_when_asked(monkeypatch, capsys):
    import ipywidgets

    monkeypatch.setattr("rlhf_lab.viz.widgets.figure_png", lambda fig, dpi: b"")  # no kernel shows it anyway
    widget = clip_explorer(use_widgets=True)
    assert isinstance(widget, ipywidgets.interactive)
    controls = {control.description: control for control in widget.kwargs_widgets}
    assert set(controls) == {"epsilon", "epsilon_high", "level"}
    assert math.isclose(controls["epsilon"].value, 0.2) and controls["level"].value == "token"
    assert controls["epsilon"].continuous_update is False
    controls["level"].value = "sequence"  # switching level loads GSPO's clip range
    assert math.isclose(controls["epsilon"].value, 3e-4)
    assert math.isclose(controls["epsilon_high"].value, 4e-4)
    widget.close_all()


# ----------------------------------------------------------------------------------------------
# layout in the browser: labels, tick labels, the on-policy note


def test_explorer_controls_show_whole_names_on_a_wide_track(tiny_model, monkeypatch):
    """What learners read in the browser (tests/browser checks it in Chromium): explorer controls show
    their whole names on a track a learner can aim at."""
    pytest.importorskip("ipywidgets")
    from rlhf_lab.viz.widgets import SLIDER_WIDTH
    monkeypatch.setattr("rlhf_lab.viz.widgets.figure_png", lambda fig, dpi: b"")  # no kernel shows it anyway
    model, tokenizer = tiny_model
    explorer = sampling_explorer(model, tokenizer, use_widgets=True)
    controls = {control.description: control for control in explorer.kwargs_widgets}
    widths = {control.style.description_width for control in controls.values()}
    assert len(widths) == 1, f"labels of different widths: the tracks do not line up ({widths})"
    width = widths.pop()
    # ipywidgets' default label box is ~80 px and cut "repetition_penalty" to "repetition..."; 8 px per
    # character of the 13 px label font holds the longest name.
    assert width.endswith("px") and int(width[:-2]) >= 8 * max(len(name) for name in controls)
    assert all(control.layout.width == SLIDER_WIDTH for control in controls.values())
    temperature = controls["temperature"]
    assert type(temperature).__name__ == "FloatLogSlider" and temperature.continuous_update is False
    # 0.1-4 on a log track: from the default 1.0, a tenth of the track is a factor of 10**0.16 = 1.45.
    assert math.isclose(10 ** temperature.min, 0.1) and math.isclose(10 ** temperature.max, 4.0)
    assert math.isclose(temperature.value, 1.0)
    explorer.close_all()


def intervals_overlap(extents) -> list[tuple[int, int]]:
    return [(i, i + 1) for i, (a, b) in enumerate(zip(extents, extents[1:])) if a.x1 > b.x0]


def test_token_tick_labels_do_not_overlap(tiny_model):
    model, tokenizer = tiny_model
    fig = plot_next_token_distribution(model, tokenizer, top_n=len(tokenizer))  # every token, specials too
    assert isinstance(fig, Figure)
    renderer = fig.canvas.get_renderer()
    bottom = fig.axes[1]
    labels = bottom.get_xticklabels()
    texts = [label.get_text() for label in labels]
    assert "<eos>" in texts and "<bos>" in texts
    extents = [label.get_window_extent(renderer) for label in labels]
    assert not intervals_overlap(extents), [(texts[i], texts[j]) for i, j in intervals_overlap(extents)]
    plt.close(fig)


def test_on_policy_ratio_note_sits_above_its_bar():
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from rlhf_lab.viz.plots import draw_ratios

    fig = Figure(figsize=(4, 3), dpi=72)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    draw_ratios(ax, torch.ones(288), level="token")
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    (note,) = [text for text in ax.texts if "exactly 1" in text.get_text()]
    assert "all 288 ratios" in note.get_text()
    note_box = note.get_window_extent(renderer)
    (bar,) = ax.patches
    bar_box = bar.get_window_extent(renderer)
    assert note_box.y0 > bar_box.y1, "the note overlaps the bar (it was hidden behind it)"


# ----------------------------------------------------------------------------------------------
# a dashboard a learner can read: six panels, 9-pt type, titles in words, notes for idle panels


def visible_texts(fig: Figure):
    """The Text artists a reader sees: the figure's title and notes, and per axes its title, notes,
    annotations, axis labels and tick labels (those only where the axes is drawn)."""
    texts = list(fig.texts)  # the title (suptitle) and the line under the panels
    for ax in fig.axes:
        texts += [ax.title, *ax.texts]
        if ax.axison:
            (x0, x1), (y0, y1) = sorted(ax.get_xlim()), sorted(ax.get_ylim())
            texts += [ax.xaxis.label, ax.yaxis.label]
            # only the ticks in view: matplotlib keeps labels for ticks outside it, undrawn
            texts += [t for t in ax.get_xticklabels() if x0 <= t.get_position()[0] <= x1]
            texts += [t for t in ax.get_yticklabels() if y0 <= t.get_position()[1] <= y1]
    return [t for t in texts if t.get_visible() and t.get_text().strip()]


def on_policy_run(steps: int = 60, spike_at: int | None = None):
    """A history like 00_welcome's GRPO run: on-policy, nothing clipped or truncated, k3 about 0.01 nats per
    token with, optionally, one spike of 48 nats per token."""
    history = fake_history(steps)
    rng = np.random.default_rng(1)
    for name in ("clip_frac", "clip_frac_low", "clip_frac_high", "truncation_rate"):
        history.loc[1:, name] = 0.0
    history.loc[1:, "kl_k1"] = 0.01 + 0.002 * rng.standard_normal(steps)
    history.loc[1:, "kl_k3"] = 0.01 + 0.002 * np.abs(rng.standard_normal(steps))
    if spike_at is not None:
        history.loc[spike_at, "kl_k3"] = 48.0
    return history


ON_POLICY_GRPO = SimpleNamespace(algo="grpo", eps_low=0.2, eps_high=0.2, on_policy=True, clip=True)


@pytest.mark.parametrize("view, figsize", [("main", None), ("full", None), ("full", (13, 8))])
def test_dashboard_type_is_at_least_9_points_and_titles_fit(view, figsize):
    """9 pt or more everywhere; every title inside the figure and clear of its neighbours' (a cut title,
    "update (hatc", was the time panel's at figsize=(13, 8), which notebooks 05 and 06 use)."""
    history = on_policy_run(400, spike_at=330)  # and its label on the KL panel
    history.loc[1:, "truncation_rate"] = 0.1  # every panel drawn, none an idle note
    fig = plot_dashboard(history, [fake_distributions(400, 4)], GRPO, view=view, figsize=figsize)
    fig.canvas.draw()
    sizes = {t.get_text(): t.get_fontsize() for t in visible_texts(fig)}
    small = {text: size for text, size in sizes.items() if size < 9}
    assert not small, f"text below 9 pt: {small}"
    renderer = fig.canvas.get_renderer()
    page = fig.bbox
    titles = [ax.title for ax in fig.axes]
    boxes = [title.get_window_extent(renderer) for title in titles]
    for title, box in zip(titles, boxes):
        assert page.x0 - 1 <= box.x0 and box.x1 <= page.x1 + 1, (
            f"title cut at the figure's edge: {title.get_text()!r}")
    for text in visible_texts(fig):  # the title, the line under the panels, notes and labels
        box = text.get_window_extent(renderer)
        inside = (page.x0 - 1 <= box.x0 and box.x1 <= page.x1 + 1
                  and page.y0 - 1 <= box.y0 and box.y1 <= page.y1 + 1)
        assert inside, f"text runs off the figure: {text.get_text()!r}"
    for i, a in enumerate(boxes):
        for j, b in enumerate(boxes[i + 1:], i + 1):
            assert not a.overlaps(b), f"titles overlap: {titles[i].get_text()!r} and {titles[j].get_text()!r}"
    plt.close(fig)


def test_main_view_is_six_panels_in_words_and_full_view_twelve():
    from rlhf_lab.viz import DASHBOARD_PANELS, MAIN_PANELS, dashboard_panels

    assert dashboard_panels("rl") == MAIN_PANELS and dashboard_panels("rl", "full") == DASHBOARD_PANELS
    assert [name for row in MAIN_PANELS for name in row] == ["reward", "accuracy", "kl", "entropy",
                                                             "advantages", "groups"]
    assert dashboard_panels("sft", "full") == SFT_DASHBOARD_PANELS  # SFT and DPO have six in both views
    fig = plot_dashboard(on_policy_run(), [fake_distributions(60, 4, on_policy=True)], ON_POLICY_GRPO)
    assert len(fig.axes) == 6
    raw_names = set(METRIC_COLUMNS) - {"step", "entropy", "accuracy"}
    for ax in fig.axes:
        words = set(ax.get_title().replace("\n", " ").replace(",", " ").split())
        assert not words & raw_names, f"a raw column name in the title {ax.get_title()!r}"
    plt.close(fig)
    with pytest.raises(ValueError, match="view must be one of"):
        LiveDashboard(view="all")


def test_idle_panels_become_one_line_notes():
    from rlhf_lab.viz import idle_panels

    history, dist = on_policy_run(), fake_distributions(60, 4, on_policy=True)
    idle = idle_panels(history, [dist], ON_POLICY_GRPO)
    assert set(idle) == {"clip", "token_ratios", "sequence_ratios", "truncation"}
    full = plot_dashboard(history, [dist], ON_POLICY_GRPO, view="full")
    for ax, name in zip(full.axes, [name for row in DASHBOARD_PANELS_FULL for name in row]):
        if name in idle:
            assert not ax.axison and not ax.lines and not ax.patches, f"{name}: drawn, although it is idle"
            (note_text,) = ax.texts
            assert note_text.get_text().replace("\n", " ") == idle[name]
        else:
            assert ax.axison, f"{name} is hidden although it has data"
    assert footnote(full) == ""  # the full view leaves nothing out
    plt.close(full)
    main = plot_dashboard(history, [dist], ON_POLICY_GRPO)
    line = footnote(main)
    assert "every importance ratio is exactly 1 and nothing is clipped" in line
    assert "no answer hit the length budget" in line and 'view="full"' in line
    plt.close(main)
    # off-policy, with clipping and truncation: nothing is idle, the line says how much at the last step
    busy = fake_history(5)
    assert idle_panels(busy, [fake_distributions(5, 4)], GRPO) == {}
    main = plot_dashboard(busy, [fake_distributions(5, 4)], GRPO)
    line = footnote(main)
    assert f"clipped at the last step: {busy['clip_frac'].iloc[-1]:.1%} of tokens" in line
    plt.close(main)


def footnote(fig: Figure) -> str:
    """The line under the panels."""
    (text,) = [t for t in fig.texts if t.get_gid() == "dashboard-note"]
    return text.get_text()


DASHBOARD_PANELS_FULL = (("reward", "accuracy", "kl", "entropy"), ("clip", "length", "truncation", "time"),
                         ("advantages", "groups", "token_ratios", "sequence_ratios"))


def test_isolated_spikes_are_one_or_two_points_not_a_lasting_rise():
    from rlhf_lab.viz.plots import isolated_spikes

    flat = np.r_[np.full(100, 0.01), 0.0]
    one = flat.copy()
    one[33] = 48.0
    assert np.flatnonzero(isolated_spikes(one)).tolist() == [33]
    two = one.copy()
    two[34] = 30.0
    assert np.flatnonzero(isolated_spikes(two)).tolist() == [33, 34]
    three = two.copy()
    three[35] = 30.0
    assert not isolated_spikes(three).any()  # three steps in a row: a rise the plot must show
    rising = np.r_[np.full(95, 0.01), [1.0, 2.0, 4.0, 8.0]]
    assert not isolated_spikes(rising).any()
    at_end = np.r_[np.full(99, 0.01), 48.0]
    assert not isolated_spikes(at_end).any()  # the last point may be the start of a blow-up
    assert not isolated_spikes(np.r_[np.full(10, 0.01), 48.0, 0.01]).any()  # too few points to judge
    assert not isolated_spikes(np.linspace(0, 1, 200)).any()


def test_kl_panel_keeps_its_scale_through_a_spike_and_labels_it():
    history = on_policy_run(400, spike_at=330)
    fig = plot_dashboard(history, None, ON_POLICY_GRPO)
    ax = fig.axes[2]
    assert ax.get_title().startswith("KL to the reference")
    top = ax.get_ylim()[1]
    kl = history[["kl_k1", "kl_k3"]].to_numpy()
    rest = np.delete(kl[1:], 329, axis=0)  # row 330 holds the spike
    assert np.nanmax(rest) < top < 0.2, f"the y-range ({top}) does not fit the curve without the spike"
    (label,) = [t.get_text() for t in ax.texts]
    assert label == "k3 = 48 at step 330, off the scale"
    (marker,) = [line for line in ax.lines if line.get_marker() == "v"]
    assert marker.get_xdata()[0] == 330
    plt.close(fig)
    # a KL that keeps rising is drawn whole
    history.loc[330, "kl_k3"] = 0.01
    history.loc[390:, "kl_k3"] = np.linspace(1.0, 20.0, 11)
    fig = plot_dashboard(history, None, ON_POLICY_GRPO)
    assert fig.axes[2].get_ylim()[1] >= 20.0 and not fig.axes[2].texts
    plt.close(fig)


def test_title_numbers_say_what_they_are():
    history = fake_history(20)
    history["wall_time"] = 0.25 * history["step"]
    history.loc[1:, "step_time"] = 0.25
    history.loc[11:, "step_time"] = 0.15  # faster lately
    fig = plot_dashboard(history, None, GRPO)
    title = fig.get_suptitle()
    assert "5.0 s of training, 0.25 s/step on average (last 10 steps: 0.15 s/step)" in title
    assert "held-out accuracy 50.0% at step 20" in title
    plt.close(fig)


def test_dashboard_guide_names_every_main_panel():
    import IPython.display

    from rlhf_lab.viz import DASHBOARD_GUIDE, dashboard_guide

    guide = dashboard_guide()
    assert isinstance(guide, IPython.display.Markdown) and guide.data == DASHBOARD_GUIDE
    fig = plot_dashboard(on_policy_run(), [fake_distributions(60, 4, on_policy=True)], ON_POLICY_GRPO)
    for ax in fig.axes:  # each panel's name (the first words of its title) has a row in the guide
        name = ax.get_title().split("\n")[0].split(" (")[0].split(" at step")[0].split(",")[0]
        assert f"**{name}**" in DASHBOARD_GUIDE, f"the guide has no row for the panel {name!r}"
    plt.close(fig)
    for words in ("healthy", "collapse", "spike", 'view="full"'):
        assert words in DASHBOARD_GUIDE.lower() or words in DASHBOARD_GUIDE


# ----------------------------------------------------------------------------------------------
# colours: two runs on one plot never share one


# Notebook 13's Q22 sweep (cell 74): no label names an algorithm, so the old fallback cycled through four
# colours and "reference (...)" and "lr=2e-3" were both black.
Q22_LABELS = ["reference (lam=0.95, lr=2e-4)", "lam=0.0", "lam=1.0", "lr=2e-5", "lr=2e-3"]


@pytest.mark.parametrize("labels", [
    Q22_LABELS,
    ["reference", "no advantage normalisation", "detached ratio", "no KL", "low-precision log-probs",
     "wrong sign", "no grad clip"],
    ["grpo", "grpo 2x2", "gspo", "ppo", "rloo", "reinforce"],
    ["grpo eps=0.1", "grpo eps=0.2", "grpo eps=0.3", "my run", "another run", "ppo"],
    [f"run {i}" for i in range(40)],
], ids=["drill-Q22", "drill-Q26", "showdown", "mixed", "forty"])
def test_runs_on_one_plot_never_share_a_colour(labels):
    fig = plot_history({label: fake_history(3) for label in labels}, metrics=["reward_mean"])
    colours = [to_hex(line.get_color()) for line in fig.axes[0].lines]
    assert len(colours) == len(labels)
    shared = {c: [label for label, c2 in zip(labels, colours) if c2 == c]
              for c in colours if colours.count(c) > 1}
    assert not shared, f"runs share a colour: {shared}"
    plt.close(fig)


def test_run_colors_keeps_algorithm_colours_and_explicit_choices():
    from rlhf_lab.viz import run_colors

    colours = run_colors(["gspo", "grpo beta=0.04", "grpo beta=0", "baseline"])
    assert colours[:2] == [ALGO_COLORS["gspo"], ALGO_COLORS["grpo"]]
    assert colours[2] not in ALGO_COLORS.values() and len(set(colours)) == 4
    assert colours[3] not in ALGO_COLORS.values()  # a run that names no algorithm never looks like one
    # a mapping fixes some runs; the rest get colours other than those
    mapped = run_colors(["a", "b", "c"], {"a": "#000000"})
    assert mapped[0] == "#000000" and len(set(mapped)) == 3
    # a list is the caller's choice, cycled (the seeds of one setting may share a colour on purpose)
    assert run_colors(["a", "b", "c"], ["#111111", "#222222"]) == ["#111111", "#222222", "#111111"]


def test_plot_history_titles_are_words_for_every_history_column():
    from rlhf_lab.preferences.dpo import HISTORY_COLUMNS as DPO_COLUMNS
    from rlhf_lab.preferences.reward_model import HISTORY_COLUMNS as REWARD_MODEL_COLUMNS
    from rlhf_lab.sft import HISTORY_COLUMNS as SFT_COLUMNS
    from rlhf_lab.viz import metric_title

    columns = set(METRIC_COLUMNS) | set(SFT_COLUMNS) | set(DPO_COLUMNS) | set(REWARD_MODEL_COLUMNS)
    titles = {name: metric_title(name) for name in columns - {"step"}}
    raw = {name: title for name, title in titles.items() if "_" in title or "/" in title}
    assert not raw, f"titles that are column names: {raw}"
    fig = plot_history(fake_history(4), metrics=["clip_frac", "kl_k3", "ratio_max"])
    assert [ax.get_title() for ax in fig.axes] == ["Clipped tokens", "KL to the reference (k3)",
                                                   "Largest token importance ratio"]
    plt.close(fig)
