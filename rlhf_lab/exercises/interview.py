"""A timed interview round: k exercises drawn at random, a countdown, then the checkers' verdicts.

    round_ = exercises.interview_round(k=3, seed=None)   # shows the tasks and starts the clock
    ...write the functions, named as the tasks say, in the next cells...
    round_.finish(globals())                             # verdicts, and the time you took

    exercises.interview_round(k=3, blind=True)           # as in a real interview: the question and the
                                                         # def line only; formulas come from memory
    exercises.interview_round(k=3, lang="zh")            # the tasks and verdicts in Chinese

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

from ..util.validation import check_bool, check_number, check_optional
from .core import CheckResult, Exercise, resolve_language

WORDS = {
    "en": {
        "head": "Interview round: {k} exercises, {budget} (min:s) in total. Write each function under the "
                "name given, then call round_.finish(globals()).",
        "blind": "Blind round: only the questions. Recall the formulas yourself; the checker has them.",
        "task": "{i}. {title} [{difficulty}, ~{minutes} min]",
        "question": "   Question: {question}",
        "returns": "   Returns: {returns}",
        "left": "time left {left} of {budget}",
        "over": "over time by {over} (budget {budget})",
        "started": "Clock started: {status}.",
        "finished": "Finished after {used} of {budget} (min:s)",
        "over_time": " - over time.",
        "in_time": " - in time.",
        "missing": "MISSING {name}: no function called {name!r} was defined.",
        "score": "Score: {passed} of {k} passed.",
        "bar": "time used",
    },
    "zh": {
        "head": "模拟面试：共 {k} 道题，限时 {budget}（分:秒）。按给定的函数名写好每个函数，然后调用 "
                "round_.finish(globals())。",
        "blind": "盲答模式：只给题目，公式要靠自己回忆；判题器里有标准答案。",
        "task": "{i}. {title}［{difficulty}，约 {minutes} 分钟］",
        "question": "   题目：{question}",
        "returns": "   返回：{returns}",
        "left": "剩余 {left}，共 {budget}",
        "over": "已超时 {over}（限时 {budget}）",
        "started": "开始计时：{status}。",
        "finished": "用时 {used}，限时 {budget}（分:秒）",
        "over_time": "，超时了。",
        "in_time": "，在时限内。",
        "missing": "缺少 {name}：没有找到名为 {name!r} 的函数。",
        "score": "得分：{k} 道题通过 {passed} 道。",
        "bar": "已用时间",
    },
}
DIFFICULTY_ZH = {"easy": "简单", "medium": "中等", "hard": "困难"}


def _format_seconds(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 60:d}:{seconds % 60:02d}"


@dataclass
class InterviewRound:
    """k exercises and a time budget. `clock` is injectable so tests need not wait. blind=True shows
    each task's question and def line only (no docstring, so no formula); lang is "en" or "zh"."""

    exercises: list[Exercise]
    budget_seconds: float
    clock: Callable[[], float] = time.monotonic
    blind: bool = False
    lang: str = "en"
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

    @property
    def words(self) -> dict:
        return WORDS[self.lang]

    def tasks_text(self) -> str:
        words = self.words
        lines = [words["head"].format(k=len(self.exercises), budget=_format_seconds(self.budget_seconds))]
        if self.blind:
            lines.append(words["blind"])
        lines.append("")
        for i, exercise in enumerate(self.exercises, 1):
            difficulty = DIFFICULTY_ZH[exercise.difficulty] if self.lang == "zh" else exercise.difficulty
            lines.append(words["task"].format(i=i, title=exercise.title_in(self.lang), difficulty=difficulty,
                                              minutes=exercise.minutes))
            if self.blind:
                lines.append(words["question"].format(question=exercise.question_in(self.lang)))
                unit = exercise.output_unit_zh if self.lang == "zh" else exercise.output_unit
                if exercise.outputs or unit:
                    returns = f"({', '.join(exercise.outputs)})" if exercise.outputs else unit
                    lines.append(words["returns"].format(returns=returns))
                lines.append(exercise.def_line)
            else:
                lines.append(exercise.signature)
            lines.append("")
        return "\n".join(lines)

    def status_text(self) -> str:
        words, budget = self.words, _format_seconds(self.budget_seconds)
        if self.remaining >= 0:
            return words["left"].format(left=_format_seconds(self.remaining), budget=budget)
        return words["over"].format(over=_format_seconds(-self.remaining), budget=budget)

    def show(self, use_widgets: bool | None = None) -> None:
        """Print the tasks; in Jupyter also display a live countdown (a label and a progress bar)."""
        from ..viz.widgets import widgets_available

        print(self.tasks_text())
        if use_widgets is None:
            use_widgets = widgets_available()
        if not use_widgets:
            print(self.words["started"].format(status=self.status_text()))
            return
        import ipywidgets as widgets
        from IPython.display import display

        label = widgets.Label(self.status_text())
        bar = widgets.FloatProgress(value=0.0, min=0.0, max=self.budget_seconds,
                                    description=self.words["bar"])
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
        words = self.words
        lines = [words["finished"].format(used=_format_seconds(self.finished_after),
                                          budget=_format_seconds(self.budget_seconds))
                 + (words["over_time"] if self.finished_after > self.budget_seconds else words["in_time"])]
        for exercise in self.exercises:
            function = namespace.get(exercise.name)
            if not callable(function):
                lines.append(words["missing"].format(name=exercise.name))
                continue
            result = exercise.check(function, lang=self.lang)
            self.results[exercise.name] = result
            lines.append(str(result))
        passed = sum(r.passed for r in self.results.values())
        lines.append(words["score"].format(passed=passed, k=len(self.exercises)))
        text = "\n".join(lines)
        print(text)
        return text


def interview_round(k: int = 3, seed: int | None = None, minutes: float | None = None,
                    topics: tuple[str, ...] | None = None, names: tuple[str, ...] | None = None,
                    use_widgets: bool | None = None, clock: Callable[[], float] = time.monotonic,
                    blind: bool = False, lang: str | None = None) -> InterviewRound:
    """Draw k exercises (from `topics`, or exactly `names`), show them and start the clock.

    minutes: the budget; None = the sum of the exercises' time estimates. seed=None draws a new set
    each time. blind=True shows only each question and its def line, as an interviewer would ask it
    (the stub's docstring holds the formula). lang: "en" or "zh" (default: set_language's).
    """
    from . import EXERCISES

    check_optional(check_number, "minutes", minutes, low=0, low_open=True)
    check_bool("blind", blind)
    lang = resolve_language(lang)
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
    round_ = InterviewRound(chosen, budget, clock=clock, blind=blind, lang=lang)
    round_.show(use_widgets=use_widgets)
    return round_
