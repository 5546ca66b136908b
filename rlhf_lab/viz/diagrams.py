"""Data-flow pictures: one training step of PPO, GRPO and DPO, and the three stages of RLHF.

    from rlhf_lab.viz import ppo_step_diagram, rlhf_stages_diagram, show, step_diagram
    show(ppo_step_diagram())      # which models exist, what each computes, where the gradient flows
    step_diagram("grpo")          # the same by name: "ppo", "grpo" or "dpo"
    rlhf_stages_diagram()         # pretrained -> SFT -> reward model -> RL, and DPO's shortcut

How to read them. A box is a model or a computation. A model that the step trains has its algorithm's
colour (style.ALGO_COLORS) and a "trained" tag; a model that stays fixed is grey, hatched, and tagged
"frozen". Thin grey arrows carry numbers that need no gradient (samples, log-probabilities, rewards).
Thick coloured arrows are gradients: from a loss back to the model it updates.

The figures are drawn with matplotlib in inches (one axes over the whole figure, 1 unit = 1 inch), at
notebook width (12 inches), with type of at least MIN_FONT_SIZE points. Every box, tag and arrow carries
a gid ("box:policy", "tag:reference", "gradient:policy loss->policy") so tests can find it.
"""

from __future__ import annotations

from dataclasses import dataclass

from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

from ..util.validation import check_choice
from .style import ALGO_COLORS, MIN_FONT_SIZE, SFT_COLOR, new_figure

WIDTH = 12.0  # inches: a notebook-wide figure
BOX_SIZE = 10.5  # points: text in boxes
FROZEN_FILL, FROZEN_EDGE = "#ececec", "#8a8a8a"
STEP_EDGE = "#333333"
DATA_ARROW = "#555555"
REWARD_MODEL_COLOR = "#555555"  # the reward model stage of the RLHF picture: no algorithm owns it
STEP_ALGOS = ("ppo", "grpo", "dpo")


@dataclass(frozen=True)
class Box:
    """A box drawn on a diagram: centre (x, y) and size (w, h), in inches."""

    name: str
    x: float
    y: float
    w: float
    h: float

    @property
    def left(self) -> tuple[float, float]:
        return self.x - self.w / 2, self.y

    @property
    def right(self) -> tuple[float, float]:
        return self.x + self.w / 2, self.y

    @property
    def top(self) -> tuple[float, float]:
        return self.x, self.y + self.h / 2

    @property
    def bottom(self) -> tuple[float, float]:
        return self.x, self.y - self.h / 2


