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
model is not saved: it is the starting checkpoint, which the resumed trainer loads again, so the
state records a sha256 of it (and of a learned reward model: `trainer.identity()`), and a resume
from other weights is refused.

A state folder (Hugging Face's Trainer keeps the same things in a checkpoint-N folder):

    STATE/policy.safetensors ...   one file per trained module (`TrainingLoop.state_modules`)
    STATE/trainer_state.pt         optimiser, RNG states, step, rows, algorithm state (weights-only pickle)
    STATE/trainer_state.json       step, config, the identity of the starting weights, a checksum of each file
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import io
import json
import pickle
from pathlib import Path

import torch
from safetensors.torch import save as safetensors_bytes

from ..model.hf import CheckpointError, file_sha256, load_tensors
from ..util.atomic import StopSignals, recover_folder, replace_folder, signals_deferred, write_bytes
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
    identity = trainer.identity()

    def write(tmp: Path) -> None:
        # Serialised in memory, then written with Python's file API: a full disk is then an OSError
        # naming the file, where torch and safetensors would raise their own errors.
        for name, tensors in modules.items():
            write_bytes(tmp / f"{name}.safetensors", safetensors_bytes(tensors, metadata={"format": "pt"}))
        buffer = io.BytesIO()
        torch.save(state, buffer)
        write_bytes(tmp / "trainer_state.pt", buffer.getvalue())
        files = sorted(p.name for p in tmp.iterdir())
        summary = {"trainer": type(trainer).__name__, "step": trainer.step, "config": config,
                   "identity": identity, "sha256": {name: file_sha256(tmp / name) for name in files}}
        (tmp / STATE_FILE).write_text(json.dumps(summary, indent=2, default=str) + "\n")

    return replace_folder(folder, write)


def read_state_summary(folder: str | Path) -> dict:
    """folder/trainer_state.json: the saved trainer, step, config and checksums (each checked to be
    there, of the right type)."""
    if not has_state(folder):
        raise CheckpointError(f"{folder} holds no saved trainer state ({STATE_FILE} not found)")
    path = Path(folder) / STATE_FILE
    try:
        summary = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON ({exc}); {DAMAGED}") from exc
    if not isinstance(summary, dict):
        raise CheckpointError(f"{path} must hold a JSON object, got a {type(summary).__name__}; {DAMAGED}")
    for key, kind in (("trainer", str), ("step", int), ("config", dict), ("sha256", dict)):
        if not isinstance(summary.get(key), kind):
            raise CheckpointError(f"{path} has no {key!r} {kind.__name__} (got {summary.get(key)!r}); "
                                  f"{DAMAGED}")
    return summary


# What a damaged state leaves the user: the run cannot go on from it.
DAMAGED = "the saved state is damaged: start the run again (the CLI's --overwrite) or from another copy"


def read_trainer_state(path: Path, sha256: str | None) -> dict:
    """trainer_state.pt, checked against its checksum and loaded with weights_only=True (tensors and
    plain data only: a pickle that would build other objects, which could run code, is refused)."""
    if not path.is_file():
        raise CheckpointError(f"{path} not found; {DAMAGED}")
    if sha256 is None or file_sha256(path) != sha256:
        raise CheckpointError(f"{path} was modified after saving (its checksum differs from the one in "
                              f"{STATE_FILE}); {DAMAGED}")
    try:
        state = torch.load(path, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(f"{path} was refused as unsafe: it holds objects other than tensors and plain "
                              f"data (loading them could run code): the lab did not write it "
                              f"({str(exc).splitlines()[0]})") from exc
    except (RuntimeError, EOFError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path} is corrupt or truncated ({exc}); {DAMAGED}") from exc
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} must hold a dict, got a {type(state).__name__}; {DAMAGED}")
    return state


def check_trainer_state(trainer, state: dict, path: Path, step: int) -> None:
    """Raise CheckpointError naming `path` unless `state` has every entry `load_state` reads, of the
    right type, for this trainer's generators: checked before anything is loaded."""
    expected = {"step": int, "train_time": (int, float), "rows": list, "optimizer": dict, "generators": dict,
                "torch_rng": torch.Tensor, "extra": dict}
    for key, kind in expected.items():
        if not isinstance(state.get(key), kind) or isinstance(state.get(key), bool):
            name = "number" if isinstance(kind, tuple) else kind.__name__
            raise CheckpointError(f"{path} has no {key!r} {name} (got {type(state.get(key)).__name__}); "
                                  f"{DAMAGED}")
    if state["step"] != step:
        raise CheckpointError(f"{path} is at step {state['step']} but {STATE_FILE} says {step}; {DAMAGED}")
    if not all(isinstance(row, dict) for row in state["rows"]):
        raise CheckpointError(f"{path}: every history row must be a dict; {DAMAGED}")
    missing = sorted(set(trainer.state_generators()) - set(state["generators"]))
    if missing or not all(isinstance(g, torch.Tensor) for g in state["generators"].values()):
        raise CheckpointError(f"{path} lacks the state of the random generator(s) {missing}; {DAMAGED}")
    if not {"state", "param_groups"} <= set(state["optimizer"]):
        raise CheckpointError(f"{path} holds no optimizer state; {DAMAGED}")


def check_module_tensors(module: torch.nn.Module, tensors: dict, path: Path) -> None:
    """Raise CheckpointError naming `path` unless `tensors` has exactly `module`'s keys and shapes."""
    expected = {key: tuple(value.shape) for key, value in module.state_dict().items()}
    found = {key: tuple(value.shape) for key, value in tensors.items()}
    if expected != found:
        differ = sorted(k for k in set(expected) | set(found) if expected.get(k) != found.get(k))
        raise CheckpointError(f"{path} does not match this trainer's model: {differ[:5]} differ in name or "
                              "shape; resume with the model the run was started with")


def weights_sha256(modules) -> str:
    """One sha256 over the tensors of `modules` (nn.Modules or state dicts), in order, names and
    shapes included: what a resumed run checks to know it got the same starting weights."""
    digest = hashlib.sha256()
    for module in modules:
        state = module.state_dict() if isinstance(module, torch.nn.Module) else module
        for name in sorted(state):
            tensor = state[name].detach().to("cpu").contiguous()
            digest.update(f"{name} {tuple(tensor.shape)} {tensor.dtype};".encode())
            digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def check_identity(trainer, summary: dict, folder: Path) -> None:
    """Raise CheckpointError when what the run was built on (`trainer.identity()`: the reference
    weights, a reward model) differs from what the saved run recorded."""
    saved = summary.get("identity") or {}
    now = trainer.identity()
    changed = sorted(name for name in saved if name in now and saved[name] != now[name])
    if changed:
        what = ", ".join(f"{name} (sha256 {saved[name][:12]} when the run started, {now[name][:12]} now)"
                         for name in changed)
        raise CheckpointError(f"cannot resume from {folder}: the run's {what} changed. The resumed run would "
                              "train against other weights; restore the ones it started from, or start a new "
                              "run (the CLI's --overwrite)")


def load_state(trainer, folder: str | Path) -> None:
    """Put the state saved in `folder` into `trainer`, which must be built with the same settings
    (those in RESUMABLE_CHANGES may differ) from the same starting weights (`trainer.identity()`).
    Everything is checked before anything is changed: every file against its checksum, every
    tensor for NaN/inf and shape, every entry of the state for its type; if loading still fails,
    the trainer is put back as it was."""
    folder = Path(folder)
    summary = read_state_summary(folder)
    if summary["trainer"] != type(trainer).__name__:
        raise CheckpointError(f"{folder} holds the state of a {summary['trainer']}, not a "
                              f"{type(trainer).__name__}")
    config = trainer.config.to_dict() if hasattr(trainer.config, "to_dict") else dataclasses.asdict(trainer.config)
    saved = summary["config"]
    changed = sorted(k for k in set(saved) | set(config) if k not in RESUMABLE_CHANGES
                     and json.dumps(saved.get(k), default=str) != json.dumps(config.get(k), default=str))
    if changed:
        raise ValueError(f"cannot resume from {folder}: the saved run had "
                         + ", ".join(f"{k}={saved.get(k)!r}" for k in changed) + "; this trainer has "
                         + ", ".join(f"{k}={config.get(k)!r}" for k in changed))
    check_identity(trainer, summary, folder)
    checksums = summary["sha256"]
    modules = trainer.state_modules()
    tensors = {}
    for name, module in modules.items():
        path = folder / f"{name}.safetensors"
        tensors[name] = load_tensors(path, checksums.get(path.name))
        check_module_tensors(module, tensors[name], path)
    state_path = folder / "trainer_state.pt"
    state = read_trainer_state(state_path, checksums.get(state_path.name))
    check_trainer_state(trainer, state, state_path, summary["step"])
    before = (trainer._snapshot(), list(trainer.rows), trainer.step, trainer.train_time,
              torch.get_rng_state(), copy.deepcopy(trainer.extra_state()))
    try:
        for name, module in modules.items():
            module.load_state_dict(tensors[name])
        trainer.optimizer.load_state_dict(state["optimizer"])
        for name, generator in trainer.state_generators().items():
            generator.set_state(state["generators"][name])
        torch.set_rng_state(state["torch_rng"])
        trainer.load_extra_state(state["extra"])
    except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as exc:
        snapshot, rows, step, train_time, rng, extra = before
        trainer._restore(snapshot)
        trainer.rows[:], trainer.step, trainer.train_time = rows, step, train_time
        torch.set_rng_state(rng)
        trainer.load_extra_state(extra)
        raise CheckpointError(f"{state_path} does not fit this trainer ({type(exc).__name__}: {exc}); "
                              f"{DAMAGED}") from exc
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
