"""Practice: write the core of each algorithm yourself; a checker runs it and names your mistake.

    from rlhf_lab import exercises
    exercises.list_exercises()                     # a table: name, topic, difficulty, minutes
    print(exercises.signature("group_advantages")) # the stub to fill in (shapes, formula, source)
    exercises.check("group_advantages", my_group_advantages)   # PASS, or FAIL + the likely mistake
    exercises.hint("group_advantages")             # one hint at a time
    exercises.solution("group_advantages")         # the reference's source, when you give up
    exercises.training.compare_with_reference("gae", my_gae, dict(steps=30))  # your GAE drives PPO

Each checker runs the spec's test vectors and seeded random cases against the reference solution
(the package's own function wherever it has one) and, on a mismatch, matches your outputs against a
catalogue of known-wrong variants to say which mistake you most likely made.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from . import coding, mechanisms, preference, rl, training
from .core import DIFFICULTIES, Case, CheckResult, Exercise, Mistake, values_agree

EXERCISES: dict[str, Exercise] = {
    exercise.name: exercise for module in (rl, mechanisms, preference, coding) for exercise in module.EXERCISES
}


def get(name: str) -> Exercise:
    """The exercise called `name` (see list_exercises())."""
    if name not in EXERCISES:
        raise ValueError(f"exercise must be one of {tuple(EXERCISES)}, got {name!r}")
    return EXERCISES[name]


def list_exercises(topic: str | None = None):
    """A pandas DataFrame of the exercises (name, title, topic, difficulty, minutes, mistakes)."""
    import pandas as pd

    rows = [dict(name=e.name, title=e.title, topic=e.topic, difficulty=e.difficulty, minutes=e.minutes,
                 mistakes_catalogued=len(e.mistakes)) for e in EXERCISES.values()
            if topic is None or e.topic == topic]
    return pd.DataFrame(rows)


def check(name: str, function: Callable, seed: int = 0) -> CheckResult:
    """Check `function` against exercise `name`. The result prints as PASS/FAIL with the named mistake."""
    return get(name).check(function, seed=seed)


def signature(name: str) -> str:
    """The stub to fill in: def line and docstring (shapes, formula, source)."""
    return get(name).signature


def hint(name: str, number: int = 1) -> str:
    """Hint `number` (1, 2, ...) of exercise `name`."""
    hints = get(name).hints
    if not 1 <= number <= len(hints):
        raise ValueError(f"number must be in 1..{len(hints)} for {name!r}, got {number}")
    return f"Hint {number}/{len(hints)}: {hints[number - 1]}"


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
    "DIFFICULTIES", "EXERCISES", "Case", "CheckResult", "Exercise", "Mistake", "check", "get", "hint",
    "list_exercises", "mistakes", "reference", "signature", "solution", "values_agree",
]