class Diagram:
    """A figure with one axes spanning it, in inch coordinates, and the drawing primitives."""

    def __init__(self, height: float, title: str) -> None:
        self.figure = new_figure((WIDTH, height), layout=None)
        self.ax = self.figure.add_axes((0, 0, 1, 1))
        self.ax.set_xlim(0, WIDTH)
        self.ax.set_ylim(0, height)
        self.ax.set_axis_off()
        self.ax.text(
            0.25, height - 0.2, title, ha="left", va="top", fontsize=13, fontweight="bold", gid="title"
        )

    def box(
        self,
        name: str,
        x: float,
        y: float,
        w: float,
        h: float,
        text: str,
        kind: str = "step",
        color: str = STEP_EDGE,
    ) -> Box:
        """kind: "trained" (a model this step updates, in `color`), "frozen" (a fixed model, grey and
        hatched), "step" (a computation), "loss" (a loss, edged in `color`) or "data" (inputs, no edge)."""
        styles = {
            "trained": {"facecolor": _tint(color, 0.85), "edgecolor": color, "linewidth": 2.2},
            "frozen": {"facecolor": FROZEN_FILL, "edgecolor": FROZEN_EDGE, "linewidth": 1.6, "hatch": "//"},
            "step": {"facecolor": "white", "edgecolor": STEP_EDGE, "linewidth": 1.0},
            "loss": {
                "facecolor": _tint(color, 0.93),
                "edgecolor": color,
                "linewidth": 1.8,
                "linestyle": "--",
            },
            "data": {"facecolor": "#fbf6e4", "edgecolor": "#c8b88a", "linewidth": 1.0},
            "absent": {"facecolor": "white", "edgecolor": "#999999", "linewidth": 1.2, "linestyle": ":"},
        }
        patch = FancyBboxPatch(
            (x - w / 2, y - h / 2),
            w,
            h,
            boxstyle="round,pad=0,rounding_size=0.12",
            gid=f"box:{name}",
            **styles[kind],
        )
        self.ax.add_patch(patch)
        weight = "bold" if kind in ("trained", "frozen") else "normal"
        self.ax.text(
            x,
            y,
            text,
            ha="center",
            va="center",
            fontsize=BOX_SIZE,
            fontweight=weight,
            color="#777777" if kind == "absent" else "black",
            gid=f"text:{name}",
            bbox={"facecolor": "none", "edgecolor": "none", "pad": 0}
            if kind != "frozen"
            else {"facecolor": FROZEN_FILL, "edgecolor": "none", "pad": 1.5},
        )
        if kind in ("trained", "frozen"):
            tag_color = color if kind == "trained" else "#555555"
            self.ax.text(
                x + w / 2 - 0.06,
                y + h / 2,
                " trained " if kind == "trained" else " frozen ",
                ha="right",
                va="center",
                fontsize=MIN_FONT_SIZE,
                color="white",
                fontweight="bold",
                gid=f"tag:{name}",
                bbox={"facecolor": tag_color, "edgecolor": "none", "pad": 1.2, "boxstyle": "round,pad=0.15"},
            )
        return Box(name, x, y, w, h)

    def arrow(
        self,
        start: tuple[float, float],
        end: tuple[float, float],
        kind: str = "data",
        color: str = DATA_ARROW,
        rad: float = 0.0,
        label: str | None = None,
        label_at: tuple[float, float] | None = None,
        name: str = "",
    ) -> FancyArrowPatch:
        """kind "data" (thin grey: values that carry no gradient) or "gradient" (thick, in `color`)."""
        if kind == "gradient":
            style = {
                "arrowstyle": "-|>,head_length=0.6,head_width=0.35",
                "linewidth": 3.2,
                "color": color,
                "mutation_scale": 14,
            }
        else:
            style = {
                "arrowstyle": "-|>,head_length=0.5,head_width=0.25",
                "linewidth": 1.2,
                "color": color,
                "mutation_scale": 12,
            }
        patch = FancyArrowPatch(
            start, end, connectionstyle=f"arc3,rad={rad}", shrinkA=2, shrinkB=2, gid=f"{kind}:{name}", **style
        )
        self.ax.add_patch(patch)
        if label:
            x, y = label_at if label_at is not None else ((start[0] + end[0]) / 2, (start[1] + end[1]) / 2)
            self.ax.text(
                x,
                y,
                label,
                ha="center",
                va="center",
                fontsize=MIN_FONT_SIZE + 0.5,
                color=color if kind == "gradient" else "#333333",
                fontweight="bold" if kind == "gradient" else "normal",
                gid=f"label:{name}",
                bbox={"facecolor": "white", "edgecolor": "none", "pad": 1.0, "alpha": 0.9},
            )
        return patch

    def text(
        self,
        x: float,
        y: float,
        text: str,
        size: float = MIN_FONT_SIZE + 1,
        color: str = "#333333",
        ha: str = "center",
        gid: str = "note",
        **kwargs,
    ) -> None:
        self.ax.text(x, y, text, ha=ha, va="center", fontsize=size, color=color, gid=gid, **kwargs)

    def legend(self, color: str, y: float = 0.22) -> None:
        """The key along the bottom: thin and thick arrows, trained and frozen models."""
        self.arrow((0.3, y), (0.9, y), name="legend data")
        self.text(1.0, y, "numbers, no gradient", ha="left", gid="legend")
        self.arrow((3.1, y), (3.7, y), kind="gradient", color=color, name="legend gradient")
        self.text(3.8, y, "gradient of the loss", ha="left", gid="legend")
        self.text(
            6.0,
            y,
            " trained ",
            ha="left",
            color="white",
            size=MIN_FONT_SIZE,
            fontweight="bold",
            gid="legend",
            bbox={"facecolor": color, "edgecolor": "none", "boxstyle": "round,pad=0.15"},
        )
        self.text(6.75, y, "updated by this step", ha="left", gid="legend")
        self.text(
            8.65,
            y,
            " frozen ",
            ha="left",
            color="white",
            size=MIN_FONT_SIZE,
            fontweight="bold",
            gid="legend",
            bbox={"facecolor": "#555555", "edgecolor": "none", "boxstyle": "round,pad=0.15"},
        )
        self.text(9.4, y, "fixed: computes, never updated", ha="left", gid="legend")


