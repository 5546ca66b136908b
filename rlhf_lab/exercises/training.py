"""Your code trains the model: plug a learner's function into a short real RL run.

Five RL exercises have a hook in the package's algorithms (rlhf_lab/rl/algorithm.py and the method
files), so the learner's function replaces the package's through a subclass, not by patching:

    group_advantages     GRPO.outcome_advantages          (your advantages drive GRPO)
    clipped_policy_loss  GRPO.loss                        (your surrogate is what GRPO minimises)
    gspo_ratio           GSPO.importance_ratio            (your sequence ratio drives GSPO)
    gae                  PPO.estimate_advantages          (your GAE drives PPO)
    whiten               PPO.normalize_advantages         (your whitening drives PPO)

    from rlhf_lab.exercises import training
    runs = training.compare_with_reference("gae", my_gae, dict(steps=30))
    training.plot_comparison(runs)
    runs = training.compare_with_reference("gae", my_gae, dict(steps=30), seeds=(0, 1, 2))  # the spread

One short run per side can mislead: with a few steps and one seed, noise alone can put a wrong
function above the reference. With one seed the comparison says so; with several it prints each
metric's final value as mean +- std over the seeds, and the plot shades the range.

With the reference solution plugged in, the run is the package's run, step for step (tested).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pandas as pd

from ..rl import GRPO, GSPO, PPO, Trainer, make_config
from ..rl.algorithm import Algorithm
from ..util.validation import check_choice, check_number
from .core import resolve_language

# exercise -> the algorithm its function drives
PLUGGABLE: dict[str, str] = {
    "group_advantages": "grpo",
    "clipped_policy_loss": "grpo",
    "gspo_ratio": "gspo",
    "gae": "ppo",
    "whiten": "ppo",
}


def _require(config, field: str, allowed: tuple, exercise: str) -> None:
    """The learner's function computes one fixed variant: the config must ask for that one."""
    value = getattr(config, field)
    if value not in allowed:
        raise ValueError(f"{field} must be one of {allowed} when the {exercise!r} exercise drives training "
                         f"(the exercise computes that variant only), got {value!r}")


class LearnerGRPO(GRPO):
    """GRPO with the learner's group advantages and/or clipped policy loss."""

    def __init__(self, config, group_advantages: Callable | None = None,
                 clipped_policy_loss: Callable | None = None) -> None:
        super().__init__(config)
        if group_advantages is not None:
            _require(config, "scale_rewards", ("group",), "group_advantages")
        if clipped_policy_loss is not None:
            _require(config, "loss_type", ("grpo",), "clipped_policy_loss")
            _require(config, "clip", (True,), "clipped_policy_loss")
            _require(config, "beta", (0, 0.0), "clipped_policy_loss")
        self.learner_advantages = group_advantages
        self.learner_loss = clipped_policy_loss

    def outcome_advantages(self, rollout):
        if self.learner_advantages is None:
            return super().outcome_advantages(rollout)
        return self.learner_advantages(rollout.rewards, self.config.num_generations)  # (N,)

    def loss(self, minibatch, policy):
        loss, info = super().loss(minibatch, policy)  # the package's loss: its report (ratios, clips)
        if self.learner_loss is None:
            return loss, info
        c = self.config
        learner_loss = self.learner_loss(policy.logprobs, self.old_logprobs(minibatch, policy), minibatch.advantages,
                                         minibatch.completion_mask, c.eps_low, c.eps_high)
        info.policy_loss = float(learner_loss.detach())
        return learner_loss, info  # the gradient comes from the learner's loss


class LearnerGSPO(GSPO):
    """GSPO with the learner's sequence-level ratio."""

    def __init__(self, config, gspo_ratio: Callable) -> None:
        super().__init__(config)
        _require(config, "importance_sampling_level", ("sequence",), "gspo_ratio")
        self.learner_ratio = gspo_ratio

    def importance_ratio(self, logprobs, old_logprobs, mask):
        return self.learner_ratio(logprobs, old_logprobs, mask)  # (N, T): s_i on every token


class LearnerPPO(PPO):
    """PPO with the learner's GAE and/or advantage whitening."""

    def __init__(self, config, gae: Callable | None = None, whiten: Callable | None = None) -> None:
        super().__init__(config)
        self.learner_gae, self.learner_whiten = gae, whiten

    def estimate_advantages(self, token_rewards, values, mask):
        if self.learner_gae is None:
            return super().estimate_advantages(token_rewards, values, mask)
        return self.learner_gae(token_rewards, values, mask, self.config.gamma, self.config.lam)

    def normalize_advantages(self, advantages, mask):
        if self.learner_whiten is None:
            return super().normalize_advantages(advantages, mask)
        return self.learner_whiten(advantages, mask)


def learner_algorithm(name: str, function: Callable, config) -> Algorithm:
    """The algorithm of exercise `name` (see PLUGGABLE) with `function` in place of the package's."""
    check_choice("name", name, tuple(PLUGGABLE))
    if PLUGGABLE[name] == "grpo":
        return LearnerGRPO(config, **{name: function})
    if PLUGGABLE[name] == "gspo":
        return LearnerGSPO(config, gspo_ratio=function)
    return LearnerPPO(config, **{name: function})


def train_with(name: str, function: Callable | None, settings: dict | None = None, *, model=None,
               tokenizer=None, reward_fn=None, callbacks=(), **overrides) -> Trainer:
    """Train the algorithm of exercise `name` for `settings`/`overrides` (make_config's arguments, e.g.
    steps=30) with `function` plugged in; function=None trains the package's own algorithm. Returns
    the trained Trainer (its `history` has one row per step). `model` is copied, not trained in place,
    so the same starting model can serve several runs."""
    check_choice("name", name, tuple(PLUGGABLE))
    config = make_config(PLUGGABLE[name], settings, **overrides)
    algorithm = None if function is None else learner_algorithm(name, function, config)
    trainer = Trainer(config, model=None if model is None else copy.deepcopy(model), tokenizer=tokenizer,
                      reward_fn=reward_fn, callbacks=callbacks, algorithm=algorithm)
    trainer.train()
    return trainer


