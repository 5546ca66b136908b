"""Layout of what learners read in the browser, checked headless (tests/browser checks it in Chromium):
explorer controls show their whole names on a track a learner can aim at, the sampling plot's tick
labels do not overlap, and the dashboard's "all N ratios are exactly 1" note is not covered by its bar."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from rlhf_lab.model import LlamaModel  # noqa: E402
from rlhf_lab.sft import lab_model_config  # noqa: E402
from rlhf_lab.tokenizer import default_tokenizer  # noqa: E402
from rlhf_lab.viz import plot_next_token_distribution, sampling_explorer  # noqa: E402
from rlhf_lab.viz.plots import draw_ratios  # noqa: E402
from rlhf_lab.viz.widgets import SLIDER_WIDTH  # noqa: E402


@pytest.fixture
def tiny_model():
    torch.manual_seed(0)
    tokenizer = default_tokenizer()
    model = LlamaModel(lab_model_config(tokenizer, hidden_size=32, num_hidden_layers=1, intermediate_size=64))
    return model, tokenizer


def test_explorer_controls_show_whole_names_on_a_wide_track(tiny_model, monkeypatch):
    pytest.importorskip("ipywidgets")
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
