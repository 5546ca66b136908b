"""Practice: write the core of each algorithm yourself; a checker runs it and names your mistake.

    from rlhf_lab import exercises
    exercises.list_exercises()                     # a table: name, topic, difficulty, minutes
    print(exercises.signature("group_advantages")) # the stub to fill in (shapes, formula, source)
    exercises.check("group_advantages", my_group_advantages)   # PASS, or FAIL + the likely mistake
    exercises.check("group_advantages", my_group_advantages, lang="zh")   # 中文判定
    exercises.set_language("zh")                   # every verdict, title and hint in Chinese from now on
    exercises.hint("group_advantages")             # one hint at a time
    exercises.solution("group_advantages")         # the reference's source, when you give up
    exercises.training.compare_with_reference("gae", my_gae, dict(steps=30))  # your GAE drives PPO
    round_ = exercises.interview_round(k=3)        # a timed round; then round_.finish(globals())
    exercises.interview_round(k=3, blind=True)     # the questions only, no formulas: recall them

Each checker first checks the signature, then runs published test vectors (from the papers, TRL and
transformers) and seeded random cases against the reference solution (the package's own function
wherever it has one), each under a time limit. On a mismatch it says what is wrong with the output's
type or shape, matches your outputs against a catalogue of known-wrong variants (and pairs of them)
to say which mistake(s) you most likely made, or which part of the failures a mistake explains, and
prints the smallest failing case as a call you can paste and re-run.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from . import coding, mechanisms, preference, rl, training
from .coding import FixedWidthInt
from .core import (
    DIFFICULTIES,
    LANGUAGES,
    Case,
    CheckResult,
    Exercise,
    Mistake,
    get_language,
    resolve_language,
    set_language,
    values_agree,
)
from .interview import InterviewRound, interview_round

EXERCISES: dict[str, Exercise] = {
    exercise.name: exercise
    for module in (rl, mechanisms, preference, coding) for exercise in module.EXERCISES
}


def get(name: str) -> Exercise:
    """The exercise called `name` (see list_exercises())."""
    if name not in EXERCISES:
        raise ValueError(f"exercise must be one of {tuple(EXERCISES)}, got {name!r}")
    return EXERCISES[name]


def list_exercises(topic: str | None = None, lang: str | None = None):
    """A pandas DataFrame of the exercises (name, title in `lang`, topic, difficulty, minutes, mistakes)."""
    import pandas as pd

    rows = [dict(name=e.name, title=e.title_in(lang), topic=e.topic, difficulty=e.difficulty,
                 minutes=e.minutes, mistakes_catalogued=len(e.mistakes)) for e in EXERCISES.values()
            if topic is None or e.topic == topic]
    return pd.DataFrame(rows)


def check(name: str, function: Callable, seed: int = 0, lang: str | None = None,
          time_limit: float | None = None) -> CheckResult:
    """Check `function` against exercise `name`. The result prints as PASS/FAIL with the named mistake,
    in `lang` ("en" or "zh"; default: set_language's). `time_limit`: seconds per case."""
    return get(name).check(function, seed=seed, lang=lang, time_limit=time_limit)


def signature(name: str) -> str:
    """The stub to fill in: def line and docstring (shapes, formula, source)."""
    return get(name).signature


def hint(name: str, number: int = 1, lang: str | None = None) -> str:
    """Hint `number` (1, 2, ...) of exercise `name`, in `lang` (default: set_language's)."""
    lang = resolve_language(lang)
    hints = get(name).hints_in(lang)
    if not 1 <= number <= len(hints):
        raise ValueError(f"number must be in 1..{len(hints)} for {name!r}, got {number}")
    label = "提示" if lang == "zh" else "Hint"
    separator = "：" if lang == "zh" else ": "
    return f"{label} {number}/{len(hints)}{separator}{hints[number - 1]}"


def solution(name: str) -> str:
    """The reference solution's source code (the package's function where it has one)."""
    return inspect.getsource(get(name).reference)


def reference(name: str) -> Callable:
    """The reference solution itself (to inject, or to compare with)."""
    return get(name).reference


def mistakes(name: str) -> tuple[Mistake, ...]:
    """The catalogue of known mistakes of exercise `name` (each has a wrong `variant` to try)."""
    return get(name).mistakes


__all__ = [
    "DIFFICULTIES", "EXERCISES", "LANGUAGES", "Case", "CheckResult", "Exercise", "FixedWidthInt",
    "InterviewRound", "Mistake", "check", "get", "get_language", "hint", "interview_round", "list_exercises",
    "mistakes", "reference", "set_language", "signature", "solution", "training", "values_agree",
]