def _tint(color: str, amount: float) -> str:
    """`color` mixed with white (amount 1 = white)."""
    from matplotlib.colors import to_hex, to_rgb

    return to_hex(tuple(c + (1 - c) * amount for c in to_rgb(color)))


# ----------------------------------------------------------------------------------------------
# one step of each algorithm


# The step diagrams' columns (inches from the left): models, what each computes, the advantage, the loss.
MODELS_X, OUT_X, MID_X, LOSS_X = 1.55, 4.75, 7.85, 10.6


def _policy(d: Diagram, y: float, color: str) -> Box:
    return d.box("policy", MODELS_X, y, 2.5, 0.85, "Policy $\\pi_\\theta$\n(the LLM)", "trained", color)


def _reference(d: Diagram, y: float, what: str = "copy of the SFT model") -> Box:
    return d.box("reference", MODELS_X, y, 2.5, 0.85, f"Reference $\\pi_{{ref}}$\n({what})", "frozen")


def _prompts(d: Diagram, policy: Box) -> None:
    """The step's input, above the policy that samples from it."""
    d.text(MODELS_X, policy.y + 0.9, "prompts x", gid="label:prompts", fontweight="bold")
    d.arrow((MODELS_X, policy.y + 0.75), policy.top, name="prompts->policy")


def _gradient_to_policy(d: Diagram, loss: Box, policy: Box, color: str, label_at: tuple[float, float],
                        label: str = "gradient", dx: float = 0.25, rad: float = 0.12) -> None:
    """The thick arrow from a loss back to the policy it trains."""
    d.arrow(loss.top, (policy.x + dx, policy.y + policy.h / 2), kind="gradient", color=color, rad=rad,
            name=f"{loss.name}->policy", label=label, label_at=label_at)


