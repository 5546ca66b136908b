"""Reward functions: exact values on correct, wrong, partial, malformed and unfinished completions."""

from __future__ import annotations

import math
import random

import pytest

from rlhf_lab.tasks import (
    REWARDS,
    combine,
    correctness_reward,
    extract_answer,
    format_reward,
    get_reward,
    get_task,
    partial_credit_reward,
    score_batch,
    steps_reward,
)
from rlhf_lab.text.tokenizer import CHARS

PROMPT, ANSWER = "47+85=", "231"  # 47 + 85 = 132, reversed: 231
COT = "7+5=12;4+8+1=13;>231"
FIRST = "231<7+5=12;4+8+1=13;"
GARBAGE = ["", " ", "abc", "231 ", " 231", "-231", "23a", "2.31", "231\n", "²³¹", "２３１"]
GARBAGE += ["<eos>", ">", "<", ";;", "231>", "<231"]


@pytest.mark.parametrize("name", list(REWARDS))
@pytest.mark.parametrize("completion", GARBAGE)
def test_malformed_and_empty_completions_get_zero_never_raise(name, completion):
    for answer_format in ("auto", "plain", "reasoning_first", "answer_first"):
        reward = get_reward(name, answer_format)
        assert reward(PROMPT, completion, ANSWER, True) == 0.0, (name, completion, answer_format)


@pytest.mark.parametrize("name", list(REWARDS))
def test_missing_eos_gives_zero_for_every_reward(name):
    for completion in (COT, FIRST) if name == "steps" else (ANSWER, COT, FIRST):
        assert REWARDS[name](PROMPT, completion, ANSWER, True) > 0.0, "sanity: finished version earns reward"
        assert REWARDS[name](PROMPT, completion, ANSWER, False) == 0.0, f"{name} ignored finished=False"


@pytest.mark.parametrize(
    "name, completion, expected",
    [
        ("correct", ANSWER, 1.0),
        ("correct", "232", 0.0),
        ("correct", "2310", 0.0),
        ("partial", ANSWER, 1.0),
        ("partial", "201", 2 / 3),
        ("partial", "2310", 3 / 4),  # an extra digit costs credit (divide by the longer length)
        ("partial", "23", 2 / 3),
        ("partial", "132", 1 / 3),  # the un-reversed sum only gets its middle digit right
        ("partial", "999", 0.0),
        ("format", ANSWER, 1.0),
        ("format", "999", 1.0),  # well formed, wrong: format does not judge the arithmetic
        ("format", "12a", 0.0),
        ("steps", ANSWER, 0.0),  # plain answers carry no scratchpad
    ],
)
def test_plain_completions(name, completion, expected):
    assert math.isclose(REWARDS[name](PROMPT, completion, ANSWER, True), expected)
    assert math.isclose(get_reward(name, "plain")(PROMPT, completion, ANSWER), expected)


@pytest.mark.parametrize("answer_format, completion", [("reasoning_first", COT), ("answer_first", FIRST)])
def test_both_scratchpad_formats_score_like_the_bare_answer(answer_format, completion):
    assert extract_answer(completion, answer_format) == ANSWER
    assert extract_answer(completion) == ANSWER  # auto
    for name in ("correct", "partial", "format", "steps"):
        assert get_reward(name, answer_format)(PROMPT, completion, ANSWER) == 1.0
        assert get_reward(name)(PROMPT, completion, ANSWER) == 1.0
    wrong = completion.replace("231", "201")
    assert get_reward("correct", answer_format)(PROMPT, wrong, ANSWER) == 0.0
    assert math.isclose(get_reward("partial", answer_format)(PROMPT, wrong, ANSWER), 2 / 3)
    assert get_reward("format", answer_format)(PROMPT, wrong, ANSWER) == 1.0
    # The other scratchpad format's completion is the wrong shape for this task.
    other = FIRST if completion == COT else COT
    assert get_reward("format", answer_format)(PROMPT, other, ANSWER) == 0.0
    assert get_reward("format", "plain")(PROMPT, completion, ANSWER) == 0.0


def test_scratchpad_extraction_edge_cases():
    assert extract_answer("7+5=12;4+8+1=13;231", "reasoning_first") is None  # no '>': answer never started
    assert extract_answer("7+5=12;>>231", "reasoning_first") == "231"  # the text after the LAST '>'
    assert extract_answer("231", "answer_first") == "231"  # skipped scratchpad: answer still readable
    assert extract_answer("231<<", "answer_first") == "231"
    assert extract_answer("<231", "answer_first") is None
    assert extract_answer(COT, "plain") is None and extract_answer(FIRST, "plain") is None
    assert extract_answer("231<eos>", "plain") is None  # a literal '<eos>' text is not EOS
    assert extract_answer("²³¹", "plain") is None  # ASCII digits only: str.isdigit() would accept these
    assert extract_answer("２３１") is None
    assert format_reward(PROMPT, "231<7+5=12;4+8+1=13", ANSWER, answer_format="answer_first") == 0.0
    assert format_reward(PROMPT, "7+5=12;4+8+1=13;>", ANSWER, answer_format="reasoning_first") == 0.0
    assert format_reward(PROMPT, "7+5=12;4+8+2=14;>231", ANSWER, answer_format="reasoning_first") == 0.0


