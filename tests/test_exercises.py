"""The exercises' checkers: the reference passes, every catalogued mistake is caught and named, the
spec's test vectors hold for the reference, and the helpers behave."""

from __future__ import annotations

import ast
import inspect
import math

import pytest
import torch

from rlhf_lab import exercises
from rlhf_lab.exercises.coding import FixedWidthInt, OperationBudgetExceeded
from rlhf_lab.exercises.core import raises_where_reference_returns

EXERCISES = list(exercises.EXERCISES.values())
MISTAKES = [(e, m) for e in EXERCISES for m in e.mistakes]


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.name)
def test_reference_passes_its_checker(exercise):
    result = exercise.check(exercise.reference)
    assert result.passed, str(result)
    assert str(result).startswith("PASS")


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.name)
def test_reference_matches_the_spec_vectors(exercise):
    vectors = [c for c in exercise.make_cases(0) if c.expected is not None]
    for case in vectors:
        got = exercise.reference(**case.kwargs)
        if isinstance(case.expected, float) and math.isnan(case.expected):
            assert math.isnan(float(got)), case.name
            continue
        expected, got = flat(case.expected), flat(got)
        # spec values are quoted rounded (4-5 decimals): compare at the precision quoted
        assert torch.allclose(got, expected, rtol=0, atol=case.spec_tolerance), (case.name, got, expected)


def flat(value) -> torch.Tensor:
    """Nested tuples/lists of numbers and tensors -> one float64 vector."""
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], (tuple, list, torch.Tensor)):
        return torch.cat([flat(v) for v in value])
    return torch.as_tensor(value, dtype=torch.float64).flatten()


@pytest.mark.parametrize("exercise,mistake", MISTAKES, ids=lambda x: getattr(x, "name", None))
def test_each_catalogued_mistake_is_named(exercise, mistake):
    for form in mistake.all_forms:  # every way of writing the mistake that the catalogue knows
        result = exercise.check(form)
        assert not result.passed
        assert result.certain and mistake.name in result.mistake_names, str(result)
        text = result.text("en")
        assert text.startswith("FAIL") and f"[{mistake.name}]" in text and mistake.message in text
        chinese = result.text("zh")
        assert chinese.startswith("未通过") and f"[{mistake.name}]" in chinese and mistake.zh in chinese


@pytest.mark.parametrize("exercise,mistake", MISTAKES, ids=lambda x: getattr(x, "name", None))
def test_no_catalogued_variant_raises_where_the_reference_returns(exercise, mistake):
    # a variant that raises for a reason of its own (not the mistake's OverflowError, say) is never
    # named: a learner who makes the mistake does not raise that error
    assert raises_where_reference_returns(exercise, mistake) == []


def _top_k_drops_ties_as_first_catalogued(scores, temperature, top_k, top_p):
    """The catalogue's first version of top_k_drops_ties: `argsort(-1, ..., stable=True)` passes dim by
    position, which torch refuses once stable= is given (TypeError), so the mistake could never be named."""
    tempered = scores / temperature
    if top_k:
        order = tempered.argsort(-1, descending=True, stable=True)
        keep = torch.zeros_like(tempered, dtype=torch.bool).scatter(1, order[:, :top_k], True)
        tempered = tempered.masked_fill(~keep, float("-inf"))
    return tempered


def test_the_catalogue_check_catches_a_variant_that_raises():
    exercise = exercises.get("filter_logits")
    broken = exercises.Mistake("top_k_drops_ties", "-", _top_k_drops_ties_as_first_catalogued)
    problems = raises_where_reference_returns(exercise, broken)
    assert problems and all("TypeError" in p for p in problems)
    # and such a variant "matches" any learner whose code raises TypeError: the old false positive
    def filter_logits(scores, temperature, top_k, top_p):
        return scores.topk()  # a TypeError of the learner's own

    learner_with_a_typo = exercises.check("filter_logits", filter_logits)
    assert "top_k_drops_ties" not in learner_with_a_typo.mistake_names


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.name)
def test_exercise_has_what_a_learner_needs(exercise):
    assert exercise.difficulty in exercises.DIFFICULTIES and exercise.minutes >= 1
    assert exercise.hints and exercise.source and exercise.mistakes
    stub = ast.parse(exercise.signature + "\n    ...")  # a def line and a docstring
    function = stub.body[0]
    assert isinstance(function, ast.FunctionDef) and ast.get_docstring(function)
    # cases call by keyword: every argument of the stub is a parameter of the reference
    reference_params = set(inspect.signature(exercise.reference).parameters)
    assert {a.arg for a in function.args.args} <= reference_params
    # different seeds give different random cases, the same seed the same ones
    assert repr(exercise.make_cases(0)) == repr(exercise.make_cases(0))
    assert repr(exercise.make_cases(0)) != repr(exercise.make_cases(1))


