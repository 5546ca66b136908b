"""The machinery every exercise shares: an exercise, its catalogue of known mistakes, and a checker
that names the mistake it recognises.

How a check works (the ARENA pattern, made systematic):

1. The exercise builds its cases: the published test vectors (values from the papers and TRL/transformers) and
   seeded random inputs.
2. `observe(function, case)` runs a function on one case and returns what is compared: its output
   and, for losses, the gradient it sends back (a ratio not detached from pi_old has the right value
   and the wrong gradient). An exception is an observation too: ("raises", "ZeroDivisionError").
3. The learner's observations are compared with the reference solution's, case by case.
4. On a mismatch, every catalogued wrong variant is run on the same cases. A variant that agrees
   with the learner on every case is named ("likely mistake"); failing that, one that agrees on every
   case the learner got wrong is named as a possible mistake. Otherwise the first failing case is
   shown with the expected and the received values.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..util.validation import check_choice, check_number

DIFFICULTIES = ("easy", "medium", "hard")

# Outputs are compared with a tolerance relative to the reference's scale. 1e-5 is ~84 float32 ulps
# (eps = 1.19e-7): a learner who computes in float64, or sums in another order, differs from the
# float32 reference by a few ulps per operation on these short vectors (<= 64 terms), far below it;
# every catalogued mistake changes the output by more than 1e-3 relative on at least one case.
DEFAULT_TOLERANCE = 1e-5


@dataclass(frozen=True)
class Mistake:
    """A known wrong way to write an exercise.

    name:    short id, e.g. "population_std".
    message: what the learner most likely wrote, and the fix (shown when the checker names it).
    variant: a function with the exercise's signature that makes exactly this mistake.
    """

    name: str
    message: str
    variant: Callable


@dataclass(frozen=True)
class Case:
    """One input. kwargs are passed to the function (deep-copied for each call, so a function that
    writes into its inputs cannot spoil the next call). `expected`, when given, is the published value
    for this input (checked against the reference in the tests, to `spec_tolerance`)."""

    name: str
    kwargs: dict
    expected: Any = None
    spec_tolerance: float = 1e-4


@dataclass
class Exercise:
    """One exercise: what to write, how hard it is, the reference, and how to check it.

    signature: the stub a learner fills in (def line + docstring with shapes, formula and source).
    reference: the solution; the package's own function wherever the package has one.
    make_cases: seed -> cases (published vectors first, then random ones).
    observe:   (function, kwargs) -> dict of what is compared (default: {"output": function(**kwargs)}).
    """

    name: str
    title: str
    topic: str
    difficulty: str
    minutes: int
    signature: str
    reference: Callable
    make_cases: Callable[[int], list[Case]]
    mistakes: tuple[Mistake, ...] = ()
    hints: tuple[str, ...] = ()
    source: str = ""
    observe: Callable[[Callable, dict], dict] | None = None
    tolerance: float = DEFAULT_TOLERANCE

    def __post_init__(self) -> None:
        self.variant_runs: dict[int, list[list[dict]]] = {}  # seed -> each mistake's observations (pure: cached)
        check_choice("difficulty", self.difficulty, DIFFICULTIES)
        check_number("minutes", self.minutes, low=1, integer=True)
        check_number("tolerance", self.tolerance, low=0, low_open=True)

    def run(self, function: Callable, case: Case) -> dict:
        """What `function` gives on `case`: {"output": ...} (or the exercise's observation), or
        {"raises": "ErrorType"} when it raises."""
        kwargs = copy.deepcopy(case.kwargs)
        try:
            if self.observe is not None:
                return self.observe(function, kwargs)
            return {"output": function(**kwargs)}
        except Exception as error:  # the learner's code may raise anything; that is an observation
            return {"raises": type(error).__name__, "message": str(error)}

    def check(self, function: Callable, seed: int = 0) -> CheckResult:
        """Run the checker on `function`. Returns a CheckResult (prints as a verdict)."""
        cases = self.make_cases(seed)
        expected = [self.run(self.reference, case) for case in cases]
        got = [self.run(function, case) for case in cases]
        failing = [i for i in range(len(cases)) if not self.agrees(got[i], expected[i])]
        if not failing:
            return CheckResult(self, passed=True, cases=len(cases))
        if seed not in self.variant_runs:
            self.variant_runs[seed] = [[self.run(m.variant, case) for case in cases] for m in self.mistakes]
        likely, possible = [], []
        for mistake, wrong in zip(self.mistakes, self.variant_runs[seed]):
            agree = [self.agrees(got[i], wrong[i]) for i in range(len(cases))]
            if all(agree):
                likely.append(mistake)
            elif all(agree[i] for i in failing):
                possible.append(mistake)
        first = failing[0]
        return CheckResult(
            self, passed=False, cases=len(cases), failed=len(failing), mistakes=likely or possible,
            certain=bool(likely), first_failure=cases[first], expected=expected[first], got=got[first],
        )

    def agrees(self, a: dict, b: dict) -> bool:
        """Same exception type, or outputs equal within the tolerance (see DEFAULT_TOLERANCE)."""
        if ("raises" in a) or ("raises" in b):
            return a.get("raises") == b.get("raises")
        if a.keys() != b.keys():
            return False
        return all(values_agree(a[key], b[key], self.tolerance) for key in a)


def values_agree(got: Any, expected: Any, tolerance: float = DEFAULT_TOLERANCE) -> bool:
    """Tolerant equality for the things exercises return: tensors, numbers, sequences, dicts, None.

    Floats agree when |got - expected| <= tolerance * max(|expected|_max, 1e-3) elementwise: relative
    to the scale of the reference (a loss of 1e3 and one of 1e-2 get the same number of significant
    digits). nan and +-inf agree only with the same value at the same place; shapes must match
    exactly; ints and bools compare exactly.
    """
    if isinstance(expected, torch.Tensor) or isinstance(got, torch.Tensor):
        if not (isinstance(expected, torch.Tensor) and isinstance(got, torch.Tensor)):
            return False
        if got.shape != expected.shape:
            return False
        if not expected.is_floating_point():
            return not got.is_floating_point() and bool(torch.equal(got.cpu(), expected.cpu()))
        got, expected = got.detach().double().cpu(), expected.detach().double().cpu()
        if not torch.equal(torch.isnan(got), torch.isnan(expected)):
            return False
        infinite = torch.isinf(expected) | torch.isinf(got)  # -inf = a filtered token: same places, same sign
        if not torch.equal(got[infinite], expected[infinite]):
            return False
        finite = torch.isfinite(expected) & torch.isfinite(got)
        scale = expected[finite].abs().max().item() if finite.any() else 1.0
        return bool(torch.allclose(got[finite], expected[finite], rtol=0.0, atol=tolerance * max(scale, 1e-3)))
    if isinstance(expected, bool) or isinstance(got, bool):
        return type(got) is type(expected) and got == expected
    if isinstance(expected, int) and not isinstance(got, bool) and isinstance(got, int):
        return int(got) == int(expected)
    if isinstance(expected, float) or isinstance(got, float):
        try:
            return values_agree(torch.tensor(float(got)), torch.tensor(float(expected)), tolerance)
        except (TypeError, ValueError):
            return False
    if isinstance(expected, dict):
        return isinstance(got, dict) and got.keys() == expected.keys() and all(
            values_agree(got[k], expected[k], tolerance) for k in expected)
    if isinstance(expected, (list, tuple)):
        return isinstance(got, (list, tuple)) and len(got) == len(expected) and all(
            values_agree(g, e, tolerance) for g, e in zip(got, expected))
    return got == expected


def _short(value: Any, width: int = 300) -> str:
    if isinstance(value, dict) and "raises" in value:
        return f"raised {value['raises']}: {value.get('message', '')}"[:width]
    if isinstance(value, dict) and set(value) == {"output"}:
        value = value["output"]
    with torch.no_grad():
        text = repr(value)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


@dataclass
class CheckResult:
    """The verdict of one check. `str(result)` is the text a learner reads; `passed`, `mistakes`
    (a list of Mistake, best guesses first) and `certain` (the learner's outputs matched a catalogued
    variant on every case) are for code."""

    exercise: Exercise
    passed: bool
    cases: int
    failed: int = 0
    mistakes: list[Mistake] = field(default_factory=list)
    certain: bool = False
    first_failure: Case | None = None
    expected: Any = None
    got: Any = None

    @property
    def mistake_names(self) -> list[str]:
        return [m.name for m in self.mistakes]

    def __str__(self) -> str:
        title = f"{self.exercise.name} ({self.exercise.title})"
        if self.passed:
            return f"PASS {title}: all {self.cases} cases agree with the reference."
        lines = [f"FAIL {title}: {self.failed} of {self.cases} cases disagree with the reference."]
        if self.mistakes:
            lead = "Likely mistake" if self.certain else "Possible mistake"
            for mistake in self.mistakes:
                lines.append(f"{lead} [{mistake.name}]: {mistake.message}")
        else:
            lines.append("No catalogued mistake matches; compare with the case below.")
        case = self.first_failure
        lines.append(f"First failing case '{case.name}': inputs {_short(case.kwargs)}")
        lines.append(f"  expected {_short(self.expected)}")
        lines.append(f"  got      {_short(self.got)}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)

    def _repr_pretty_(self, printer, cycle) -> None:  # IPython shows the verdict as plain text
        printer.text(str(self))


def spec_cases(vectors: Sequence[tuple[str, dict, Any]], tolerance: float = 1e-4) -> list[Case]:
    """Cases from (name, kwargs, expected) triples with published values (quoted rounded, hence the
    tolerance)."""
    return [Case(name, kwargs, expected, tolerance) for name, kwargs, expected in vectors]