def ppo_step_diagram() -> Figure:
    """One PPO step for RLHF (Ouyang et al. 2022; TRL's PPOTrainer): four models, two of them trained.

    The policy samples answers; the frozen reference and reward model and the trained critic score them;
    the KL penalty joins the reward per token; GAE turns rewards and values into advantages and returns;
    the clipped policy loss trains the policy and the value loss trains the critic.
    """
    color = ALGO_COLORS["ppo"]
    d = Diagram(6.9, "One PPO step: four models, two of them trained")
    models_x, out_x, mid_x, loss_x = MODELS_X, OUT_X, MID_X, LOSS_X
    policy, reference = _policy(d, 5.2, color), _reference(d, 3.95)
    reward = d.box(
        "reward model", models_x, 2.7, 2.5, 0.85, "Reward model $r_\\phi$\n(scores a whole answer)", "frozen"
    )
    critic = d.box("critic", models_x, 1.45, 2.5, 0.85, "Critic $V_\\psi$\n(value model)", "trained", color)
    _prompts(d, policy)

    sample = d.box(
        "sample",
        out_x,
        5.2,
        2.9,
        0.85,
        "1. sample answers $y \\sim \\pi_\\theta(\\cdot|x)$\nkeep $\\log \\pi_{old}(y_t)$",
        "step",
    )
    ref_lp = d.box("ref logprobs", out_x, 3.95, 2.9, 0.7, "$\\log \\pi_{ref}(y_t)$, every token", "step")
    score = d.box("score", out_x, 2.7, 2.9, 0.7, "score $r(x, y)$, one per answer", "step")
    values = d.box("values", out_x, 1.45, 2.9, 0.7, "values $V(s_t)$, every token", "step")
    for model, out in ((policy, sample), (reference, ref_lp), (reward, score), (critic, values)):
        d.arrow(model.right, out.left, name=f"{model.name}->{out.name}")
    d.text((models_x + out_x) / 2 + 0.05, 4.6, "every model reads (x, y)", size=MIN_FONT_SIZE, gid="note")

    per_token = d.box(
        "per-token reward",
        mid_x,
        3.95,
        2.7,
        1.0,
        "2. reward per token\n$-\\beta\\,(\\log\\pi_{old} - \\log\\pi_{ref})$\n+ $r(x,y)$ at the last token",
    )
    gae = d.box("gae", mid_x, 2.1, 2.7, 0.9, "3. GAE($\\gamma, \\lambda$)\nadvantages $A_t$, returns $R_t$")
    d.arrow(sample.right, per_token.top, rad=-0.25, name="sample->per-token reward")
    d.arrow(ref_lp.right, per_token.left, name="ref logprobs->per-token reward")
    d.arrow(score.right, per_token.bottom, rad=0.3, name="score->per-token reward")
    d.arrow(per_token.bottom, gae.top, name="per-token reward->gae")
    d.arrow(values.right, gae.left, name="values->gae")

    policy_loss = d.box(
        "policy loss",
        loss_x,
        4.4,
        2.4,
        1.1,
        "4. policy loss\n$-\\min(\\rho_t A_t,\\ \\mathrm{clip}(\\rho_t) A_t)$\n"
        "$\\rho_t = \\pi_\\theta / \\pi_{old}$",
        "loss",
        color,
    )
    value_loss = d.box(
        "value loss", loss_x, 1.45, 2.4, 0.9, "4. value loss\n$(V_\\psi(s_t) - R_t)^2$", "loss", color
    )
    d.arrow(gae.right, policy_loss.bottom, rad=0.2, name="gae->policy loss", label="$A_t$")
    d.arrow(gae.right, value_loss.top, rad=-0.2, name="gae->value loss", label="$R_t$")
    _gradient_to_policy(d, policy_loss, policy, color, (6.2, 6.2), "gradient (several epochs of minibatches)")
    d.arrow(
        value_loss.bottom,
        critic.bottom,
        kind="gradient",
        color=color,
        rad=-0.1,
        name="value loss->critic",
        label="gradient",
        label_at=(6.2, 0.62),
    )
    d.legend(color, y=0.2)
    return d.figure


def grpo_step_diagram() -> Figure:
    """One GRPO step (Shao et al. 2024, DeepSeekMath): no critic; the group of G answers is the baseline.

    The policy samples G answers per prompt; a reward (a rule or a frozen model) scores each; each
    answer's advantage is its reward against its group's mean and std, the same for all its tokens;
    the clipped loss plus beta times the k3 KL to the frozen reference trains the policy.
    """
    color = ALGO_COLORS["grpo"]
    d = Diagram(5.9, "One GRPO step: no critic, the group of G answers is the baseline")
    models_x, out_x, mid_x, loss_x = MODELS_X, OUT_X, MID_X, LOSS_X
    policy, reference = _policy(d, 4.2, color), _reference(d, 2.95)
    reward = d.box("reward", models_x, 1.7, 2.5, 0.85, "Reward: a rule\n(1 if right) or a model", "frozen")
    _prompts(d, policy)

    sample = d.box(
        "sample",
        out_x,
        4.2,
        2.9,
        0.85,
        "1. sample G answers per prompt\n$y_1 \\ldots y_G$, keep $\\log \\pi_{old}$",
        "step",
    )
    ref_lp = d.box("ref logprobs", out_x, 2.95, 2.9, 0.7, "$\\log \\pi_{ref}(y_{i,t})$, every token", "step")
    rewards = d.box("rewards", out_x, 1.7, 2.9, 0.7, "rewards $r_1 \\ldots r_G$", "step")
    for model, out in ((policy, sample), (reference, ref_lp), (reward, rewards)):
        d.arrow(model.right, out.left, name=f"{model.name}->{out.name}")

    group = d.box(
        "group baseline",
        mid_x,
        1.7,
        2.7,
        1.0,
        "2. group baseline\n"
        "$A_i = (r_i - \\mathrm{mean}(r)) / \\mathrm{std}(r)$\nsame $A_i$ for every token of $y_i$",
    )
    d.arrow(rewards.right, group.left, name="rewards->group baseline")
    d.box("no critic", mid_x, 3.75, 2.7, 0.6, "no critic, no value loss", "absent")
    loss = d.box(
        "loss",
        loss_x,
        2.95,
        2.4,
        1.35,
        "3. loss per token\n$-\\min(\\rho A_i,\\ \\mathrm{clip}(\\rho) A_i)$\n"
        "$+\\ \\beta\\,k_3(\\pi_\\theta \\| \\pi_{ref})$\n$\\rho = \\pi_\\theta / \\pi_{old}$",
        "loss",
        color,
    )
    d.arrow(group.right, loss.bottom, rad=0.25, name="group baseline->loss", label="$A_i$")
    d.arrow(ref_lp.right, loss.left, name="ref logprobs->loss", label="KL in the loss", label_at=(7.85, 2.7))
    _gradient_to_policy(d, loss, policy, color, (6.2, 5.2))
    d.legend(color, y=0.2)
    return d.figure


