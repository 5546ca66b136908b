"""A timed interview round: k exercises drawn at random, a countdown, then the checkers' verdicts.

    round_ = exercises.interview_round(k=3, seed=None)   # shows the tasks and starts the clock
    ...write the functions, named as the tasks say, in the next cells...
    round_.finish(globals())                             # verdicts, and the time you took

In Jupyter the countdown is a live widget (a label and a bar that fills as time runs out); headless
(a script, CI) the round prints the tasks and the deadline as plain text. The clock never stops
you: `finish` reports the time used against the budget, as an interviewer would.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ..util.validation import check_number, check_optional
from .core import CheckResult, Exercise


def _format_seconds(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 60:d}:{seconds % 60:02d}"


@dataclass
class InterviewRound:
    """k exercises and a time budget. `clock` is injectable so tests need not wait."""

    exercises: list[Exercise]
    budget_seconds: float
    clock: Callable[[], float] = time.monotonic
    started: float = field(init=False)
    results: dict[str, CheckResult] = field(init=False, default_factory=dict)
    finished_after: float | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.started = self.clock()
        self._stop = threading.Event()

    @property
    def elapsed(self) -> float:
        return (self.finished_after if self.finished_after is not None else self.clock() - self.started)

    @property
    def remaining(self) -> float:
        return self.budget_seconds - self.elapsed

    def tasks_text(self) -> str:
        lines = [f"Interview round: {len(self.exercises)} exercises, {_format_seconds(self.budget_seconds)} "
                 "(min:s) in total. Write each function under the name given, then call round_.finish(globals()).",
                 ""]
        for i, exercise in enumerate(self.exercises, 1):
            lines.append(f"{i}. {exercise.title} [{exercise.difficulty}, ~{exercise.minutes} min]")
            lines.append(exercise.signature)
            lines.append("")
        return "\n".join(lines)

    def status_text(self) -> str:
        if self.remaining >= 0:
            return f"time left {_format_seconds(self.remaining)} of {_format_seconds(self.budget_seconds)}"
        return f"over time by {_format_seconds(-self.remaining)} (budget {_format_seconds(self.budget_seconds)})"

    def show(self, use_widgets: bool | None = None) -> None:
        """Print the tasks; in Jupyter also display a live countdown (a label and a progress bar)."""
        from ..viz.widgets import widgets_available

        print(self.tasks_text())
        if use_widgets is None:
            use_widgets = widgets_available()
        if not use_widgets:
            print(f"Clock started: {self.status_text()}.")
            return
        import ipywidgets as widgets
        from IPython.display import display

        label = widgets.Label(self.status_text())
        bar = widgets.FloatProgress(value=0.0, min=0.0, max=self.budget_seconds, description="time used")
        display(widgets.HBox([bar, label]))

        def tick() -> None:  # a daemon thread: it never keeps the kernel alive, and finish() stops it
            while not self._stop.wait(1.0):
                bar.value = min(self.elapsed, self.budget_seconds)
                bar.bar_style = "danger" if self.remaining < 0 else ("warning" if self.remaining < 60 else "")
                label.value = self.status_text()

        threading.Thread(target=tick, daemon=True).start()

    def finish(self, namespace: Mapping[str, object]) -> str:
        """Stop the clock, check every task's function found in `namespace` (e.g. globals()), print and
        return the verdicts."""
        self._stop.set()
        if self.finished_after is None:
            self.finished_after = self.clock() - self.started
        lines = [f"Finished after {_format_seconds(self.finished_after)} of "
                 f"{_format_seconds(self.budget_seconds)} (min:s)"
                 + (" - over time." if self.finished_after > self.budget_seconds else " - in time.")]
        for exercise in self.exercises:
            function = namespace.get(exercise.name)
            if not callable(function):
                lines.append(f"MISSING {exercise.name}: no function called {exercise.name!r} was defined.")
                continue
            result = exercise.check(function)
            self.results[exercise.name] = result
            lines.append(str(result))
        passed = sum(r.passed for r in self.results.values())
        lines.append(f"Score: {passed} of {len(self.exercises)} passed.")
        text = "\n".join(lines)
        print(text)
        return text


def interview_round(k: int = 3, seed: int | None = None, minutes: float | None = None,
                    topics: tuple[str, ...] | None = None, names: tuple[str, ...] | None = None,
                    use_widgets: bool | None = None, clock: Callable[[], float] = time.monotonic) -> InterviewRound:
    """Draw k exercises (from `topics`, or exactly `names`), show them and start the clock.

    minutes: the budget; None = the sum of the exercises' time estimates. seed=None draws a new set
    each time.
    """
    from . import EXERCISES

    check_optional(check_number, "minutes", minutes, low=0, low_open=True)
    if names is not None:
        pool = [EXERCISES[name] for name in names if name in EXERCISES]
        if len(pool) != len(names):
            raise ValueError(f"names must be exercise names from {tuple(EXERCISES)}, got {names!r}")
        chosen = pool
    else:
        pool = [e for e in EXERCISES.values() if topics is None or e.topic in topics]
        check_number("k", k, low=1, high=len(pool), integer=True)
        chosen = random.Random(seed).sample(pool, k)
    budget = 60.0 * (minutes if minutes is not None else sum(e.minutes for e in chosen))
    round_ = InterviewRound(chosen, budget, clock=clock)
    round_.show(use_widgets=use_widgets)
    return round_
