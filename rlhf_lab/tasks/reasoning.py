"""Think/answer completions and their rule-based rewards (DeepSeek-R1 style), for the reasoning tasks.

A completion reasons inside `<think> </think>` and then gives its final answer inside
`<answer> </answer>` (DeepSeek-R1, arXiv 2501.12948, section 2.2; TinyZero's countdown prompt):

    <think>
    3 * 5 = 15, 15 + 7 = 22
    </think>
    <answer>3 * 5 + 7</answer>

Two rewards, as in R1-Zero's rule-based reward:

    format   1.0 iff the completion is exactly one think block then one answer block (whitespace around
             them allowed), and neither block contains another tag: nested, repeated, unclosed or
             missing tags all give 0.0.
    answer   1.0 iff the content of the LAST <answer> block is right for the task (countdown: a valid
             equation over the given numbers that reaches the target; word problems: the number).
             Judged on the answer block alone, so a right answer in a malformed completion still
             counts: the format reward is what teaches the shape.

Every reward function keeps the contract of `rewards.py`: `(prompt, completion, reference, finished)
-> float` in [0, 1], 0.0 when `finished` is False, and it never raises on a model's output (empty,
garbage, unbalanced tags, a division by zero, a huge power, a 5000-digit number are all just wrong),
in time linear in the completion's length.
"""

from __future__ import annotations

import ast
import re
from decimal import Decimal
from fractions import Fraction
from itertools import islice
from typing import ClassVar

from rlhf_lab.tasks.base import Task

THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE = "<think>", "</think>", "<answer>", "</answer>"
_ANY_TAG = re.compile(r"</?(?:think|answer)>")
_NUMBER = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")


def render_think_answer(thinking: str, answer: str) -> str:
    """The completion a model should write: '<think>\\n{thinking}\\n</think>\\n<answer>{answer}</answer>'."""
    return f"{THINK_OPEN}\n{thinking}\n{THINK_CLOSE}\n{ANSWER_OPEN}{answer}{ANSWER_CLOSE}"


def is_think_answer(completion: str) -> bool:
    """True iff `completion` is one think block then one answer block, with no tag inside either:
    its tags are exactly <think> </think> <answer> </answer>, in that order, with only whitespace
    before, between the blocks and after. (One pass over the text: the same answer as fullmatching
    `\\s*<think>.*?</think>\\s*<answer>.*?</answer>\\s*`, whose backtracking is quadratic.)"""
    tags = list(islice(_ANY_TAG.finditer(completion), 5))  # a fifth tag already means no
    if [tag.group() for tag in tags] != [THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE]:
        return False
    before, between, after = (completion[: tags[0].start()], completion[tags[1].end(): tags[2].start()],
                              completion[tags[3].end():])
    return all(not part or part.isspace() for part in (before, between, after))


def extract_tagged_answer(completion: str) -> str | None:
    """The stripped content of the last <answer>...</answer> block; None if there is none, or if that
    block holds another tag (a nested `<answer><answer>5</answer></answer>` is not an answer).

    Blocks are read left to right, each from an <answer> to the first </answer> after it (what
    `re.findall(r"<answer>(.*?)</answer>")` finds), with `str.find`: linear in the length of the
    text, where the regex is quadratic on a text of many unclosed <answer> tags."""
    last, start = None, 0
    while (open_at := completion.find(ANSWER_OPEN, start)) != -1:
        close_at = completion.find(ANSWER_CLOSE, open_at + len(ANSWER_OPEN))
        if close_at == -1:
            break  # no block closes after this <answer>, so none after a later one either
        last = (open_at + len(ANSWER_OPEN), close_at)
        start = close_at + len(ANSWER_CLOSE)
    if last is None or _ANY_TAG.search(completion, *last):
        return None
    return completion[last[0]: last[1]].strip()


def think_answer_format_reward(prompt: str, completion: str, reference: str, finished: bool = True) -> float:
    """1.0 iff the model finished and the completion has the think/answer shape (see module docstring)."""
    return 1.0 if finished and isinstance(completion, str) and is_think_answer(completion) else 0.0


