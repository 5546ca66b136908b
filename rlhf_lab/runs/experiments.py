"""Runs that write their results to a folder: what `python -m rlhf_lab train|compare` and the
benchmarks call.

    train_run(config, out_dir)            run.json, resume/ (saved along the way), history.csv,
                                          metrics.json, plots/*.png, checkpoint/
    compare_runs(algos, out_dir, ...)     one sub-folder per algorithm + report.md + comparison.png

Each output folder has one writer (a lock) and holds one run: an existing run is continued with
resume=True or replaced with overwrite=True, never mixed with another.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from pathlib import Path

import pandas as pd

from ..rl import Trainer, make_config
from ..train.callbacks import ProgressBar
from ..train.run_state import Checkpointer, has_state, remaining, signals_deferred
from ..util.atomic import FolderLock, write_text_atomic
from ..util.validation import check_number


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


class OutputFolderError(ValueError):
    """The output folder holds another run (or other files), or cannot be used."""


RUN_FILE = "run.json"  # what a run is (its config), written before training: --resume reads it
STATE_FOLDER = "resume"  # the latest resumable trainer state (rlhf_lab.train.run_state)
TRAIN_OUTPUTS = (RUN_FILE, STATE_FOLDER, "history.csv", "metrics.json", "plots", "checkpoint")
COMPARE_OUTPUTS = (RUN_FILE, "report.md", "summary.csv", "comparison.png")


def output_folder(out_dir: str | Path) -> Path:
    if not str(out_dir).strip():
        raise OutputFolderError("the output folder must be a path, got an empty string")
    return Path(out_dir)


def read_run(out: Path) -> dict | None:
    """out/run.json, the record of the run the folder holds (None when there is none). A file that
    is not one (not JSON, no "command") raises OutputFolderError naming it."""
    path = out / RUN_FILE
    if not path.is_file():
        return None
    try:
        run = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise OutputFolderError(f"{path} is not valid JSON ({exc}), so it records no run; remove it if you "
                                "wrote it, or choose another folder") from exc
    if not isinstance(run, dict) or not isinstance(run.get("command"), str):
        raise OutputFolderError(f"{path} records no run (a JSON object with a \"command\"); remove it if you "
                                "wrote it, or choose another folder")
    return run


def prepare_output_folder(out: Path, outputs: tuple, resume: bool, overwrite: bool, kept: tuple = (),
                          command: str | None = None) -> None:
    """Refuse to mix two runs in one folder, and never delete what the lab did not write.

    A folder holding a run (its run.json) is continued (`resume`), or with `overwrite` its run's
    files (`outputs`, nothing else) are deleted; it must be a run of `command` (when given). A
    folder holding no run.json is never cleared: paths named like `outputs` there were not written
    by a run, so they are refused even with `overwrite`, and other files are used only with
    `overwrite`, which leaves them alone. Files named in `kept` may be there and are left alone
    (the sft command's folder of checkpoints: README.md, the presets it replaces itself)."""
    run = read_run(out)
    present = [name for name in outputs if (out / name).exists()]
    names = [p.name for p in out.iterdir()] if out.is_dir() else []
    others = [name for name in names if not name.startswith(".") and name not in outputs and name not in kept]
    if run is not None:
        if command is not None and run["command"] != command:
            raise OutputFolderError(f"{out} holds a `{run['command']}` run, not a `{command}` run; choose "
                                    "another --out")
        if not (resume or overwrite):
            raise OutputFolderError(f"{out} already holds a run ({', '.join(present)}); pass --resume to "
                                    "continue it, --overwrite to replace it, or choose another --out")
        if overwrite and not resume:
            for name in present:
                path = out / name
                shutil.rmtree(path) if path.is_dir() else path.unlink()
        return
    foreign = [name for name in present if name not in kept]
    if foreign:
        raise OutputFolderError(f"{out} holds {', '.join(foreign)} but no {RUN_FILE}: no run of the lab "
                                "wrote them, and --overwrite deletes only what a run wrote; move them away "
                                "or choose another --out")
    if others and not overwrite:
        listed = ", ".join(sorted(others)[:5])
        raise OutputFolderError(f"{out} is not empty ({listed}) and holds no run; choose a new or empty "
                                "folder (--overwrite writes there anyway, leaving those files alone)")


@contextlib.contextmanager
def run_record(out: Path, record: dict, resume: bool):
    """Write out/run.json (what --resume reads) for the block. If the block fails with an error
    (not a stop) before any resumable state was saved under out/STATE_FOLDER, a run.json it wrote is
    removed again: the folder is as it was, and the corrected command is not refused."""
    fresh = not (out / RUN_FILE).exists() and not resume
    with signals_deferred():
        write_text_atomic(out / RUN_FILE, json.dumps(record, indent=2) + "\n")
    try:
        yield
    except Exception:
        state = out / STATE_FOLDER
        if fresh and not (state.exists() and any(state.iterdir())):
            (out / RUN_FILE).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def removed_if_refused(out: Path):
    """Delete `out` again if the block fails while it holds nothing but the lock (a refused run
    leaves no empty folder behind)."""
    try:
        yield
    except BaseException:
        if out.is_dir() and [p.name for p in out.iterdir()] == [".lock"]:
            (out / ".lock").unlink()
            out.rmdir()
        raise


def train_run(config, out_dir: str | Path, progress: bool = True, save_checkpoint: bool = True,
              trainer: Trainer | None = None, resume: bool = False, overwrite: bool = False,
              save_every: int = 10, plots: bool = True, run_info: dict | None = None) -> dict:
    """Train `config` into `out_dir`: run.json first (with `run_info`, e.g. a split's settings), the
    resumable state every `save_every` steps and at any stop (out_dir/resume), then history.csv,
    metrics.json, plots and the final checkpoint.

    One writer per folder (a lock); a folder holding another run is refused unless `resume`
    (continue from its saved state, to `config.steps`) or `overwrite`. Signals sent while a file is
    written wait for it (when the CLI's StopSignals is active)."""
    check_number("save_every", save_every, low=0, integer=True)
    out = output_folder(out_dir)
    with FolderLock(out), removed_if_refused(out):
        prepare_output_folder(out, TRAIN_OUTPUTS, resume, overwrite, command="train")
        trainer = trainer or Trainer(config)  # bad settings raise here, before anything is written
        with run_record(out, {"command": "train", "config": config.to_dict(), **(run_info or {})}, resume):
            summary = _train_into(trainer, config, out, resume, progress, save_every, plots, save_checkpoint)
    summary["trainer"] = trainer
    return summary


def _train_into(trainer: Trainer, config, out: Path, resume: bool, progress: bool, save_every: int,
                plots: bool, save_checkpoint: bool) -> dict:
    """train_run's work once the folder is prepared and run.json written."""
    state = out / STATE_FOLDER
    if resume and has_state(state):
        trainer.resume(state)
    trainer.add_callback(Checkpointer(state, every=save_every))
    trainer.resume_hint = f"It is saved in {state}; continue with: python -m rlhf_lab train --resume {out}"
    total = None if config.time_budget else config.steps
    if progress:
        trainer.add_callback(ProgressBar(total))
    start = time.perf_counter()
    steps_left, budget_left = remaining(trainer)
    trainer.train(steps=steps_left, time_budget=budget_left)  # 0 steps still finishes a cut evaluation
    with signals_deferred():
        write_text_atomic(out / "history.csv", trainer.history.to_csv(index=False))
    summary = summarize(trainer)
    summary["elapsed_seconds"] = time.perf_counter() - start
    with signals_deferred():
        write_text_atomic(out / "metrics.json", json.dumps(summary, indent=2, default=str) + "\n")
    if plots:
        try:
            from ..viz import save_training_plots

            save_training_plots(trainer.history, trainer.distributions, out / "plots", config=trainer.config)
        except ImportError:  # plotting is optional for the CLI
            pass
    if save_checkpoint:
        with signals_deferred():
            trainer.save(out / "checkpoint")
    return summary


def compare_runs(algos: list[str], out_dir: str | Path, progress: bool = True, target: float = 0.95,
                 resume: bool = False, overwrite: bool = False, save_every: int = 10, plots: bool = True,
                 **overrides) -> pd.DataFrame:
    """Run each algorithm from the same checkpoint with the same seed into out_dir/ALGO; write report.md.
    `resume` continues every unfinished run (finished ones are only summarised again)."""
    duplicates = sorted({algo for algo in algos if algos.count(algo) > 1})
    if duplicates:
        raise ValueError(f"algos lists {duplicates} more than once; each algorithm's run has one folder")
    out = output_folder(out_dir)
    with FolderLock(out), removed_if_refused(out):
        prepare_output_folder(out, COMPARE_OUTPUTS + tuple(algos), resume, overwrite, command="compare")
        configs = [make_config(algo, **overrides) for algo in algos]  # bad settings raise before any write
        with signals_deferred():
            write_text_atomic(
                out / RUN_FILE,
                json.dumps(
                    {"command": "compare", "algos": list(algos), "target": target, "overrides": overrides},
                    indent=2,
                )
                + "\n",
            )
        rows, histories = [], {}
        for algo, config in zip(algos, configs):
            summary = train_run(config, out / algo, progress=progress, resume=resume,
                                save_every=save_every, plots=plots)
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
        if plots:
            try:
                from ..viz import plot_history

                fig = plot_history(histories, metrics=["eval_accuracy", "reward_mean", "kl_k1"],
                                   x="wall_time")
                fig.savefig(out / "comparison.png", dpi=90, bbox_inches="tight")
            except ImportError:
                pass
        report = [
            "# Algorithm comparison",
            "",
            f"Same checkpoint, task and seed; overrides: {overrides}",
            "",
            table.to_markdown(index=False, floatfmt=".3f")
            if _has_tabulate()
            else table.to_string(index=False),
            "",
            "![comparison](comparison.png)" if plots else "",
            "",
        ]
        with signals_deferred():
            write_text_atomic(out / "report.md", "\n".join(report))
            write_text_atomic(out / "summary.csv", table.to_csv(index=False))
    return table


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401
    except ImportError:
        return False
    return True
