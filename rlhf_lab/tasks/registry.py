"""Task registry: `get_task('addition_cot', digits=2)` builds a task by name."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from rlhf_lab.tasks.addition import AdditionTask
from rlhf_lab.tasks.base import Task
from rlhf_lab.tasks.formats import ANSWER_FIRST, PLAIN, REASONING_FIRST
from rlhf_lab.tasks.sorting import SortTask

# name -> (class, parameters the name fixes). The three addition names share one class and differ
# only in the fixed answer format, so they pose the same problems for the same seed.
TASKS: dict[str, tuple[type[Task], dict[str, Any]]] = {
    "addition": (AdditionTask, {"answer_format": PLAIN}),
    "addition_cot": (AdditionTask, {"answer_format": REASONING_FIRST}),
    "addition_answer_first": (AdditionTask, {"answer_format": ANSWER_FIRST}),
    "sort": (SortTask, {}),
}


def get_task(name: str, **params: Any) -> Task:
    """Build the task `name` with its parameters, e.g. get_task('addition', digits=3).

    Raises ValueError for an unknown name, an unknown or fixed parameter, or an invalid value.
    """
    if name not in TASKS:
        raise ValueError(f"name must be one of {', '.join(map(repr, TASKS))}, got {name!r}")
    cls, fixed = TASKS[name]
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]  # every registered class is a dataclass
    allowed = [field.name for field in fields if field.name not in fixed]
    for key in params:
        if key not in allowed:
            raise ValueError(f"{key} is not a parameter of task {name!r}; allowed: {', '.join(allowed)}")
    factory: Callable[..., Task] = cls
    return factory(**fixed, **params)