# ---------------------------------------------------------------------------------------- countdown

_EQUATION_CHARS = re.compile(r"[0-9+\-*/().\s]+")
MAX_EQUATION_CHARS = 200  # longer answers are not equations over a handful of numbers


def evaluate_equation(text: str) -> tuple[Fraction, list[int]] | None:
    """Exact value of an arithmetic expression over integers with + - * / and parentheses, and the
    integers it uses, left to right; None for anything else (a name, a power, a division by zero...).

    '(1 + 2) / 3' -> (Fraction(1), [1, 2, 3]). Parsed with `ast`, never `eval`ed, and computed with
    fractions, so 7 / 3 * 3 is exactly 7 (TinyZero evaluates in floats with a 1e-5 tolerance).
    """
    if not text or len(text) > MAX_EQUATION_CHARS or not _EQUATION_CHARS.fullmatch(text):
        return None
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError):
        return None
    numbers: list[int] = []
    operators = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
                 ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b}

    def value(node) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            numbers.append(node.value)
            return Fraction(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in operators:
            left, right = value(node.left), value(node.right)  # left first: numbers in reading order
            return operators[type(node.op)](left, right)
        raise ValueError(f"not allowed in an equation: {type(node).__name__}")

    try:
        return value(tree.body), numbers
    except (ValueError, ZeroDivisionError):
        return None


def parse_countdown_prompt(prompt: str) -> tuple[list[int], int] | None:
    """'Using the numbers [3, 5, 7], create an equation that equals 22. ...' -> ([3, 5, 7], 22)."""
    match = re.search(r"numbers \[([0-9, ]+)\].*?equals (-?[0-9]+)", prompt, re.DOTALL)
    if match is None:
        return None
    return [int(n) for n in match.group(1).split(",") if n.strip()], int(match.group(2))


def countdown_answer_reward(prompt: str, completion: str, reference: str, finished: bool = True) -> float:
    """1.0 iff the answer block is an equation that uses each given number exactly once (TinyZero's
    rule: all of them, no others) and equals the target exactly."""
    if not finished or not isinstance(completion, str):
        return 0.0
    parsed = parse_countdown_prompt(prompt)
    answer = extract_tagged_answer(completion)
    if parsed is None or answer is None:
        return 0.0
    numbers, target = parsed
    equation = evaluate_equation(answer)
    if equation is None:
        return 0.0
    value, used = equation
    return 1.0 if sorted(used) == sorted(numbers) and value == target else 0.0


# ------------------------------------------------------------------------------------ word problems


def number_answer_reward(prompt: str, completion: str, reference: str, finished: bool = True) -> float:
    """1.0 iff the answer block is the reference number (commas, a leading '$' and a final '.' are
    tolerated, as GSM8K graders do: '$1,200.' == '1200')."""
    if not finished or not isinstance(completion, str):
        return 0.0
    answer = extract_tagged_answer(completion)
    if answer is None:
        return 0.0
    cleaned = answer.replace(",", "").removeprefix("$").removesuffix(".").strip()
    if not _NUMBER.fullmatch(cleaned):
        return 0.0
    # Decimal, not Fraction or int: exact, and without Python's 4300-digit limit on int("...")
    return 1.0 if Decimal(cleaned) == Decimal(reference) else 0.0


class ThinkAnswerTask(Task):
    """Base of the tasks whose completions are `<think>...</think><answer>...</answer>`.

    Subclasses set `rewards` ({"answer": their answer rule, "format": think_answer_format_reward}).
    The default RL reward is answer + 0.1 * format: a well-formed wrong answer earns 0.1, as in
    TinyZero (DeepSeek-R1 adds its two rewards; their weights are not published). Accuracy is the
    answer rule alone.
    """

    answer_format: ClassVar[str] = "think_answer"
    chars: ClassVar[str | None] = None  # free text: needs a BPE tokenizer, not the character one
    default_reward: ClassVar[dict[str, float]] = {"answer": 1.0, "format": 0.1}
    accuracy_reward: ClassVar[str] = "answer"

    def extract_answer(self, completion: str) -> str | None:
        return extract_tagged_answer(completion)