def dpo_step_diagram() -> Figure:
    """One DPO step (Rafailov et al. 2023): preference pairs from a dataset, two models, one trained.

    Policy and frozen reference score the chosen and the rejected answer; the implicit rewards
    beta * log(pi_theta / pi_ref) of the two give a margin; -log sigmoid(margin) trains the policy.
    No sampling, no reward model, no critic.
    """
    color = ALGO_COLORS["dpo"]
    d = Diagram(5.0, "One DPO step: no sampling, no reward model, no critic")
    models_x, out_x, mid_x, loss_x = MODELS_X, OUT_X, MID_X, LOSS_X
    pairs = d.box(
        "pairs", models_x, 3.95, 2.7, 0.75, "preference pairs $(x, y_w, y_l)$\nfrom a dataset", "data"
    )
    policy, reference = _policy(d, 2.7, color), _reference(d, 1.45, "the SFT model")
    d.arrow(pairs.bottom, policy.top, name="pairs->policy")
    d.text(models_x + 1.45, 2.08, "both read each pair", size=MIN_FONT_SIZE, ha="left", gid="note")
    pol_lp = d.box(
        "policy logprobs",
        out_x,
        2.7,
        2.9,
        0.75,
        "$\\log \\pi_\\theta(y_w|x)$, $\\log \\pi_\\theta(y_l|x)$",
        "step",
    )
    ref_lp = d.box(
        "ref logprobs", out_x, 1.45, 2.9, 0.75, "$\\log \\pi_{ref}(y_w|x)$, $\\log \\pi_{ref}(y_l|x)$", "step"
    )
    d.arrow(policy.right, pol_lp.left, name="policy->policy logprobs")
    d.arrow(reference.right, ref_lp.left, name="reference->ref logprobs")
    implicit = d.box(
        "implicit rewards",
        mid_x,
        2.1,
        2.7,
        1.15,
        "1. implicit rewards\n"
        "$\\beta \\log \\pi_\\theta / \\pi_{ref}$ of $y_w$ and $y_l$\nmargin: chosen - rejected",
    )
    d.arrow(pol_lp.right, implicit.left, rad=-0.15, name="policy logprobs->implicit rewards")
    d.arrow(ref_lp.right, implicit.left, rad=0.15, name="ref logprobs->implicit rewards")
    loss = d.box("loss", loss_x, 2.1, 2.3, 0.9, "2. loss\n$-\\log \\sigma(\\mathrm{margin})$", "loss", color)
    d.arrow(implicit.right, loss.left, name="implicit rewards->loss")
    _gradient_to_policy(d, loss, policy, color, (6.3, 3.95), dx=1.0, rad=0.15)
    d.legend(color, y=0.2)
    return d.figure


STEP_DIAGRAMS = {"ppo": ppo_step_diagram, "grpo": grpo_step_diagram, "dpo": dpo_step_diagram}


