"""Countdown and word problems in think/answer form: generation, and rewards robust to malformed output."""

from __future__ import annotations

from fractions import Fraction

import pytest

from rlhf_lab.tasks import (
    countdown_answer_reward,
    extract_tagged_answer,
    get_task,
    is_think_answer,
    number_answer_reward,
    think_answer_format_reward,
)
from rlhf_lab.tasks.countdown import PROMPT as COUNTDOWN_PROMPT
from rlhf_lab.tasks.reasoning import evaluate_equation, parse_countdown_prompt

PROMPT = COUNTDOWN_PROMPT.format(numbers=[3, 5, 7], target=22)
GOOD = "<think>\n3 * 5 = 15, 15 + 7 = 22\n</think>\n<answer>3 * 5 + 7</answer>"


def test_countdown_prompt_is_tinyzeros_and_parses():
    assert parse_countdown_prompt(PROMPT) == ([3, 5, 7], 22)
    assert "Show your work in <think> </think> tags" in PROMPT
    assert "each number can only be used once" in PROMPT


@pytest.mark.parametrize("completion,answer,format_ok", [
    (GOOD, 1.0, 1.0),                                                                   # correct
    ("<think>x</think><answer>(7 + 5) * 3 - 14</answer>", 0.0, 1.0),                     # uses 14: not given
    ("<think>x</think>\n<answer>3 * 5 + 6</answer>", 0.0, 1.0),                          # wrong: 21
    ("<think>x</think><answer>3 * 5 + 7 + 0</answer>", 0.0, 1.0),                        # extra number
    ("<think>x</think><answer>5 * 3 + 7</answer>", 1.0, 1.0),                            # any order
    ("<think>x</think><answer>7 / (1 / 3) + 1</answer>", 0.0, 1.0),                      # numbers not given
    ("<think>x</think><answer>3 * 5 + 7 = 22</answer>", 0.0, 1.0),                       # '=' is not allowed
    # no think: right, malformed
    ("<answer>3 * 5 + 7</answer>", 1.0, 0.0),
    ("<think>x<answer>3 * 5 + 7</answer>", 1.0, 0.0),                                    # unclosed think
    ("<think><think>x</think></think><answer>3 * 5 + 7</answer>", 1.0, 0.0),             # nested think
    ("<think>x</think><answer><answer>3 * 5 + 7</answer></answer>", 0.0, 0.0),           # nested answer
    # two answers: the last
    ("<think>x</think><answer>1</answer><answer>3 * 5 + 7</answer>", 1.0, 0.0),
    # code is not an equation
    ("<think>x</think><answer>__import__('os')</answer>", 0.0, 1.0),
    ("<think>x</think><answer>7 ** 99999 + 3 - 5</answer>", 0.0, 1.0),                   # a power is refused
    ("<think>x</think><answer>7 / (5 - 5) + 3</answer>", 0.0, 1.0),                      # division by zero
    ("", 0.0, 0.0),                                                                      # empty
    ("3 * 5 + 7", 0.0, 0.0),                                                             # no tags
    ("<think></think><answer></answer>", 0.0, 1.0),                                      # empty blocks
])
def test_countdown_rewards(completion, answer, format_ok):
    assert countdown_answer_reward(PROMPT, completion, "22") == answer
    assert think_answer_format_reward(PROMPT, completion, "22") == format_ok
    assert countdown_answer_reward(PROMPT, completion, "22", finished=False) == 0.0  # cut off: not an answer
    assert think_answer_format_reward(PROMPT, completion, "22", finished=False) == 0.0


def test_equations_are_exact_and_safe():
    assert evaluate_equation("7 / 3 * 3") == (Fraction(7), [7, 3, 3])  # floats would give 7.000000000000001
    assert evaluate_equation("(1 + 2) / 3") == (Fraction(1), [1, 2, 3])
    for bad in ("", "x", "1 +", "2 ** 3", "-3 + 1", "1 // 2", "9" * 300, "(" * 50 + "1" + ")" * 50 + "+"):
        assert evaluate_equation(bad) is None, bad


@pytest.mark.parametrize("completion,answer", [
    ("<think>a</think><answer>24</answer>", 1.0),
    ("<think>a</think><answer> $24. </answer>", 1.0),
    ("<think>a</think><answer>24.0</answer>", 1.0),
    ("<think>a</think><answer>1,024</answer>", 0.0),
    ("<think>a</think><answer>about 24</answer>", 0.0),
    ("<think>a</think><answer></answer>", 0.0),
    ("24", 0.0),
    ("<answer><answer>24</answer></answer>", 0.0),
])
def test_word_problem_answer_reward(completion, answer):
    assert number_answer_reward("q", completion, "24") == answer


def test_extraction_and_format_helpers():
    assert extract_tagged_answer(GOOD) == "3 * 5 + 7"
    assert extract_tagged_answer("<answer> 5 </answer> trailing") == "5"
    assert extract_tagged_answer("<answer>5") is None
    assert is_think_answer("  <think>a</think>\n\n<answer>b</answer>\n")
    assert not is_think_answer("<think>a</think><answer>b</answer> and more")


@pytest.mark.parametrize("name", ["countdown", "word_problems"])
def test_generated_problems_are_solved_by_their_completions(name):
    task = get_task(name)
    train, test = task.make_split(seed=2, n_train=300, n_test=100)
    ood = task.make_ood_test(seed=2, n_test=50)
    for example in train + test + ood:
        assert is_think_answer(example.completion)
        assert task.score(example.prompt, example.completion, example.answer) == 1.0
        assert task.reward(example.prompt, example.completion, example.answer) == pytest.approx(1.1)
        assert int(example.answer) > 0
    assert task.make_split(seed=2, n_train=300, n_test=100) == (train, test)  # deterministic


def test_countdown_targets_are_reachable_and_in_range():
    task = get_task("countdown", num_numbers=4, max_number=25, max_target=200)
    train, _ = task.make_split(seed=0, n_train=200, n_test=0)
    for example in train:
        numbers, target = parse_countdown_prompt(example.prompt)
        assert len(numbers) == 4 and all(1 <= n <= 25 for n in numbers)
        value, used = evaluate_equation(extract_tagged_answer(example.completion))
        assert value == target and sorted(used) == sorted(numbers)
    assert sum(1 <= int(e.answer) <= 200 for e in train) >= 190  # the sum fallback is rare
    with pytest.raises(ValueError, match="num_numbers"):
        get_task("countdown", num_numbers=1)
