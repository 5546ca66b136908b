"""Runs that write their results to a folder: what `python -m rlhf_lab train|compare` and the
benchmarks call.

    train_run(config, out_dir)            history.csv, metrics.json, plots/*.png, checkpoint/
    compare_runs(algos, out_dir, ...)     one sub-folder per algorithm + report.md + comparison.png
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd

from .callbacks import ProgressBar
from .rl import Trainer, make_config


def summarize(trainer: Trainer) -> dict:
    """Final metrics: held-out greedy accuracy (re-measured now), time, tokens/s, memory."""
    history = trainer.history
    steps = history[history["step"] > 0]
    evals = history.dropna(subset=["eval_accuracy"])
    return {
        "algo": trainer.config.algo,
        "steps": int(trainer.step),
        "stop_reason": trainer.stop_reason,
        "train_seconds": float(trainer.train_time),
        "initial_eval_accuracy": float(evals["eval_accuracy"].iloc[0]) if len(evals) else None,
        "final_eval_accuracy": float(trainer.evaluate()),
        "best_eval_accuracy": float(evals["eval_accuracy"].max()) if len(evals) else None,
        "final_reward_mean": float(steps["reward_mean"].iloc[-1]) if len(steps) else None,
        "final_kl_k1": float(steps["kl_k1"].iloc[-1]) if len(steps) else None,
        "mean_tokens_per_s": float(steps["tokens_per_s"].mean()) if len(steps) else None,
        "memory_bytes": trainer.memory_bytes(),
        "peak_memory_bytes": int(steps["mem_peak_bytes"].max()) if len(steps) else None,
        "config": trainer.config.to_dict(),
    }


def time_to_accuracy(history: pd.DataFrame, target: float) -> float | None:
    """Training seconds until held-out accuracy first reached `target` (None if never)."""
    hit = history[history["eval_accuracy"] >= target]
    return float(hit["wall_time"].iloc[0]) if len(hit) else None


def train_run(config, out_dir: str | Path, progress: bool = True, save_checkpoint: bool = True,
              trainer: Trainer | None = None) -> dict:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    trainer = trainer or Trainer(config)
    total = None if config.time_budget else config.steps
    if progress:
        trainer.add_callback(ProgressBar(total))
    start = time.perf_counter()
    trainer.train()
    summary = summarize(trainer)
    summary["elapsed_seconds"] = time.perf_counter() - start
    trainer.history.to_csv(out / "history.csv", index=False)
    (out / "metrics.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    try:
        from .viz import save_training_plots

        save_training_plots(trainer.history, trainer.distributions, out / "plots", config=trainer.config)
    except ImportError:  # plotting is optional for the CLI
        pass
    if save_checkpoint:
        trainer.save(out / "checkpoint")
    summary["trainer"] = trainer
    return summary


def compare_runs(algos: list[str], out_dir: str | Path, progress: bool = True, target: float = 0.95,
                 **overrides) -> pd.DataFrame:
    """Run each algorithm from the same checkpoint with the same seed; write report.md."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows, histories = [], {}
    for algo in algos:
        summary = train_run(make_config(algo, **overrides), out / algo, progress=progress)
        history = summary.pop("trainer").history
        histories[algo] = history
        rows.append({
            "algo": algo,
            "initial acc": summary["initial_eval_accuracy"],
            "final acc": summary["final_eval_accuracy"],
            f"s to {target:.0%}": time_to_accuracy(history, target),
            "train s": summary["train_seconds"],
            "steps": summary["steps"],
            "final KL (k1)": summary["final_kl_k1"],
            "tokens/s": summary["mean_tokens_per_s"],
            "params+optim MiB": (sum(summary["memory_bytes"].values())) / 2**20,
        })
    table = pd.DataFrame(rows)
    try:
        from .viz import plot_history

        fig = plot_history(histories, metrics=["eval_accuracy", "reward_mean", "kl_k1"], x="wall_time")
        fig.savefig(out / "comparison.png", dpi=90, bbox_inches="tight")
    except ImportError:
        pass
    report = ["# Algorithm comparison", "", f"Same checkpoint, task and seed; overrides: {overrides}", "",
              table.to_markdown(index=False, floatfmt=".3f") if _has_tabulate() else table.to_string(index=False),
              "", "![comparison](comparison.png)", ""]
    (out / "report.md").write_text("\n".join(report))
    table.to_csv(out / "summary.csv", index=False)
    return table


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401
    except ImportError:
        return False
    return True
