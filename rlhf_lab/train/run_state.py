"""Runs that survive: a trainer's whole state on disk, saved along the way, and any stop handled.

    trainer.save_state(folder)            weights, optimiser, RNG states, step, history (atomic)
    trainer.resume(folder)                continue exactly where that state left off
    Checkpointer(folder, every=10)        a callback: save every N steps and whenever train() stops
    with StopSignals(): ...               SIGTERM stops like Ctrl-C; a signal during a save waits for it

Resuming is exact: on the CPU, a run stopped at any step and resumed writes the same history,
value for value, as a run that never stopped (only the time columns differ). That holds because
everything the next step reads is saved: the weights (policy, a separate critic), AdamW's moments
and step counts, every torch.Generator (sampling, prompt order, minibatch order), the algorithm's
state (PPO's adaptive KL weight), the step counter and the rows of the history. The reference
model is not saved: it is the starting checkpoint, which the resumed trainer loads again.

A state folder (Hugging Face's Trainer keeps the same things in a checkpoint-N folder):

    STATE/policy.safetensors ...   one file per trained module (`TrainingLoop.state_modules`)
    STATE/trainer_state.pt         optimiser, RNG states, step, rows, algorithm state (weights-only pickle)
    STATE/trainer_state.json       step, config, and a checksum of each file above
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from ..model.hf import CheckpointError, file_sha256, load_tensors
from ..util.atomic import StopSignals, recover_folder, replace_folder, signals_deferred
from ..util.validation import check_number
from .callbacks import Callback

__all__ = ["Checkpointer", "StopSignals", "has_state", "load_state", "read_state_summary", "remaining", "save_state",
           "signals_deferred"]

STATE_FILE = "trainer_state.json"

# Fields a resumed run may change: how long it goes on, how often it evaluates, what it keeps for
# the plots. (Not the device: RNG states and float rounding differ between devices.) Any other difference would make the resumed run another run.
RESUMABLE_CHANGES = ("steps", "time_budget", "eval_every", "keep_distributions")


def has_state(folder: str | Path) -> bool:
    """Whether `folder` holds a saved trainer state (after repairing a killed save)."""
    recover_folder(folder)
    return (Path(folder) / STATE_FILE).is_file()


def save_state(trainer, folder: str | Path) -> Path:
    """Write everything `trainer` needs to continue into `folder`, atomically (a reader, or a kill,
    sees the previous state or this one)."""
    if not trainer.state_modules():
        raise NotImplementedError(f"{type(trainer).__name__} does not say which modules it trains (state_modules)")
    modules = {name: {key: value.detach().cpu().clone().contiguous() for key, value in module.state_dict().items()}
               for name, module in trainer.state_modules().items()}
    state = {
        "step": trainer.step, "train_time": trainer.train_time, "rows": list(trainer.rows),
        "optimizer": trainer.optimizer.state_dict(),
        "generators": {name: g.get_state() for name, g in trainer.state_generators().items()},
        "torch_rng": torch.get_rng_state(), "extra": trainer.extra_state(),
    }
    config = trainer.config.to_dict() if hasattr(trainer.config, "to_dict") else dataclasses.asdict(trainer.config)

    def write(tmp: Path) -> None:
        for name, tensors in modules.items():
            save_file(tensors, str(tmp / f"{name}.safetensors"), metadata={"format": "pt"})
        torch.save(state, tmp / "trainer_state.pt")
        files = sorted(p.name for p in tmp.iterdir())
        summary = {"trainer": type(trainer).__name__, "step": trainer.step, "config": config,
                   "sha256": {name: file_sha256(tmp / name) for name in files}}
        (tmp / STATE_FILE).write_text(json.dumps(summary, indent=2, default=str) + "\n")

    return replace_folder(folder, write)


def read_state_summary(folder: str | Path) -> dict:
    """folder/trainer_state.json: the saved step, config and checksums."""
    if not has_state(folder):
        raise CheckpointError(f"{folder} holds no saved trainer state ({STATE_FILE} not found)")
    try:
        return json.loads((Path(folder) / STATE_FILE).read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{Path(folder) / STATE_FILE} is not valid JSON ({exc})") from exc


def load_state(trainer, folder: str | Path) -> None:
    """Put the state saved in `folder` into `trainer`, which must be built with the same settings
    (those in RESUMABLE_CHANGES may differ). Every file is checked against its checksum and every
    tensor for NaN/inf before anything is changed."""
    folder = Path(folder)
    summary = read_state_summary(folder)
    if summary.get("trainer") != type(trainer).__name__:
        raise CheckpointError(f"{folder} holds the state of a {summary.get('trainer')}, not a {type(trainer).__name__}")
    config = trainer.config.to_dict() if hasattr(trainer.config, "to_dict") else dataclasses.asdict(trainer.config)
    saved = summary["config"]
    changed = sorted(k for k in set(saved) | set(config)
                     if k not in RESUMABLE_CHANGES and json.dumps(saved.get(k), default=str) != json.dumps(config.get(k), default=str))
    if changed:
        raise ValueError(f"cannot resume from {folder}: the saved run had "
                         + ", ".join(f"{k}={saved.get(k)!r}" for k in changed) + "; this trainer has "
                         + ", ".join(f"{k}={config.get(k)!r}" for k in changed))
    checksums = summary.get("sha256", {})
    modules = trainer.state_modules()
    tensors = {name: load_tensors(folder / f"{name}.safetensors", checksums.get(f"{name}.safetensors"))
               for name in modules}
    state_path = folder / "trainer_state.pt"
    if not state_path.is_file() or (checksums.get(state_path.name) and file_sha256(state_path) != checksums[state_path.name]):
        raise CheckpointError(f"{state_path} is missing, or was modified after saving (checksum)")
    state = torch.load(state_path, weights_only=True)
    for name, module in modules.items():
        module.load_state_dict(tensors[name])
    trainer.optimizer.load_state_dict(state["optimizer"])
    for name, generator in trainer.state_generators().items():
        generator.set_state(state["generators"][name])
    torch.set_rng_state(state["torch_rng"])
    trainer.load_extra_state(state["extra"])
    trainer.rows[:] = state["rows"]
    trainer.step, trainer.train_time = state["step"], state["train_time"]


def remaining(trainer) -> tuple[int, float | None]:
    """(steps, time_budget) that take `trainer` (fresh or resumed) to the end of its run: `config.steps`
    in all, `config.time_budget` seconds of training in all. A resumed run whose clock had run out, or
    that had stopped early (`early_stop` of its last row, e.g. SFT's stop_at_accuracy), gets 0 steps:
    train(0) still finishes an evaluation a stop cut short."""
    config = trainer.config
    steps_left = max(config.steps - trainer.step, 0)
    budget_left = None if config.time_budget is None else config.time_budget - trainer.train_time
    if budget_left is not None and budget_left <= 0:
        steps_left, budget_left = 0, None
    if trainer.step and trainer.rows and trainer.early_stop(trainer.rows[-1]):
        steps_left = 0
    return steps_left, budget_left


class Checkpointer(Callback):
    """Save the trainer's state to `folder` every `every` steps (0: only at the end) and whenever
    train() returns, however it stops (steps done, Stop / SIGTERM, a non-finite loss). The save is
    atomic and signals wait for it, so the folder always holds a complete state."""

    def __init__(self, folder: str | Path, every: int = 10) -> None:
        check_number("every", every, low=0, integer=True)
        self.folder, self.every = Path(folder), every

    def on_step_end(self, trainer, metrics: dict, distributions=None) -> None:
        if self.every and trainer.step % self.every == 0:
            self.save(trainer)

    def on_train_end(self, trainer) -> None:
        self.save(trainer)  # always: the last row may have changed since (an evaluation finished)

    def save(self, trainer) -> None:
        with signals_deferred():
            save_state(trainer, self.folder)
