"""The data-flow pictures (rlhf_lab.viz.diagrams): one PPO, GRPO and DPO step and the RLHF stages draw,
say what they should (which models, which are frozen, where the gradient goes), in the algorithms'
colours, with type of at least 9 pt that stays inside its boxes and the figure."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.patches import FancyArrowPatch  # noqa: E402

from rlhf_lab.viz import (  # noqa: E402
    ALGO_COLORS,
    dpo_step_diagram,
    grpo_step_diagram,
    ppo_step_diagram,
    rlhf_stages_diagram,
    step_diagram,
)
from rlhf_lab.viz.style import figure_png  # noqa: E402

DIAGRAMS = {
    "ppo": ppo_step_diagram,
    "grpo": grpo_step_diagram,
    "dpo": dpo_step_diagram,
    "stages": rlhf_stages_diagram,
}

# What each step picture must show: the models the step trains, those it keeps frozen, the gradient
# arrows (loss -> model), and words a reader looks for.
EXPECTED = {
    "ppo": {
        "trained": {"policy", "critic"},
        "frozen": {"reference", "reward model"},
        "gradients": {"policy loss->policy", "value loss->critic"},
        "words": [
            "Policy",
            "Reference",
            "Reward model",
            "Critic",
            "GAE",
            "advantages",
            "value loss",
            "policy loss",
            "reward per token",
        ],
    },
    "grpo": {
        "trained": {"policy"},
        "frozen": {"reference", "reward"},
        "gradients": {"loss->policy"},
        "words": ["Policy", "Reference", "G answers", "group baseline", "no critic", "KL in the loss"],
    },
    "dpo": {
        "trained": {"policy"},
        "frozen": {"reference"},
        "gradients": {"loss->policy"},
        "words": ["preference pairs", "Policy", "Reference", "implicit rewards", "margin", "no sampling"],
    },
}


def texts(fig):
    return [t for ax in fig.axes for t in ax.texts]


def by_gid(fig, prefix: str) -> dict:
    return {
        artist.get_gid().split(":", 1)[1]: artist
        for ax in fig.axes
        for artist in [*ax.texts, *ax.patches]
        if (artist.get_gid() or "").startswith(prefix)
    }


@pytest.mark.parametrize("algo", ["ppo", "grpo", "dpo"])
def test_step_diagram_shows_models_frozen_parts_and_gradient_paths(algo):
    fig = step_diagram(algo)
    assert figure_png(fig)[:4] == b"\x89PNG"
    expected = EXPECTED[algo]
    tags = by_gid(fig, "tag:")
    assert {name for name, tag in tags.items() if tag.get_text().strip() == "trained"} == expected["trained"]
    assert {name for name, tag in tags.items() if tag.get_text().strip() == "frozen"} == expected["frozen"]
    gradients = {
        name: arrow for name, arrow in by_gid(fig, "gradient:").items() if not name.startswith("legend")
    }
    assert set(gradients) == expected["gradients"]
    for name, arrow in gradients.items():
        assert isinstance(arrow, FancyArrowPatch)
        assert to_hex(arrow.get_edgecolor()) == ALGO_COLORS[algo], f"{name} is not in {algo}'s colour"
        assert arrow.get_linewidth() >= 2 * max(a.get_linewidth() for a in by_gid(fig, "data:").values())
    # trained models are edged in the algorithm's colour
    boxes = by_gid(fig, "box:")
    for name in expected["trained"]:
        assert to_hex(boxes[name].get_edgecolor()) == ALGO_COLORS[algo]
    words = " ".join(t.get_text().replace("\n", " ") for t in texts(fig))
    missing = [word for word in expected["words"] if word not in words]
    assert not missing, f"{algo}: the picture does not say {missing}"


def test_step_diagram_by_name_and_the_named_functions_agree():
    for algo in ("ppo", "grpo", "dpo"):
        assert [t.get_text() for t in texts(step_diagram(algo))] == [
            t.get_text() for t in texts(DIAGRAMS[algo]())
        ]
    with pytest.raises(ValueError, match="algo must be one of"):
        step_diagram("dqn")


def test_rlhf_stages_diagram_has_the_three_stages_and_dpo():
    fig = rlhf_stages_diagram()
    words = " ".join(t.get_text().replace("\n", " ") for t in texts(fig))
    for word in (
        "Pretrained",
        "SFT model",
        "1. SFT",
        "demonstrations",
        "preference pairs",
        "2. reward model",
        "Reward model",
        "3. RL",
        "KL to the SFT model",
        "DPO",
        "no reward model",
        "Tuned policy",
    ):
        assert word in words, f"the stages picture does not say {word!r}"
    gradients = by_gid(fig, "gradient:")
    assert set(gradients) == {"stage 1", "stage 2", "stage 3", "dpo"}
    assert to_hex(gradients["dpo"].get_edgecolor()) == ALGO_COLORS["dpo"]
    assert to_hex(gradients["stage 3"].get_edgecolor()) == ALGO_COLORS["ppo"]


@pytest.mark.parametrize("name", list(DIAGRAMS))
def test_diagram_type_is_readable_and_inside(name):
    fig = DIAGRAMS[name]()
    assert fig.get_figwidth() == 12.0  # notebook width
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    page = fig.bbox
    for text in texts(fig):
        assert text.get_fontsize() >= 9, f"{text.get_text()!r} is {text.get_fontsize()} pt"
        box = text.get_window_extent(renderer)
        assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1, (
            f"{text.get_text()!r} runs off the figure"
        )
    boxes = by_gid(fig, "box:")
    for label_name, label in by_gid(fig, "text:").items():
        inner, outer = label.get_window_extent(renderer), boxes[label_name].get_window_extent(renderer)
        assert (
            outer.x0 <= inner.x0 and inner.x1 <= outer.x1 and outer.y0 <= inner.y0 and inner.y1 <= outer.y1
        ), f"the text of box {label_name!r} does not fit in it"
