"""Helpers every notebook imports first: the FAST switch, seeding, a one-line device report, and what
a training cell needs to behave in Jupyter as a learner expects (run it again to continue, Stop ends
Run All, a FAST run says that its numbers are not the text's)."""

from __future__ import annotations

import os
import random

import torch

FAST: bool = os.environ.get("RLHF_LAB_FAST", "0").lower() in ("1", "true", "yes", "on")

FAST_NOTE = ("[FAST mode: a shortened run. Its numbers differ from those the text quotes, which come "
             "from the committed full-mode run.]")


def setup(seed: int = 0, threads: int | None = None) -> dict:
    """Seed everything, pick a sensible thread count, return what the notebook should print."""
    from ..util.device import describe, pick_device

    random.seed(seed)
    torch.manual_seed(seed)
    if threads is not None:
        torch.set_num_threads(threads)
    device = pick_device()
    return {"fast": FAST, "device": str(device), "description": describe(device)}


def fast_note(fast: bool | None = None) -> str | None:
    """Print (and return) `FAST_NOTE` when the notebook runs in FAST mode; in full mode do nothing.

    Called in the code cell whose outputs the next paragraph quotes, so a learner running the short
    version sees, next to those outputs, why they differ from the text. It prints nothing in full
    mode, so the committed (full-mode) outputs are unchanged by it. `fast` overrides `FAST` (tests).
    """
    if not (FAST if fast is None else fast):
        return None
    print(FAST_NOTE)
    return FAST_NOTE


def continue_run(existing, config):
    """The trainer a re-run training cell should keep training: `existing` when it was built from an
    equal `config`, else None (build a new one).

        trainer = continue_run(globals().get("trainer"), config) or Trainer(config, callbacks=[...])
        history = trainer.train()      # a re-run continues from trainer.step

    Run the cell once and `existing` is None: a new trainer. Press Stop, or let it finish, and run
    the cell again: the same trainer continues its run (same model, optimiser, history, step count)
    for another `config.steps` / `config.time_budget`. Change a setting and run it again: the configs
    differ, so a fresh run starts. Works for RL and SFT trainers (anything with `config` and `step`).
    """
    if existing is None or getattr(existing, "config", None) != config:
        return None
    print(f"Continuing the run of this cell from step {existing.step} (restart the kernel, or change a "
          f"setting, to start a new run).")
    return existing


class TrainingStopped(Exception):
    """Raised by `stop_if_interrupted` after Stop: Jupyter's Run All ends at this cell.

    In Jupyter a cell that raises stops Run All (the kernel drops the queued cells); one that returns
    normally lets the next cells run on a half-trained model. IPython shows an exception's
    `_render_traceback_()` lines instead of a traceback, so the learner reads a short message.
    """

    def __init__(self, step: int) -> None:
        self.step = step
        super().__init__(f"Training stopped at step {step} (Stop was pressed). The model and its history are "
                         f"intact. The cells below have not run. Run this cell again to continue from "
                         f"step {step}, or run the cells below to use the model as it is now.")

    def _render_traceback_(self) -> list[str]:
        return [f"TrainingStopped: {self}"]


def stop_if_interrupted(trainer) -> None:
    """Raise `TrainingStopped` if the trainer's last `train()` ended by Stop (KeyboardInterrupt).

    `train()` itself absorbs the interrupt so the model stays usable; this line, right after it in a
    notebook cell, turns Stop back into an error for Jupyter, so Run All does not carry on as if
    training had finished.
    """
    if getattr(trainer, "stop_reason", None) == "interrupted":
        raise TrainingStopped(trainer.step)