def test_steps_reward_is_a_process_reward():
    assert steps_reward(PROMPT, "7+5=12;4+8=12;>231", ANSWER) == 0.5  # forgot the carry in step 2
    assert steps_reward(PROMPT, "7+5=12;>231", ANSWER) == 0.5  # a step missing
    assert steps_reward(PROMPT, "7+5=12;4+8+1=13;0+0=0;>231", ANSWER) == 2 / 3  # an extra step
    assert steps_reward(PROMPT, "7+5=12;4+8+1=13>231", ANSWER) == 0.5  # unterminated step is wrong
    assert steps_reward(PROMPT, "231<7+5=12;4+8+1=13;", "231", answer_format="answer_first") == 1.0
    # Right process, wrong final answer: the process reward still pays, correctness does not.
    assert steps_reward(PROMPT, "7+5=12;4+8+1=13;>999", ANSWER) == 1.0
    assert correctness_reward(PROMPT, "7+5=12;4+8+1=13;>999", ANSWER) == 0.0
    assert steps_reward("sort:31940=", "01349", "01349") == 0.0  # not an addition prompt


def test_combine_weights_named_rewards():
    reward = combine({"correct": 1.0, "format": 0.1})
    assert math.isclose(reward(PROMPT, ANSWER, ANSWER, True), 1.1)
    assert math.isclose(reward(PROMPT, "999", ANSWER, True), 0.1)
    assert reward(PROMPT, "nope", ANSWER, True) == 0.0
    assert reward(PROMPT, ANSWER, ANSWER, False) == 0.0
    assert reward.breakdown(PROMPT, "999", ANSWER) == {"correct": 0.0, "format": 1.0}
    graded = combine({"partial": 0.5, "steps": 0.5, "format": -1.0}, answer_format="reasoning_first")
    assert math.isclose(graded(PROMPT, "7+5=12;4+8=12;>201", ANSWER), 0.5 * 2 / 3 + 0.5 * 0.5 - 1.0)
    assert graded(PROMPT, ANSWER, ANSWER) == 0.0  # a bare answer has no '>', so no answer in this format


@pytest.mark.parametrize(
    "weights, answer_format, field",
    [
        ({}, "auto", "weights"),
        ({"correctness": 1.0}, "auto", "weights"),
        ({"correct": float("nan")}, "auto", "weights"),
        ({"correct": "1"}, "auto", "weights"),
        ({"correct": True}, "auto", "weights"),
        ({"correct": 1.0}, "json", "answer_format"),
    ],
)
def test_combine_rejects_bad_settings(weights, answer_format, field):
    with pytest.raises(ValueError, match=field):
        combine(weights, answer_format)


def test_reference_and_type_errors_are_caller_bugs():
    with pytest.raises(ValueError, match="reference"):
        correctness_reward(PROMPT, ANSWER, "")
    with pytest.raises(ValueError, match="reference"):
        partial_credit_reward(PROMPT, ANSWER, COT)  # the full completion passed instead of the answer
    with pytest.raises(TypeError, match="completion"):
        correctness_reward(PROMPT, [2, 3, 1], ANSWER)
    with pytest.raises(ValueError, match="reward name must be one of .*'correct'"):
        get_reward("bleu")
    with pytest.raises(ValueError, match="weights key must be one of .*'partial'"):
        combine({"accuracy": 1.0})
    with pytest.raises(ValueError, match=r"weights\['format'\] must be a number"):
        combine({"format": float("inf")})


def test_score_batch():
    prompts = [PROMPT] * 4
    completions = [ANSWER, "201", COT, ANSWER]
    finished = [True, True, True, False]
    assert score_batch(partial_credit_reward, prompts, completions, [ANSWER] * 4, finished) == pytest.approx(
        [1.0, 2 / 3, 1.0, 0.0]
    )
    assert score_batch(correctness_reward, prompts, completions, [ANSWER] * 4) == [1.0, 0.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="finished"):
        score_batch(correctness_reward, prompts, completions, [ANSWER] * 4, [True])


def test_task_reward_hooks():
    sort = get_task("sort")
    assert math.isclose(sort.reward("sort:31940=", "01394", "01349"), 3 / 5)  # graded by default
    assert sort.score("sort:31940=", "01394", "01349") == 0.0  # accuracy is exact match
    addition = get_task("addition")
    assert addition.reward(PROMPT, "201", ANSWER) == 0.0  # all-or-nothing by default
    assert addition.reward(PROMPT, "231<7+5=12;", ANSWER) == 0.0  # plain task: scratchpad text is garbage
    cot = get_task("addition_cot")
    assert cot.reward(PROMPT, COT, ANSWER) == 1.0 and cot.reward(PROMPT, FIRST, ANSWER) == 0.0
    assert math.isclose(cot.reward_fn({"correct": 1.0, "format": 0.1})(PROMPT, COT, ANSWER), 1.1)


def test_random_strings_never_raise_and_stay_in_range():
    rng = random.Random(0)
    alphabet = CHARS + "\n\t€"
    for _ in range(1500):
        completion = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        for name, reward in REWARDS.items():
            for answer_format in ("auto", "plain", "reasoning_first", "answer_first"):
                value = reward(PROMPT, completion, ANSWER, rng.random() < 0.8, answer_format=answer_format)
                assert 0.0 <= value <= 1.0, (name, completion, value)