def step_diagram(algo: str) -> Figure:
    """The data-flow picture of one training step of `algo` ("ppo", "grpo" or "dpo")."""
    check_choice("algo", algo, STEP_ALGOS)
    return STEP_DIAGRAMS[algo]()


# ----------------------------------------------------------------------------------------------
# the three stages of RLHF


def rlhf_stages_diagram() -> Figure:
    """The RLHF pipeline (Ouyang et al. 2022): a pretrained model, SFT on demonstrations, a reward model
    on preference pairs, RL against the reward model with a KL leash to the SFT model; and DPO
    (Rafailov et al. 2023), which goes from the SFT model and the same pairs to the tuned policy
    without the reward model and without sampling."""
    rl_color, dpo_color = ALGO_COLORS["ppo"], ALGO_COLORS["dpo"]
    d = Diagram(5.6, "The three stages of RLHF, and DPO's shortcut")
    track = 2.75  # the main line: pretrained -> SFT -> tuned policy
    pretrained = d.box("pretrained", 1.2, track, 1.9, 0.9, "Pretrained\nmodel", "step")
    sft = d.box("sft model", 4.5, track, 1.9, 0.9, "SFT model", "step")
    policy = d.box("policy", 10.65, track, 2.1, 0.9, "Tuned policy", "step")
    demos = d.box("demonstrations", 2.85, 4.35, 2.8, 0.7, "demonstrations\n(prompt, a good answer)", "data")
    pairs = d.box("pairs", 5.7, 4.35, 2.6, 0.7, "preference pairs\n(prompt, $y_w$ better than $y_l$)", "data")
    reward = d.box("reward model", 9.35, 4.35, 2.3, 0.7, "Reward model $r_\\phi$", "step")

    d.arrow(
        pretrained.right,
        sft.left,
        kind="gradient",
        color=SFT_COLOR,
        name="stage 1",
        label="1. SFT",
        label_at=(2.85, 2.45),
    )
    d.text(2.85, 2.0, "cross-entropy on\nthe good answers", size=MIN_FONT_SIZE)
    d.arrow(demos.bottom, (2.85, track + 0.08), name="demonstrations->stage 1")
    d.arrow((sft.x - 0.4, track + 0.45), (pairs.x - 0.9, pairs.y - 0.35), rad=-0.2, name="sft->pairs")
    d.text(4.95, 3.55, "people compare its answers", size=MIN_FONT_SIZE, ha="left")
    d.arrow(
        pairs.right,
        reward.left,
        kind="gradient",
        color=REWARD_MODEL_COLOR,
        name="stage 2",
        label="2. reward model",
        label_at=(7.53, 4.7),
    )
    d.text(7.53, 3.95, "Bradley-Terry loss:\nscore $y_w$ above $y_l$", size=MIN_FONT_SIZE)
    d.arrow(
        sft.right,
        policy.left,
        kind="gradient",
        color=rl_color,
        name="stage 3",
        label="3. RL (PPO, GRPO)",
        label_at=(7.4, 2.45),
    )
    d.text(7.4, 1.98, "maximise $r_\\phi - \\beta\\,$KL to the SFT model", size=MIN_FONT_SIZE)
    d.arrow(
        reward.bottom,
        (reward.x, track + 0.06),
        name="reward model->stage 3",
        label="reward",
        label_at=(reward.x, 3.3),
    )
    d.arrow(
        sft.bottom,
        policy.bottom,
        kind="gradient",
        color=dpo_color,
        rad=0.28,
        name="dpo",
        label="DPO",
        label_at=(7.6, 1.17),
    )
    d.text(
        7.6,
        0.72,
        "one classification loss on the same preference pairs: no reward model, no RL sampling",
        size=MIN_FONT_SIZE,
        color=dpo_color,
        gid="note",
    )
    d.text(
        0.25,
        0.22,
        "Thick arrows train a model; the colour says which stage: black SFT, grey reward model, "
        "blue RL, wine DPO. Thin arrows carry data.",
        ha="left",
        gid="legend",
    )
    return d.figure
