"""GSPO's MoE argument, measured: GRPO, GRPO + routing replay and GSPO on a mixture-of-experts policy.

GSPO (Zheng et al. 2025, arXiv 2507.18071, section 5) reports that for Qwen3-30B-A3B-Base about 10%
of the experts activated for the same rollout change after each gradient update, that GRPO's token
ratios then fluctuate and it needed routing replay to converge, and that GSPO does not. The tools:

    METHODS                                     the three arms: name -> config settings
    cpu_seconds_per_step(configs, steps)        CPU time (time.process_time) of a step of each config
    moe_routing_experiment(methods, seeds, cpu_budget, settings)
                                                every arm x seed from the same checkpoint, each arm's step
                                                budget set from its measured CPU time per step
    stability_table(result)                     per arm: accuracy (mean and its standard error over seeds),
                                                collapses, ratio and KL spikes, routing change
    short_run_sweep(grid, settings, steps)      routing change and ratio spread of short RL runs against
                                                settings such as the learning rate or the minibatch count
    routing_change_sweep(models, rollout, lrs)  routing change after one fresh optimiser step, for models
                                                of other shapes (number of experts, top-k)

CPU time, not wall time: on a shared machine the wall clock measures the neighbours; process time
counts only this process's work (all its threads), so equal-CPU budgets stay comparable under load.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import torch

from ..rl import Trainer, make_config
from ..rl.routing import completion_experts, routed_experts, routing_change
from ..train.callbacks import NonFiniteLossError
from ..train.evaluate import standard_error
from ..util.validation import check_number

# The three arms. GRPO keeps the GSPO paper's GRPO clip (0.2 / 0.27); GSPO its own (3e-4 / 4e-4); all
# split each rollout into the paper's 4 minibatches (`settings` in moe_routing_experiment), so every
# minibatch after the first is off-policy and the ratio matters.
METHODS: dict[str, dict] = {
    "GRPO": {"algo": "grpo", "epsilon": 0.2, "epsilon_high": 0.27},
    "GRPO + replay": {"algo": "grpo", "epsilon": 0.2, "epsilon_high": 0.27, "routing_replay": True},
    "GSPO": {"algo": "gspo"},
}
METHOD_STYLES = {"GRPO": "-", "GRPO + replay": "--", "GSPO": "-"}  # replay: GRPO's colour, dashed


def method_config(method: str, settings: dict | None = None, **overrides):
    """The RL config of one arm of METHODS, with shared `settings` and `overrides` (validated)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {tuple(METHODS)}, got {method!r}")
    values = {**METHODS[method], **(settings or {}), **overrides}
    return make_config(values.pop("algo"), values)


def cpu_seconds_per_step(configs: dict, steps: int = 3) -> dict:
    """Median CPU seconds (time.process_time: this process, all its threads) of one training step of
    each config ({name: config}), no evaluation. After one unmeasured step each (first-call
    allocations), the configs take turns, one step each per round, so that a change in the machine's
    load during the calibration affects them alike. Returns {name: seconds}."""
    check_number("steps", steps, low=1, integer=True)
    trainers = {name: Trainer(config.replace(eval_every=0)) for name, config in configs.items()}
    for trainer in trainers.values():
        trainer.train_step()
    times: dict = {name: [] for name in configs}
    for _ in range(steps):
        for name, trainer in trainers.items():
            start = time.process_time()
            trainer.train_step()
            times[name].append(time.process_time() - start)
    return {name: float(pd.Series(values).median()) for name, values in times.items()}


@dataclass
class MoEExperiment:
    """What `moe_routing_experiment` measured."""

    history: pd.DataFrame  # every step of every run: Trainer.history columns + method, seed
    runs: pd.DataFrame  # one row per (method, seed): steps, CPU seconds, accuracies, stability
    cpu_per_step: dict  # method -> measured CPU seconds per step (calibration)
    steps: dict  # method -> step budget = cpu_budget / cpu_per_step
    cpu_budget: float
    eval_examples: int


