"""The countdown numbers game, as in TinyZero: reach a target with + - * / using each number once.

    Using the numbers [3, 5, 7], create an equation that equals 22. ...   ->   <answer>3 * 5 + 7</answer>

TinyZero (Pan et al. 2025, github.com/Jiayi-Pan/TinyZero) trained Qwen2.5-3B with RL on this game and
saw the model learn to verify and revise ("aha"-style) behaviour. The prompt is TinyZero's; the
completion is in think/answer form (reasoning.py) and the rewards are its rule: the answer must use
every given number exactly once and hit the target.

Problems are generated locally and deterministically. Problem `index` fixes the numbers (index read
in base `max_number`, so distinct indices give distinct number lists, hence distinct prompts); a
random expression over those numbers, seeded by the index, gives a target in [1, max_target] that is
reachable by construction (TinyZero drew targets at random, so some of its problems had no solution).
The OOD test uses `extra` more numbers.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from fractions import Fraction
from typing import ClassVar

from rlhf_lab.tasks.base import Example
from rlhf_lab.tasks.reasoning import (
    ThinkAnswerTask,
    countdown_answer_reward,
    render_think_answer,
    think_answer_format_reward,
)
from rlhf_lab.util.validation import check_number

PROMPT = (
    "Using the numbers {numbers}, create an equation that equals {target}. You can use basic arithmetic "
    "operations (+, -, *, /) and each number can only be used once. Show your work in <think> </think> "
    "tags. And return the final answer in <answer> </answer> tags, for example <answer> (1 + 2) / 3 "
    "</answer>."
)
OPERATORS = "+-*/"


@dataclass(frozen=True)
class CountdownTask(ThinkAnswerTask):
    """Reach a target from `num_numbers` numbers in [1, max_number]."""

    num_numbers: int = 3
    max_number: int = 50
    max_target: int = 100

    rewards: ClassVar[dict] = {"answer": countdown_answer_reward, "format": think_answer_format_reward}

    def __post_init__(self) -> None:
        check_number("num_numbers", self.num_numbers, low=2, high=6, integer=True)
        check_number("max_number", self.max_number, low=2, high=1000, integer=True)
        check_number("max_target", self.max_target, low=1, integer=True)

    @property
    def name(self) -> str:
        return "countdown"

    def make_example(self, numbers: list[int], seed: int = 0) -> Example:
        """The problem for `numbers`, with a target and a worked solution drawn with `seed`."""
        rng = random.Random(f"countdown:{','.join(map(str, numbers))}:{seed}")
        for _ in range(200):  # a random left-to-right expression over a random order of all numbers
            order = rng.sample(numbers, len(numbers))
            value, equation, additive, steps = Fraction(order[0]), str(order[0]), False, []
            for number in order[1:]:
                op = rng.choice(OPERATORS)
                if op == "/" and (value / number).denominator != 1:
                    op = rng.choice("+*")  # keep every intermediate value an integer, as people do
                new = {"+": value + number, "-": value - number, "*": value * number, "/": value / number}[op]
                steps.append(f"{value} {op} {number} = {new}")
                # (a + b) * c needs the parentheses; a + b - c and a * b / c read left to right without.
                left = f"({equation})" if op in "*/" and additive else equation
                value, equation, additive = new, f"{left} {op} {number}", op in "+-"
            if value.denominator == 1 and 1 <= value <= self.max_target:
                break
        else:  # no luck in 200 draws: the sum is always reachable (if above max_target, so be it)
            value = Fraction(sum(numbers))
            equation = " + ".join(map(str, numbers))
            steps = [f"{equation} = {value}"]
        prompt = PROMPT.format(numbers=list(numbers), target=int(value))
        completion = render_think_answer(", ".join(steps), equation)
        return Example(prompt=prompt, answer=str(int(value)), completion=completion)

    def _numbers_at(self, index: int, count: int) -> list[int]:
        numbers = []
        for _ in range(count):  # index in base max_number, one digit per number
            index, digit = divmod(index, self.max_number)
            numbers.append(digit + 1)
        return numbers

    def space_size(self) -> int:
        return self.max_number**self.num_numbers

    def example_at(self, index: int) -> Example:
        return self.make_example(self._numbers_at(index, self.num_numbers))

    def ood_space_size(self, extra: int = 1) -> int:
        return self.max_number ** (self.num_numbers + extra)

    def ood_example_at(self, index: int, extra: int = 1) -> Example:
        return self.make_example(self._numbers_at(index, self.num_numbers + extra))

