"""Task registry: `get_task('addition_cot', digits=2)` builds a task by name."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from rlhf_lab.tasks.addition import TASK_NAMES as ADDITION_TASK_NAMES
from rlhf_lab.tasks.addition import AdditionTask
from rlhf_lab.tasks.base import Task
from rlhf_lab.tasks.countdown import CountdownTask
from rlhf_lab.tasks.sorting import SortTask
from rlhf_lab.tasks.word_problems import WordProblemTask
from rlhf_lab.util.validation import check_choice

# name -> (class, parameters the name fixes). The three addition names ("addition", "addition_cot",
# "addition_answer_first", named in addition.py) share one class and differ only in the fixed answer
# format, so they pose the same problems for the same seed.
TASKS: dict[str, tuple[type[Task], dict[str, Any]]] = {
    **{name: (AdditionTask, {"answer_format": answer_format})
       for answer_format, name in ADDITION_TASK_NAMES.items()},
    "sort": (SortTask, {}),
    "countdown": (CountdownTask, {}),  # think/answer tasks: free text, for a BPE tokenizer (hf_tokenizer.py)
    "word_problems": (WordProblemTask, {}),
}


def task_names() -> tuple[str, ...]:
    """The registered task names, sorted: what a config's `task` may be."""
    return tuple(sorted(TASKS))


def get_task(name: str, **params: Any) -> Task:
    """Build the task `name` with its parameters, e.g. get_task('addition', digits=3).

    Raises ValueError for an unknown name, an unknown or fixed parameter, or an invalid value.
    """
    check_choice("name", name, tuple(TASKS))
    cls, fixed = TASKS[name]
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]  # every registered class is a dataclass
    allowed = [field.name for field in fields if field.name not in fixed]
    for key in params:
        if key not in allowed:
            raise ValueError(f"{key} is not a parameter of task {name!r}; allowed: {', '.join(allowed)}")
    factory: Callable[..., Task] = cls
    return factory(**fixed, **params)
