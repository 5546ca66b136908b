"""Reversed multi-digit addition: `047+085=` -> `231` (the digits of 132, least significant first).

Operands: each drawn uniformly from [0, 10^digits) and zero-padded to `digits` characters, so the
units digits of the two operands always sit in the same columns. Arithmetic-transformer papers pad
for the same reason: a tiny model then learns ONE column-wise algorithm. (Without padding, `7+415=`
and `802+93=` put the columns in different places; the lab's tiny model learned the rare
mixed-length cases much more slowly, and RL could not fix them within minutes.)
The sum has up to digits + 1 digits. The problem space is all ordered pairs, 10^(2 * digits)
prompts, numbered `index = a * 10^digits + b`.

The OOD test uses operands with EXACTLY digits + extra digits (both in [10^(d+e-1), 10^(d+e))),
so every OOD problem is longer than anything in training.

Three completion formats of the same problems (see formats.py):

    addition               047+085=  ->  231
    addition_cot           047+085=  ->  7+5=12;4+8+1=13;0+0+1=1;>231   reasoning first, then the answer
    addition_answer_first  047+085=  ->  231<7+5=12;4+8+1=13;0+0+1=1;   answer first, then the reasoning
"""

from __future__ import annotations

from dataclasses import dataclass

from rlhf_lab.tasks.base import Example, Task
from rlhf_lab.tasks.formats import (
    ANSWER_FIRST,
    PLAIN,
    REASONING_FIRST,
    check_answer_format,
    render_addition,
    reversed_sum,
)
from rlhf_lab.util.validation import check_number

MAX_DIGITS = 12  # far beyond what the tiny model handles; keeps prompts short for the tokenizer

# The registry name of each format (registry.py builds TASKS from this, so the two cannot disagree).
TASK_NAMES = {PLAIN: "addition", REASONING_FIRST: "addition_cot", ANSWER_FIRST: "addition_answer_first"}


@dataclass(frozen=True)
class AdditionTask(Task):
    """Reversed addition of two operands in [0, 10^digits), written in `answer_format`."""

    digits: int = 3
    answer_format: str = PLAIN  # "plain" | "reasoning_first" | "answer_first"

    def __post_init__(self) -> None:
        check_number("digits", self.digits, low=1, high=MAX_DIGITS, integer=True)
        check_answer_format(self.answer_format)

    @property
    def name(self) -> str:
        return TASK_NAMES[self.answer_format]

    def make_example(self, a: int, b: int) -> Example:
        """The example for `a+b=` in this task's format (any non-negative a, b; zero-padded to `digits`)."""
        return Example(
            prompt=f"{a:0{self.digits}d}+{b:0{self.digits}d}=",
            answer=reversed_sum(a, b),
            completion=render_addition(a, b, self.answer_format, width=self.digits),
        )

    def space_size(self) -> int:
        return 10 ** (2 * self.digits)

    def example_at(self, index: int) -> Example:
        a, b = divmod(index, 10**self.digits)
        return self.make_example(a, b)

    def ood_space_size(self, extra: int = 1) -> int:
        n_operands = 9 * 10 ** (self.digits + extra - 1)  # numbers with exactly digits + extra digits
        return n_operands**2

    def ood_example_at(self, index: int, extra: int = 1) -> Example:
        low = 10 ** (self.digits + extra - 1)
        a_offset, b_offset = divmod(index, 9 * low)
        return self.make_example(low + a_offset, low + b_offset)
