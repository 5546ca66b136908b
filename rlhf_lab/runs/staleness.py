"""The staleness sweep: how accuracy depends on how old the rollouts are, and on the correction.

    table = staleness_sweep(staleness=(0, 1, 2, 4, 8), corrections=("none", "naive", "decoupled"),
                            seeds=(0, 1, 2), settings=dict(steps=60, eval_every=20))

Each run is an `AsyncTrainer` with the inline rollout worker: every rollout is exactly K policy
versions old (the schedule of a split whose rollout workers are never the bottleneck), so the only
difference between two runs of a seed is K and the correction, not the timing of the machine.
AReaL's table (arXiv 2505.24298, R1-Distill-Qwen-1.5B on AIME24, naive PPO / decoupled) is the
comparison: 42.0 at staleness 0; at 4, 23.3 naive and 42.2 decoupled.
"""

from __future__ import annotations

import time

import pandas as pd

from ..distributed import AsyncTrainer, SplitConfig
from ..rl import make_config


def staleness_sweep(staleness=(0, 1, 2, 4, 8), corrections=("none", "naive", "decoupled"), seeds=(0, 1, 2),
                    settings: dict | None = None, algo: str = "grpo", progress=None) -> pd.DataFrame:
    """One row per run and evaluation: staleness, correction, seed, step, eval_accuracy, plus the run's
    mean clipped fraction and its seconds. `settings` go to make_config (steps, eval_every, ...);
    `progress(text)` is called after each run."""
    rows = []
    for seed in seeds:
        for k in staleness:
            for correction in corrections:
                config = make_config(algo, settings or {}, seed=seed, off_policy=correction)
                start = time.perf_counter()
                history = AsyncTrainer(config, SplitConfig(launch="inline", max_staleness=k)).train()
                seconds = time.perf_counter() - start
                evaluated = history.dropna(subset=["eval_accuracy"])
                for step, accuracy in zip(evaluated["step"], evaluated["eval_accuracy"]):
                    rows.append({"staleness": k, "correction": correction, "seed": seed, "step": int(step),
                                 "eval_accuracy": float(accuracy),
                                 "clip_frac": float(history["clip_frac"].mean()),
                                 "seconds": seconds})
                if progress is not None:
                    progress(f"K={k} {correction} seed {seed}: {evaluated['eval_accuracy'].iloc[-1]:.3f} "
                             f"({seconds:.0f} s)")
    return pd.DataFrame(rows)


def final_accuracy_table(sweep: pd.DataFrame) -> pd.DataFrame:
    """Mean and standard deviation over seeds of each run's last held-out accuracy, one row per K."""
    last = sweep[sweep["step"] == sweep["step"].max()]
    grouped = last.groupby(["staleness", "correction"])["eval_accuracy"]
    table = pd.concat({"mean": grouped.mean(), "std": grouped.std(ddof=1)}, axis=1).unstack("correction")
    return table.swaplevel(0, 1, axis=1).sort_index(axis=1)