def moe_routing_experiment(methods: Sequence[str] = tuple(METHODS), seeds: Sequence[int] = (0, 1, 2),
                           cpu_budget: float = 30.0, settings: dict | None = None, calibration_steps: int = 2,
                           collapse_drop: float = 0.1, ratio_spike: float = 1.0, callbacks=(),
                           on_run_end=None) -> MoEExperiment:
    """Train every method of `methods` (names of METHODS) with every seed from the same checkpoint
    (settings["init_checkpoint"]), at equal CPU cost: `cpu_seconds_per_step` measures each method on
    `calibration_steps` steps, then every run of it gets floor(cpu_budget / cpu_per_step) steps.
    runs.cpu_seconds is each run's measured CPU time, its evaluations included.

    A run *collapses* when its final held-out greedy accuracy is more than `collapse_drop` below the
    starting accuracy. A *ratio spike* is a step whose largest |r_t - 1| exceeds `ratio_spike` (a token
    whose probability more than doubled, or fell to almost nothing, within one step's updates).
    on_run_end(method, seed, trainer) is called after each run (a progress line, say)."""
    check_number("cpu_budget", cpu_budget, low=0, low_open=True)
    check_number("collapse_drop", collapse_drop, low=0, high=1)
    check_number("ratio_spike", ratio_spike, low=0, low_open=True)
    if not seeds:
        raise ValueError("seeds must name at least one seed, got an empty sequence")
    settings = dict(settings or {})
    cpu_per_step = cpu_seconds_per_step({m: method_config(m, settings) for m in methods}, calibration_steps)
    steps = {method: max(1, int(cpu_budget // seconds)) for method, seconds in cpu_per_step.items()}
    histories, rows = [], []
    for method in methods:
        for seed in seeds:
            config = method_config(method, settings, seed=seed, steps=steps[method])
            trainer = Trainer(config, callbacks=list(callbacks))
            start = time.process_time()
            trainer.train()
            cpu = time.process_time() - start
            history = trainer.history.assign(method=method, seed=seed)
            histories.append(history)
            rows.append(run_summary(history, method, seed, cpu, config.eval_examples, collapse_drop,
                                    ratio_spike))
            if on_run_end is not None:
                on_run_end(method, seed, trainer)
    return MoEExperiment(history=pd.concat(histories, ignore_index=True), runs=pd.DataFrame(rows),
                         cpu_per_step=cpu_per_step, steps=steps, cpu_budget=cpu_budget,
                         eval_examples=settings.get("eval_examples", make_config("grpo").eval_examples))


def run_summary(history: pd.DataFrame, method: str, seed: int, cpu_seconds: float, eval_examples: int,
                collapse_drop: float, ratio_spike: float) -> dict:
    """One run's row: accuracies, stability and routing numbers from its history."""
    evals = history["eval_accuracy"].dropna()
    steps = history[history["step"] > 0]
    initial, final = float(evals.iloc[0]), float(evals.iloc[-1])
    column = lambda name: steps[name] if name in steps else pd.Series(dtype=float)  # noqa: E731
    return {
        "method": method, "seed": seed, "steps": int(steps["step"].max()), "cpu_seconds": cpu_seconds,
        "initial_accuracy": initial, "final_accuracy": final,
        "final_accuracy_se": standard_error(final, eval_examples),
        "collapsed": final < initial - collapse_drop,
        "ratio_spikes": int((column("ratio_dev_max") > ratio_spike).sum()),
        "ratio_dev_max": float(column("ratio_dev_max").max()),
        "ratio_dev_std": float(column("ratio_dev_std").mean()),
        "kl_old_max": float(column("kl_old").max()),
        "kl_ref_final": float(steps["kl_k3"].iloc[-1]),
        "clip_frac": float(column("clip_frac").mean()),
        "seq_clip_frac": float(column("seq_clip_frac").mean()),
        "routing_change": float(column("routing_change").mean()),
        "routing_change_one_update": float(column("routing_change_one_update").mean()),
    }


def mean_and_se(values) -> tuple[float, float]:
    """Mean over seeds and its standard error, std / sqrt(n) (sample std; NaN for one seed)."""
    values = pd.Series(values, dtype=float)
    se = float(values.std() / math.sqrt(len(values))) if len(values) > 1 else float("nan")
    return float(values.mean()), se


def stability_table(result: MoEExperiment) -> pd.DataFrame:
    """Per method: steps, final accuracy (mean over seeds +- its standard error), collapses, ratio
    spikes, the largest token-ratio deviation and KL(pi_old || pi), clipped fractions, routing change."""
    rows = []
    for method, runs in result.runs.groupby("method", sort=False):
        accuracy, accuracy_se = mean_and_se(runs["final_accuracy"])
        change, change_se = mean_and_se(runs["routing_change"])
        rows.append(
            {
                "method": method,
                "seeds": len(runs),
                "steps": int(runs["steps"].iloc[0]),
                "cpu_s_per_run": float(runs["cpu_seconds"].mean()),
                "start_accuracy": float(runs["initial_accuracy"].mean()),
                "final_accuracy": accuracy,
                "final_accuracy_se": accuracy_se,
                "collapsed": f"{int(runs['collapsed'].sum())}/{len(runs)}",
                "ratio_spikes": int(runs["ratio_spikes"].sum()),
                "ratio_dev_max": float(runs["ratio_dev_max"].max()),
                "ratio_dev_std": float(runs["ratio_dev_std"].mean()),
                "kl_old_max": float(runs["kl_old_max"].max()),
                "clip_frac": float(runs["clip_frac"].mean()),
                "seq_clip_frac": float(runs["seq_clip_frac"].mean()),
                "routing_change": change,
                "routing_change_se": change_se,
            }
        )
    return pd.DataFrame(rows).set_index("method")


# ----------------------------------------------------------------------------------------------
# how much one optimiser step moves the routing

SWEEP_COLUMNS = (
    "routing_change_one_update",
    "routing_change",
    "expert_change",
    "ratio_dev_std",
    "ratio_dev_max",
    "kl_old",
    "clip_frac",
)


def short_run_sweep(grid: Sequence[dict], settings: dict | None = None, steps: int = 4, method: str = "GRPO",
                    seeds: Sequence[int] = (0,)) -> pd.DataFrame:
    """Routing and ratio numbers of short RL runs: for each entry of `grid` (config changes, e.g.
    {"learning_rate": 1e-3} or {"num_minibatches": 8}) and seed, `steps` steps of `method` from
    settings["init_checkpoint"], no evaluation. One row per (entry, seed): the entry's values, the
    seed, the steps done (fewer if a loss became non-finite) and the mean over them of SWEEP_COLUMNS
    (Trainer.history columns)."""
    check_number("steps", steps, low=1, integer=True)
    rows = []
    for changes in grid:
        for seed in seeds:
            trainer = Trainer(method_config(method, settings, **{**changes, "seed": seed, "eval_every": 0}))
            try:
                for _ in range(steps):
                    trainer.train_step()
            except NonFiniteLossError:  # the step was undone; keep the steps that finished
                pass
            means = trainer.history[list(SWEEP_COLUMNS)].mean() if trainer.step else pd.Series(dtype=float)
            rows.append({**changes, "seed": seed, "steps": trainer.step, **means.to_dict()})
    return pd.DataFrame(rows)



def one_step_routing_change(model, rollout, learning_rate: float, steps: int = 1) -> dict:
    """Routing change of `model` on `rollout`'s completion tokens after `steps` fresh-AdamW steps of the
    completions' negative log-likelihood (teacher-forced) at `learning_rate`. The model is copied, not
    changed. Adam's first step moves every weight by about lr (its update is ~sign(gradient)), so the
    number mostly measures how sensitive the routing is to a step of that size, whatever the loss.
    Returns routing_change's dict (token, expert, layers)."""
    import copy

    from ..rl.rollout import policy_forward

    check_number("learning_rate", learning_rate, low=0, low_open=True)
    model = copy.deepcopy(model).train()
    top_k = model.config.num_experts_per_tok
    mask = rollout.completion_mask
    with torch.no_grad():
        before = routed_experts(policy_forward(model, rollout).router_logits, top_k)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, betas=(0.9, 0.99), weight_decay=0.0)
    for _ in range(steps):
        out = policy_forward(model, rollout)
        loss = -(out.logprobs * mask).sum() / mask.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        after = routed_experts(policy_forward(model, rollout).router_logits, top_k)
    return routing_change(completion_experts(before, rollout), completion_experts(after, rollout), mask)


def routing_change_sweep(models: dict, rollout, learning_rates: Sequence[float]) -> pd.DataFrame:
    """`one_step_routing_change` for every model (name -> model: different experts, top-k, seeds) and
    learning rate (the step is deterministic: vary the models' seeds for a spread). One row per
    (model, lr): model, num_experts, top_k, learning_rate, routing_change, expert_change."""
    rows = []
    for name, model in models.items():
        for lr in learning_rates:
            change = one_step_routing_change(model, rollout, lr)
            rows.append({"model": name, "num_experts": model.config.num_local_experts,
                         "top_k": model.config.num_experts_per_tok, "learning_rate": lr,
                         "routing_change": change["token"], "expert_change": change["expert"]})
    return pd.DataFrame(rows)


__all__ = [
    "METHODS",
    "METHOD_STYLES",
    "SWEEP_COLUMNS",
    "MoEExperiment",
    "cpu_seconds_per_step",
    "mean_and_se",
    "method_config",
    "moe_routing_experiment",
    "one_step_routing_change",
    "routing_change_sweep",
    "run_summary",
    "short_run_sweep",
    "stability_table",
]
