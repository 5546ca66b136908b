"""Sorting a list of digits: `sort:31940=` -> `01349`, with a graded reward.

Lists have exactly `length` digits, each uniform in 0-9 (repeats allowed), written without
separators. The space is all 10^length lists, numbered by reading the list as a base-10 number
with leading zeros. The OOD test uses lists `extra` digits longer.

The default RL reward is partial credit, the fraction of positions holding the right digit
(`sort:31940=` answered `01394` scores 3/5), so a half-sorted answer earns half the reward: a
denser signal than addition's all-or-nothing exact match.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rlhf_lab.tasks.base import Example, Task
from rlhf_lab.tasks.formats import PLAIN
from rlhf_lab.util.validation import check_number

MAX_LENGTH = 20
PROMPT_PREFIX = "sort:"


@dataclass(frozen=True)
class SortTask(Task):
    """Sort `length` digits ascending."""

    length: int = 5

    answer_format: ClassVar[str] = PLAIN
    default_reward: ClassVar[dict[str, float]] = {"partial": 1.0}

    def __post_init__(self) -> None:
        check_number("length", self.length, low=1, high=MAX_LENGTH, integer=True)

    @property
    def name(self) -> str:
        return "sort"

    def make_example(self, digits: str) -> Example:
        """The example for one unsorted digit string, e.g. '31940'."""
        answer = "".join(sorted(digits))
        return Example(prompt=f"{PROMPT_PREFIX}{digits}=", answer=answer, completion=answer)

    def space_size(self) -> int:
        return 10**self.length

    def example_at(self, index: int) -> Example:
        return self.make_example(str(index).zfill(self.length))

    def ood_space_size(self, extra: int = 1) -> int:
        return 10 ** (self.length + extra)

    def ood_example_at(self, index: int, extra: int = 1) -> Example:
        return self.make_example(str(index).zfill(self.length + extra))
