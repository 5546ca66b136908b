"""String formats shared by the task generators and the reward functions.

Everything here is plain string manipulation, so that `rewards.py` (which must never raise on a
model's output) and the task generators (which must produce exactly what the rewards parse) agree
on one definition of each format.

Addition is written with the digits of the SUM reversed (least significant first) and the operands
written normally: `47+85=` -> `231` (47 + 85 = 132). A left-to-right decoder then emits the ones digit
first, which only needs the ones digits of the operands, then the tens digit plus a carry it has just
produced, and so on: the order in which a person adds by hand. A tiny model learns this far more
easily than the usual most-significant-first order (see e.g. Lee et al. 2023, "Teaching Arithmetic
to Small Transformers", arXiv 2307.03381).

Three answer formats ("answer_format"), all over the characters `0-9 + = ; < >`:

    plain            231                       the reversed sum, nothing else
    reasoning_first  7+5=12;4+8+1=13;>231      carry scratchpad, '>', then the reversed sum
    answer_first     231<7+5=12;4+8+1=13;      the reversed sum, '<', then the same scratchpad

The scratchpad has one step per digit position, ones first: `a+b=s;` where a and b are that
position's digits (0 when an operand is shorter) and s = a + b + carry in, written in decimal;
`+1` is written only when a carry comes in. The digits of the reversed sum are the last digits
of the step sums, followed by a final `1` if the last step carried. Both scratchpad formats hold
exactly the same characters, only the answer moves: this isolates "does thinking before answering
help?" in the data-format experiment.
"""

from __future__ import annotations

import re

from rlhf_lab.util.validation import check_choice

PLAIN = "plain"
REASONING_FIRST = "reasoning_first"
ANSWER_FIRST = "answer_first"
ANSWER_FORMATS = (PLAIN, REASONING_FIRST, ANSWER_FIRST)
AUTO = "auto"  # extraction only: guess the format from the delimiters present

ANSWER_MARK = ">"  # reasoning_first: scratchpad, then '>', then the answer
REASON_MARK = "<"  # answer_first: answer, then '<', then the scratchpad
STEP_END = ";"

# Every character any task writes (prompts and completions). A subset of the tokenizer's CHARS.
TASK_CHARS = "0123456789+=;<>:orst"

_DIGITS = re.compile(r"[0-9]+")
_STEP = r"[0-9]\+[0-9](?:\+1)?=[0-9]{1,2};"
_FORMAT_PATTERNS = {
    PLAIN: re.compile(r"[0-9]+"),
    REASONING_FIRST: re.compile(rf"(?:{_STEP})+>[0-9]+"),
    ANSWER_FIRST: re.compile(rf"[0-9]+<(?:{_STEP})+"),
}
_ADDITION_PROMPT = re.compile(r"([0-9]+)\+([0-9]+)=")


def check_answer_format(answer_format: str, allow_auto: bool = False, field: str = "answer_format") -> None:
    """Raise ValueError naming `field` unless `answer_format` is one of the known formats."""
    check_choice(field, answer_format, ANSWER_FORMATS + ((AUTO,) if allow_auto else ()))


def is_digits(text: str) -> bool:
    """True iff `text` is a non-empty string of ASCII digits ('²' or '٣' do not count)."""
    return _DIGITS.fullmatch(text) is not None


def reversed_sum(a: int, b: int) -> str:
    """The reference answer of `a+b=`: the decimal digits of a + b, least significant first."""
    return str(a + b)[::-1]


def carry_steps(a: int, b: int, width: int = 0) -> list[str]:
    """The scratchpad steps of a + b, ones digit first: 47+85 -> ['7+5=12;', '4+8+1=13;'].

    `width`: the zero-padded operand width of the prompt; one step per column, so 047+085 (width 3)
    -> ['7+5=12;', '4+8+1=13;', '0+0+1=1;'].
    """
    a_digits, b_digits = str(a)[::-1], str(b)[::-1]
    steps, carry = [], 0
    for position in range(max(len(a_digits), len(b_digits), width)):
        da = int(a_digits[position]) if position < len(a_digits) else 0
        db = int(b_digits[position]) if position < len(b_digits) else 0
        total = da + db + carry  # s_i = a_i + b_i + c_i ; c_{i+1} = s_i // 10
        steps.append(f"{da}+{db}{'+1' if carry else ''}={total}{STEP_END}")
        carry = total // 10
    return steps


def render_addition(a: int, b: int, answer_format: str, width: int = 0) -> str:
    """The completion the model should learn to write after the prompt `a+b=` (no EOS); `width` as in
    `carry_steps`."""
    check_answer_format(answer_format)
    answer = reversed_sum(a, b)
    if answer_format == PLAIN:
        return answer
    scratchpad = "".join(carry_steps(a, b, width))
    if answer_format == REASONING_FIRST:
        return f"{scratchpad}{ANSWER_MARK}{answer}"
    return f"{answer}{REASON_MARK}{scratchpad}"


def parse_addition_prompt(prompt: str) -> tuple[int, int] | None:
    """`'47+85='` -> (47, 85); None for anything that is not an addition prompt."""
    match = _ADDITION_PROMPT.fullmatch(prompt)
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2))


def split_completion(completion: str, answer_format: str = AUTO) -> tuple[str, str]:
    """Split a completion into (answer part, scratchpad part); either may be empty or garbage.

    plain: everything is the answer. reasoning_first: answer after the LAST '>', scratchpad before it;
    no '>' means no answer was given yet. answer_first: answer before the FIRST '<', scratchpad after
    it; no '<' means the model skipped the scratchpad, and the whole text is the answer.
    auto: reasoning_first if a '>' is present, else answer_first (which covers plain).
    """
    if answer_format == AUTO:
        answer_format = REASONING_FIRST if ANSWER_MARK in completion else ANSWER_FIRST
    if answer_format == PLAIN:
        return completion, ""
    if answer_format == REASONING_FIRST:
        scratchpad, mark, answer = completion.rpartition(ANSWER_MARK)
        return (answer, scratchpad) if mark else ("", completion)
    if answer_format == ANSWER_FIRST:
        answer, _, scratchpad = completion.partition(REASON_MARK)
        return answer, scratchpad
    check_answer_format(answer_format, allow_auto=True)
    raise AssertionError("unreachable")


def extract_answer(completion: str, answer_format: str = AUTO) -> str | None:
    """The answer digits in a completion, or None if there is no well-formed answer.

    '7+5=12;4+8+1=13;>231' -> '231'; '231<7+5=12;' -> '231'; '231' -> '231'; '23a' -> None; '' -> None.
    """
    answer, _ = split_completion(completion, answer_format)
    return answer if is_digits(answer) else None


def is_well_formed(completion: str, answer_format: str = AUTO) -> bool:
    """True iff the completion has exactly the shape of `answer_format` (auto: of any format).

    Only the shape is checked (digits, step syntax, delimiters), not whether the arithmetic is right.
    """
    check_answer_format(answer_format, allow_auto=True)
    formats = ANSWER_FORMATS if answer_format == AUTO else (answer_format,)
    return any(_FORMAT_PATTERNS[name].fullmatch(completion) is not None for name in formats)