SUMMARY_METRICS = ("reward_mean", "eval_accuracy")

NOTES = {
    "en": {
        "stopped": "Training with your {name} stopped: {error}",
        "one_seed": "One seed, {steps} steps per run: a short single-seed run may not show a mistake (noise "
                    "alone can put a wrong function above the reference, or hide the gap). Pass seeds=(0, 1, "
                    "2) to see the spread over seeds; the checker, exercises.check(\"{name}\", ...), is the "
                    "test.",
        "spread": "Final values over {count} seeds (mean +- std; each seed gives both runs the same start):",
    },
    "zh": {
        "stopped": "用你的 {name} 训练时中止了：{error}",
        "one_seed": "只有一个随机种子、每次 {steps} 步：这么短的单种子训练未必能暴露错误（光是随机波动就可能让错误的"
                    "函数比参考实现还好，或者掩盖差距）。传入 seeds=(0, 1, 2) 可以看到不同种子间的波动；真正的检验是"
                    "判题器 exercises.check(\"{name}\", ...)。",
        "spread": "{count} 个随机种子下的最终值（均值 ± 标准差；同一种子下两次训练的起点相同）：",
    },
}


def compare_with_reference(name: str, function: Callable, settings: dict | None = None,
                           seeds: tuple[int, ...] | None = None, lang: str | None = None,
                           **kwargs) -> pd.DataFrame:
    """Runs from the same start: yours (`function` plugged in) and the package's, once per seed.

    seeds: None = one pair of runs at the config's seed (then a note says that one short run may not
    show a mistake); several seeds = a pair per seed, and the final `reward_mean` / `eval_accuracy`
    printed as mean +- std over seeds. Returns the histories stacked, with columns `run` = "yours" |
    "reference" and `seed`. If your function breaks a run (raises: a wrong shape, say), that is printed
    and only the reference runs are kept."""
    lang = resolve_language(lang)
    notes = NOTES[lang]
    base_seed = kwargs.pop("seed", (settings or {}).get("seed", 0))
    seeds = (base_seed,) if seeds is None else tuple(seeds)
    if not seeds:
        raise ValueError(f"seeds must hold at least one seed, got {seeds!r}")
    for seed in seeds:
        check_number("seed", seed, integer=True)
    runs = []
    for seed in seeds:
        try:
            runs.append(train_with(name, function, settings, seed=seed, **kwargs).history.assign(run="yours",
                                                                                                   seed=seed))
        except Exception as error:  # the learner's code may fail in any way; the reference run still shows
            print(notes["stopped"].format(name=name, error=f"{type(error).__name__}: {error}"))
        reference = train_with(name, None, settings, seed=seed, **kwargs)
        runs.append(reference.history.assign(run="reference", seed=seed))
    runs = pd.concat(runs, ignore_index=True)
    if len(seeds) == 1:
        print(notes["one_seed"].format(steps=int(runs["step"].max()), name=name))
    else:
        print(notes["spread"].format(count=len(seeds)))
        print(spread_over_seeds(runs).to_string())
    return runs


def spread_over_seeds(runs: pd.DataFrame, metrics: tuple[str, ...] = SUMMARY_METRICS) -> pd.DataFrame:
    """Each run's final value of each metric (its last logged value), as "mean +- std" over the seeds,
    one row per run ("yours", "reference")."""
    rows = {}
    for run, group in runs.groupby("run", sort=False):
        row = {}
        for metric in metrics:
            if metric not in group:
                continue
            finals = group[group[metric].notna()].groupby("seed")[metric].last()
            if finals.empty:
                continue
            spread = finals.std(ddof=1) if len(finals) > 1 else float("nan")
            row[metric] = f"{finals.mean():.3f} +- {spread:.3f} (n={len(finals)})"
        rows[run] = row
    return pd.DataFrame.from_dict(rows, orient="index")


def plot_comparison(runs: pd.DataFrame, metrics: tuple[str, ...] = ("reward_mean", "eval_accuracy"),
                    algo: str | None = None):
    """Your run (solid) beside the reference run (dashed), one panel per metric, in the algorithm's
    colour; with several seeds, the mean over seeds and a band from the lowest to the highest seed.
    Returns the matplotlib Figure."""
    from ..viz import ALGO_COLORS, new_figure

    color = ALGO_COLORS.get(algo, "#000000") if algo else "#000000"
    labels = {"reward_mean": "mean reward per completion", "eval_accuracy": "held-out accuracy (fraction)"}
    fig = new_figure(figsize=(5 * len(metrics), 3.2))
    fig.set_dpi(80)
    axes = fig.subplots(1, len(metrics), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        for run, style in (("yours", "-"), ("reference", "--")):
            rows = runs[(runs["run"] == run) & runs[metric].notna()]
            if rows.empty:
                continue
            by_step = rows.groupby("step")[metric]
            mean = by_step.mean()
            ax.plot(mean.index, mean.values, linestyle=style, color=color, label=run,
                    marker="o" if metric == "eval_accuracy" else None, markersize=4)
            if "seed" in rows and rows["seed"].nunique() > 1:
                ax.fill_between(mean.index, by_step.min().values, by_step.max().values, color=color,
                                alpha=0.12 if run == "yours" else 0.06, linewidth=0)
        ax.set(xlabel="training step", ylabel=labels.get(metric, metric),
               title=f"{metric}: yours (solid), reference (dashed)")
        ax.legend(frameon=False)
    return fig