def test_unknown_mistake_falls_back_to_the_smallest_failing_case():
    result = exercises.check("cohen_kappa", lambda labels_a, labels_b: 0.25)
    assert not result.passed and not result.mistakes
    text = str(result)
    assert "No catalogued mistake matches" in text and "Smallest failing case 'p_e = 1: undefined'" in text
    assert "cohen_kappa(labels_a=[1, 1, 1], labels_b=[1, 1, 1])" in text


def test_a_raising_function_is_reported_not_propagated():
    def broken(n):
        raise KeyError("oops")

    result = exercises.check("isqrt_newton", broken)
    assert not result.passed and "raised KeyError" in str(result)


def test_fixed_width_int_overflows_and_counts():
    n = FixedWidthInt(2**31 - 1, 32)
    with pytest.raises(OverflowError):
        n + 1
    with pytest.raises(OverflowError):
        1 + n  # reflected operations are checked too
    assert isinstance(n // 2, FixedWidthInt) and n - 1 == 2**31 - 2
    big = FixedWidthInt(2**100, None)
    assert big * big == 2**200  # unbounded
    counter = FixedWidthInt(1, 32, budget=[3])
    counter + 1, counter + 1, counter + 1
    with pytest.raises(OperationBudgetExceeded):
        counter + 1


def test_values_agree_is_scale_relative_and_nan_aware():
    agree = exercises.values_agree
    assert agree(torch.tensor([1000.0, 1.0]), torch.tensor([1000.001, 1.0]))  # 1e-6 relative to 1000
    assert not agree(torch.tensor([1e-3, 0.0]), torch.tensor([1.1e-3, 0.0]))  # 10% of the scale
    assert agree(torch.tensor([math.nan, 1.0]), torch.tensor([math.nan, 1.0]))
    assert not agree(torch.tensor([math.nan, 1.0]), torch.tensor([0.0, 1.0]))
    assert not agree(torch.zeros(2, 3), torch.zeros(3, 2))
    assert not agree(3.0, 3) or agree(3.0, 3)  # numbers compare by value
    assert agree(3, 3) and not agree(True, 1)


def test_helpers_name_the_bad_value():
    with pytest.raises(ValueError, match="exercise must be one of"):
        exercises.get("no_such_exercise")
    with pytest.raises(ValueError, match="number must be in"):
        exercises.hint("cohen_kappa", 99)
    assert exercises.hint("cohen_kappa", 1).startswith("Hint 1/")
    assert exercises.hint("cohen_kappa", 1, lang="zh").startswith("提示 1/")
    with pytest.raises(ValueError, match="lang must be one of"):
        exercises.hint("cohen_kappa", 1, lang="fr")
    assert "def cohen_kappa" in exercises.solution("cohen_kappa")
    table = exercises.list_exercises()
    assert set(table["name"]) == set(exercises.EXERCISES)
    with pytest.raises(ValueError, match="difficulty"):
        exercises.Exercise(name="x", title="x", topic="x", difficulty="trivial", minutes=1, signature="",
                           reference=len, make_cases=lambda seed: [])


@pytest.mark.parametrize("causal", [False, True])
def test_attention_backward_reference_matches_autograd(causal):
    from rlhf_lab.exercises.mechanisms import attention_backward

    g = torch.Generator().manual_seed(3)
    q, k, v, grad_out = (torch.randn(2, 3, 7, 8, generator=g, dtype=torch.float64) for _ in range(4))
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    scores = leaves[0] @ leaves[1].transpose(-1, -2) / 8**0.5
    if causal:
        scores = scores.masked_fill(torch.triu(torch.ones(7, 7, dtype=torch.bool), 1), float("-inf"))
    (torch.softmax(scores, -1) @ leaves[2]).backward(grad_out)
    # float64 on both sides: the two differ only by rounding, ~1e-15 relative to gradients of O(1)
    for by_hand, leaf in zip(attention_backward(q, k, v, grad_out, causal=causal), leaves):
        assert torch.allclose(by_hand, leaf.grad, rtol=1e-10, atol=1e-12)


def test_interview_round_counts_time_and_checks_what_was_written(capsys):
    now = [100.0]
    round_ = exercises.interview_round(names=("cohen_kappa", "isqrt_newton"), minutes=20, use_widgets=False,
                                       clock=lambda: now[0])
    shown = capsys.readouterr().out
    assert "def cohen_kappa" in shown and "def isqrt_newton" in shown and "20:00" in shown
    now[0] += 25 * 60  # 25 minutes later: over time
    text = round_.finish({"cohen_kappa": exercises.reference("cohen_kappa")})
    assert "over time" in text and "25:00" in text
    assert "PASS cohen_kappa" in text and "MISSING isqrt_newton" in text and "Score: 1 of 2" in text
    drawn = exercises.interview_round(k=2, seed=1, topics=("attention",), use_widgets=False)
    assert len(drawn.exercises) == 2 and all(e.topic == "attention" for e in drawn.exercises)
    assert drawn.budget_seconds == 60 * sum(e.minutes for e in drawn.exercises)
    with pytest.raises(ValueError, match="k must satisfy"):
        exercises.interview_round(k=99, use_widgets=False)
