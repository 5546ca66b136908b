"""rlhf_lab.teach.notebook's helpers for training cells: a re-run cell continues its run, Stop ends Run All
with a short message, and the FAST note prints only in FAST mode."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from rlhf_lab.teach.notebook import FAST_NOTE, TrainingStopped, continue_run, fast_note, stop_if_interrupted
from rlhf_lab.train.loop import TrainingLoop


@dataclass
class LoopConfig:
    steps: int = 6
    time_budget: float | None = None
    eval_every: int = 0


class CountingLoop(TrainingLoop):
    """The smallest TrainingLoop: a step adds a row; `interrupt_at` raises KeyboardInterrupt (Stop) there."""

    def __init__(self, config: LoopConfig, interrupt_at: int | None = None):
        self.config = config
        self.init_loop()
        self.interrupt_at = interrupt_at

    def evaluate(self) -> float:
        return 0.0

    def _snapshot(self):
        return None

    def _restore(self, snapshot) -> None:
        pass

    def _step(self) -> dict:
        if self.step + 1 == self.interrupt_at:
            self.interrupt_at = None  # the learner presses Stop once
            raise KeyboardInterrupt
        self.step += 1
        self.train_time += 1.0
        return {"step": self.step, "wall_time": self.train_time}


def run_cell(namespace: dict, config: LoopConfig, interrupt_at: int | None = None) -> None:
    """What 00_welcome's training cell does, with `namespace` as the notebook's globals."""
    trainer = continue_run(namespace.get("trainer"), config) or CountingLoop(config, interrupt_at)
    namespace["trainer"] = trainer
    trainer.train()
    stop_if_interrupted(trainer)


def test_stop_then_rerun_continues_from_the_same_step(capsys):
    namespace: dict = {}
    with pytest.raises(TrainingStopped) as stopped:
        run_cell(namespace, LoopConfig(steps=6), interrupt_at=4)
    first = namespace["trainer"]
    assert first.step == 3 and first.stop_reason == "interrupted" and stopped.value.step == 3
    lines = stopped.value._render_traceback_()
    assert lines == [f"TrainingStopped: {stopped.value}"] and "step 3" in lines[0]  # no traceback, one line
    assert "interrupted after step 3; model and history are intact" in capsys.readouterr().out

    run_cell(namespace, LoopConfig(steps=6))  # the learner runs the cell again
    assert namespace["trainer"] is first and first.step == 9 and first.stop_reason == "steps"
    assert first.history["step"].tolist() == list(range(10))  # one history, no restart at 0
    assert "Continuing the run of this cell from step 3" in capsys.readouterr().out


def test_a_changed_setting_starts_a_new_run(capsys):
    namespace: dict = {}
    run_cell(namespace, LoopConfig(steps=2))
    first = namespace["trainer"]
    run_cell(namespace, LoopConfig(steps=3))
    assert namespace["trainer"] is not first and namespace["trainer"].step == 3
    assert "Continuing" not in capsys.readouterr().out
    assert continue_run(None, LoopConfig()) is None


def test_stop_if_interrupted_lets_finished_runs_pass():
    stop_if_interrupted(CountingLoop(LoopConfig()))  # never trained: stop_reason None
    for reason in ("steps", "time_budget", "non_finite", "stop_at_accuracy"):
        loop = CountingLoop(LoopConfig())
        loop.stop_reason = reason
        stop_if_interrupted(loop)  # raises nothing: only Stop ends Run All
    loop.stop_reason = "interrupted"
    with pytest.raises(TrainingStopped):
        stop_if_interrupted(loop)


def test_fast_note_prints_only_in_fast_mode(capsys):
    assert fast_note(fast=False) is None and capsys.readouterr().out == ""
    assert fast_note(fast=True) == FAST_NOTE
    assert capsys.readouterr().out.strip() == FAST_NOTE and "FAST mode" in FAST_NOTE


class StopWhileStarting:
    """A callback whose on_train_begin is interrupted (Stop while a dashboard draws its first frame)."""

    def __init__(self):
        self.ended = False

    def on_train_begin(self, trainer):
        raise KeyboardInterrupt

    def on_train_end(self, trainer):
        self.ended = True


def test_stop_while_a_callback_starts_ends_train_cleanly(capsys):
    loop = CountingLoop(LoopConfig(steps=3))
    callback = StopWhileStarting()
    loop.add_callback(callback)
    loop.train()  # no KeyboardInterrupt escapes
    assert loop.stop_reason == "interrupted" and loop.step == 0 and callback.ended
    assert "interrupted after step 0; model and history are intact" in capsys.readouterr().out
