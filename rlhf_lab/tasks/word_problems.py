"""Templated arithmetic word problems in the style of GSM8K, generated locally (no dataset download).

    Mia has 12 apples. She buys 3 bags with 4 apples in each. How many apples does Mia have now?
    -> <think>
       3 * 4 = 12, 12 + 12 = 24
       </think>
       <answer>24</answer>

GSM8K (Cobbe et al. 2021, arXiv 2110.14168) problems take 2 to 8 steps of grade-school arithmetic and
are graded on the final number only; these take two steps, from a handful of templates, so a small
model can learn them in minutes while the reward is the same rule (reasoning.number_answer_reward).

Problem `index` is read in mixed radix: template, name, then the template's numbers, so distinct
indices give distinct prompts. Every answer is a positive integer by construction (divisions divide).
The OOD test draws the first number of each template from (high, high * 10**extra]: bigger numbers,
same templates, and no prompt shared with the training space.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rlhf_lab.tasks.base import Example
from rlhf_lab.tasks.reasoning import (
    ThinkAnswerTask,
    number_answer_reward,
    render_think_answer,
    think_answer_format_reward,
)
from rlhf_lab.util.validation import check_number

INSTRUCTION = " Think inside <think> </think> tags, then give the final number in <answer> </answer> tags."
NAMES = ("Mia", "Leo", "Ava", "Sam", "Zoe", "Ben", "Ana", "Max")


def _buys(a, b, c):
    return a + b * c, f"{b} * {c} = {b * c}, {a} + {b * c} = {a + b * c}"


def _sells(a, b, c):
    return a * b - c, f"{a} * {b} = {a * b}, {a * b} - {c} = {a * b - c}"


def _reads(a, b, c):
    return a * b + c, f"{a} * {b} = {a * b}, {a * b} + {c} = {a * b + c}"


def _shares(a, b, c):  # a = c * q + b: giving b away leaves a multiple of c
    total = c * a + b
    return a, f"{total} - {b} = {total - b}, {total - b} / {c} = {a}"


# (question with {name}, {a}, {b}, {c} (and {total} for shares), solver -> (answer, worked steps), ranges of
# a, b, c)
TEMPLATES = (
    (
        "{name} has {a} apples. {name} buys {b} bags with {c} apples in each. How many apples does {name} "
        "have now?",
        _buys,
        (1, 50),
        (2, 9),
        (2, 9),
    ),
    (
        "A baker makes {a} trays of {b} rolls. {name} buys {c} rolls. How many rolls are left?",
        _sells,
        (2, 9),
        (4, 12),
        (1, 7),
    ),
    (
        "{name} reads {a} pages a day for {b} days, then {c} more pages. How many pages does {name} read in "
        "total?",
        _reads,
        (2, 20),
        (2, 9),
        (1, 30),
    ),
    (
        "{name} has {total} stickers, gives {b} to a friend and shares the rest equally among {c} boxes. "
        "How many stickers go in each box?",
        _shares,
        (2, 12),
        (1, 9),
        (2, 6),
    ),
)


@dataclass(frozen=True)
class WordProblemTask(ThinkAnswerTask):
    """Two-step arithmetic word problems with a think/answer completion."""

    rewards: ClassVar[dict] = {"answer": number_answer_reward, "format": think_answer_format_reward}

    @property
    def name(self) -> str:
        return "word_problems"

    @staticmethod
    def _ranges(template, extra: int):
        (low, high), *rest = template[2:]
        first = (low, high) if extra == 0 else (high + 1, high * 10**extra)
        return [first, *rest]

    def _space(self, extra: int) -> list[int]:
        """Problems per template: names x the sizes of its three ranges."""
        sizes = []
        for template in TEMPLATES:
            count = len(NAMES)
            for low, high in self._ranges(template, extra):
                count *= high - low + 1
            sizes.append(count)
        return sizes

    def _example(self, index: int, extra: int) -> Example:
        number = 0
        for size in self._space(extra):  # which template: subtract the earlier templates' counts
            if index < size:
                break
            index, number = index - size, number + 1
        template = TEMPLATES[number]
        question, solve = template[0], template[1]
        index, name = divmod(index, len(NAMES))
        values = []
        for low, high in self._ranges(template, extra):
            index, offset = divmod(index, high - low + 1)
            values.append(low + offset)
        a, b, c = values
        answer, steps = solve(a, b, c)
        prompt = question.format(name=NAMES[name], a=a, b=b, c=c, total=c * a + b) + INSTRUCTION
        return Example(prompt=prompt, answer=str(answer), completion=render_think_answer(steps, str(answer)))

    def space_size(self) -> int:
        return sum(self._space(0))

    def example_at(self, index: int) -> Example:
        check_number("index", index, low=0, high=self.space_size(), high_open=True, integer=True)
        return self._example(index, 0)

    def ood_space_size(self, extra: int = 1) -> int:
        return sum(self._space(extra))

    def ood_example_at(self, index: int, extra: int = 1) -> Example:
        return self._example(index, extra)
