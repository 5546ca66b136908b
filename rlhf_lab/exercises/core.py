"""The machinery every exercise shares: an exercise, its catalogue of known mistakes, and a checker
that diagnoses what a learner wrote, in English or in Chinese.

How a check works (the ARENA pattern, made systematic):

1. The signature comes first. The learner's parameters are compared with the stub's before any case
   runs: a missing or an unexpected argument is named in one line. Renamed arguments (`x` for `n`) are
   accepted and the function is called by position, in the stub's order, with a note.
2. The exercise builds its cases: published test vectors (values from the papers and TRL/transformers)
   and seeded random inputs. `observe(function, case)` runs a function on one case and returns what is
   compared: its output and, for losses, the gradient it sends back (a ratio not detached from pi_old
   has the right value and the wrong gradient). An exception is an observation too. Each case runs
   under a time limit; a loop that never ends is stopped and explained in the exercise's own terms.
3. The learner's observations are compared with the reference solution's, case by case. The type and
   shape of the output are compared first (a scalar where one loss per pair is expected is named as
   such).
4. On a mismatch, every catalogued wrong variant runs on the same cases, and then every pair of
   catalogued mistakes made together. The verdict names, in this order: a mistake that reproduces the
   learner on every case; two mistakes at once that do; a mistake that reproduces every failing case
   (not the passing ones); mistakes that explain a part of the failing cases, saying which part.
5. The smallest failing case is printed in full, as a call that can be pasted and re-run.

A mistake can be matched three ways: one of its `forms` (wrong functions) gives the learner's output;
its `recognise` predicate sees the mistake's mark in the output (a vector where one number per token
is expected); or the line where the learner's code raised matches its `error_line` pattern.
"""

from __future__ import annotations

import ast
import copy
import inspect
import itertools
import math
import re
import signal
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from ..util.validation import check_choice, check_number
from .words import WORDS

DIFFICULTIES = ("easy", "medium", "hard")
LANGUAGES = ("en", "zh")

# Outputs are compared with a tolerance relative to the reference's scale. 1e-5 is ~84 float32 ulps
# (eps = 1.19e-7): a learner who computes in float64, or sums in another order, differs from the
# float32 reference by a few ulps per operation on these short vectors (<= 64 terms), far below it;
# every catalogued mistake changes the output by more than 1e-3 relative on at least one case.
DEFAULT_TOLERANCE = 1e-5

# Every case here takes milliseconds; 5 s is far beyond any honest solution on a slow, shared CPU
# and short enough that a loop that never ends does not look like a hung notebook.
DEFAULT_TIME_LIMIT = 5.0
# After one case ran out of time the others get this long: the diagnosis is made, no need to wait.
AFTER_TIMEOUT_LIMIT = 0.5

_language = {"current": "en"}
# exceptions that mean "did not finish": a time limit, or the coding exercises' operation budget
RUNAWAY = {"CaseTimeout": "runaway", "OperationBudgetExceeded": "runaway"}


def set_language(lang: str) -> None:
    """Language of the checker's verdicts, hints and titles from now on: "en" or "zh" (中文)."""
    check_choice("lang", lang, LANGUAGES)
    _language["current"] = lang


def get_language() -> str:
    """The language set by set_language ("en" unless changed)."""
    return _language["current"]


def resolve_language(lang: str | None) -> str:
    """`lang` if given (checked), else the current language."""
    if lang is None:
        return get_language()
    check_choice("lang", lang, LANGUAGES)
    return lang


class CaseTimeout(BaseException):
    """A case ran past its time limit. A BaseException, so that a learner's `except Exception` inside a
    loop cannot swallow it and keep looping."""


@contextmanager
def time_limit(seconds: float | None):
    """Raise CaseTimeout in the block after `seconds` (wall clock). Works in the main thread of a Unix
    process (a notebook kernel, pytest); elsewhere the block runs without a limit. An outer interval
    timer, if any, is restored afterwards with the time it has left."""
    usable = (seconds is not None and hasattr(signal, "setitimer")
              and threading.current_thread() is threading.main_thread())
    if not usable:
        yield
        return

    def on_alarm(signum, frame):
        raise CaseTimeout(f"more than {seconds:g} s")

    previous_handler = signal.signal(signal.SIGALRM, on_alarm)
    outer_delay, outer_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    start = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_handler)
        if outer_delay:
            signal.setitimer(signal.ITIMER_REAL, max(1e-3, outer_delay - (time.monotonic() - start)),
                             outer_interval)


@dataclass(frozen=True)
class Mistake:
    """A known wrong way to write an exercise.

    name:      short id, e.g. "population_std".
    message:   what the learner most likely wrote, and the fix (English).
    variant:   a function with the exercise's signature that makes exactly this mistake.
    zh:        the same message in Chinese.
    forms:     other functions that make the same mistake (another epsilon, another loop shape).
    raises:    exception names this mistake raises by nature where the reference returns
               (OverflowError for an overflow); any other exception in a variant is a bug of the catalogue.
    recognise: (got, expected, case) -> True where the mistake shows in the output itself; `component`
               is the index of the output it speaks about (for tuple outputs), None for the whole case.
    error_line: a regular expression: a case where the learner's code raised on a line matching it is
               explained by this mistake (e.g. "values[:, :-1]" failing to broadcast).
    """

    name: str
    message: str
    variant: Callable
    zh: str = ""
    forms: tuple[Callable, ...] = ()
    raises: tuple[str, ...] = ()
    recognise: Callable[[dict, dict, Case], bool] | None = None
    component: int | None = None
    error_line: str | None = None

    def text(self, lang: str | None = None) -> str:
        """The message in `lang` (default: the current language)."""
        return self.zh if resolve_language(lang) == "zh" else self.message

    @property
    def all_forms(self) -> tuple[Callable, ...]:
        return (self.variant, *self.forms)


@dataclass(frozen=True)
class Case:
    """One input. kwargs are passed to the function (deep-copied for each call, so a function that
    writes into its inputs cannot spoil the next call). `expected`, when given, is the published value
    for this input (checked against the reference in the tests, to `spec_tolerance`). `name_zh` is the
    case's name in Chinese."""

    name: str
    kwargs: dict
    expected: Any = None
    spec_tolerance: float = 1e-4
    name_zh: str = ""

    def label(self, lang: str) -> str:
        return self.name_zh if lang == "zh" and self.name_zh else self.name


@dataclass
class Exercise:
    """One exercise: what to write, how hard it is, the reference, and how to check it.

    signature: the stub a learner fills in (def line + docstring with shapes, formula and source).
    reference: the solution; the package's own function wherever the package has one.
    make_cases: seed -> cases (published vectors first, then random ones).
    observe:   (function, kwargs) -> dict of what is compared (default: {"output": function(**kwargs)}).
    title_zh, question, question_zh, explanation, explanation_zh, hints_zh: the exercise in both
               languages (the question an interviewer asks; the idea in two sentences).
    combine:   frozenset of two mistake names -> the functions that make both at once (several forms
               allowed), or () where the two cannot be made together. None: only the automatic
               combinations (one mistake per output of a tuple, or one per case) are tried.
    outputs:   names of the outputs when the function returns a tuple, e.g. ("advantages", "returns").
    output_unit, output_unit_zh: what one element of the output is, e.g. "one loss per pair".
    runaway, runaway_zh: what a case that runs out of time (or of operations) most likely means here.
    time_limit: seconds per case.
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
    title_zh: str = ""
    question: str = ""
    question_zh: str = ""
    explanation: str = ""
    explanation_zh: str = ""
    hints_zh: tuple[str, ...] = ()
    combine: Callable[[frozenset], tuple[Callable, ...]] | None = None
    outputs: tuple[str, ...] = ()
    output_unit: str = ""
    output_unit_zh: str = ""
    runaway: str = ""
    runaway_zh: str = ""
    time_limit: float = DEFAULT_TIME_LIMIT

    def __post_init__(self) -> None:
        self.variant_runs: dict[int, dict[str, list[list[dict]]]] = {}  # seed -> name -> forms' observations
        self.combination_runs: dict[int, dict[frozenset, list[list[dict]]]] = {}
        check_choice("difficulty", self.difficulty, DIFFICULTIES)
        check_number("minutes", self.minutes, low=1, integer=True)
        check_number("tolerance", self.tolerance, low=0, low_open=True)
        check_number("time_limit", self.time_limit, low=0, low_open=True)

    # ------------------------------------------------------------------ texts in both languages

    def title_in(self, lang: str | None = None) -> str:
        return self.title_zh if resolve_language(lang) == "zh" and self.title_zh else self.title

    def question_in(self, lang: str | None = None) -> str:
        return self.question_zh if resolve_language(lang) == "zh" and self.question_zh else self.question

    def explanation_in(self, lang: str | None = None) -> str:
        zh = resolve_language(lang) == "zh" and self.explanation_zh
        return self.explanation_zh if zh else self.explanation

    def hints_in(self, lang: str | None = None) -> tuple[str, ...]:
        return self.hints_zh if resolve_language(lang) == "zh" and self.hints_zh else self.hints

    @property
    def def_line(self) -> str:
        """The stub's def line(s), without the docstring: what a blind interview round shows."""
        tree = ast.parse(self.signature + "\n    ...")
        function = tree.body[0]
        lines = self.signature.splitlines()
        body_start = function.body[0].lineno - 1  # the docstring's first line (0-based)
        return "\n".join(lines[:body_start])

    @property
    def parameters(self) -> list[tuple[str, bool]]:
        """The stub's parameters in order: (name, has_default)."""
        function = ast.parse(self.signature + "\n    ...").body[0]
        names = [a.arg for a in function.args.args]
        first_default = len(names) - len(function.args.defaults)
        return [(name, i >= first_default) for i, name in enumerate(names)]

    # ------------------------------------------------------------------ running one case

    def run(self, function: Callable, case: Case, limit: float | None = None) -> dict:
        """What `function` gives on `case`: {"output": ...} (or the exercise's observation), or
        {"raises": "ErrorType", "message": ..., "line": the learner's source line} when it raises."""
        kwargs = copy.deepcopy(case.kwargs)
        try:
            with time_limit(limit):
                if self.observe is not None:
                    return self.observe(function, kwargs)
                return {"output": function(**kwargs)}
        except CaseTimeout:
            return {"raises": "CaseTimeout", "limit": limit}
        except Exception as error:  # the learner's code may raise anything; that is an observation
            return {"raises": type(error).__name__, "message": str(error),
                    "line": _raising_line(function, error)}

    def agrees(self, a: dict, b: dict) -> bool:
        """Same exception type, or outputs equal within the tolerance (see DEFAULT_TOLERANCE). Running out
        of time and running out of operations are the same observation: the function did not finish."""
        if ("raises" in a) or ("raises" in b):
            kind_a, kind_b = a.get("raises"), b.get("raises")
            return RUNAWAY.get(kind_a, kind_a) == RUNAWAY.get(kind_b, kind_b)
        if a.keys() != b.keys():
            return False
        return all(values_agree(a[key], b[key], self.tolerance) for key in a)

    # ------------------------------------------------------------------ the signature

    def adapt(self, function: Callable) -> tuple[Callable | None, list[tuple[str, dict]], tuple | None]:
        """How to call `function` with the cases' keyword arguments.

        Returns (call, notes, problem): `call(**kwargs)` calls the learner's function; notes are
        (key, fields) pairs for the verdict; problem is (key, fields) when the function cannot be
        called with the exercise's arguments at all (then call is None)."""
        stub = self.parameters
        stub_names = [name for name, _ in stub]
        try:
            params = list(inspect.signature(function).parameters.values())
        except (TypeError, ValueError):  # a builtin without a signature: call it as the stub says
            return function, [], None
        kinds = inspect.Parameter
        named = [p for p in params if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY,
                                                 kinds.POSITIONAL_ONLY)]
        positional = [p for p in params if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.POSITIONAL_ONLY)]
        takes_args = any(p.kind == kinds.VAR_POSITIONAL for p in params)
        takes_kwargs = any(p.kind == kinds.VAR_KEYWORD for p in params)
        required = [p.name for p in named if p.default is inspect.Parameter.empty]
        by_keyword = {p.name for p in named if p.kind != kinds.POSITIONAL_ONLY}
        stub_text = f"({', '.join(stub_names)})"

        unexpected = [name for name in required if name not in stub_names]
        missing_required = [name for name, optional in stub if not optional and name not in by_keyword]
        if not unexpected and (not missing_required or takes_kwargs):
            # call by keyword, leaving out the optional arguments the function does not take
            dropped = [] if takes_kwargs else [name for name in stub_names if name not in by_keyword]
            notes = [("dropped", {"names": ", ".join(dropped), "list": dropped})] if dropped else []

            def call(**kwargs):
                return function(**{k: v for k, v in kwargs.items() if k not in dropped})

            call.__wrapped_learner__ = function
            return call, notes, None
        # names differ: call by position in the stub's order, if the arity allows it
        count = len(stub) if takes_args else min(len(stub), len(positional))
        leftover_required = [name for name, optional in stub[count:] if not optional]
        learner_required = sum(1 for p in positional if p.default is inspect.Parameter.empty)
        keyword_only_required = [p.name for p in named if p.kind == kinds.KEYWORD_ONLY
                                 and p.default is inspect.Parameter.empty]
        # a name the stub also has must sit at the stub's position, else this is not a renaming
        same_places = all(p.name not in stub_names or stub_names.index(p.name) == k
                          for k, p in enumerate(positional))
        if not leftover_required and learner_required <= count and not keyword_only_required and same_places:
            renamed = [(p.name, name) for p, (name, _) in zip(positional, stub[:count]) if p.name != name]
            notes = [("by_position", {"renamed": renamed, "stub": stub_text})]
            dropped = [name for name, _ in stub[count:]]
            if dropped:
                notes.append(("dropped", {"names": ", ".join(dropped), "list": dropped}))
            order = stub_names[:count]

            def call(**kwargs):
                return function(*[kwargs[name] for name in order if name in kwargs])

            call.__wrapped_learner__ = function
            return call, notes, None
        yours = f"({', '.join(p.name for p in named)})"
        if unexpected and not missing_required:
            fields = {"names": ", ".join(unexpected), "yours": yours, "stub": stub_text}
            return None, [], ("unexpected", fields)
        absent = [name for name, _ in stub if name not in by_keyword]
        if not any(p.name in stub_names for p in named):  # every name differs: what has no place is missing
            absent = stub_names[len(positional):]
        if len(named) < len(stub) and not takes_args:
            return None, [], ("too_few", {"count": len(named), "yours": yours, "stub_count": len(stub),
                                          "stub": stub_text, "names": ", ".join(absent)})
        return None, [], ("mismatch", {"yours": yours, "stub": stub_text, "names": ", ".join(absent),
                                       "unexpected": ", ".join(unexpected) or "-"})

    # ------------------------------------------------------------------ the check

    def check(self, function: Callable, seed: int = 0, lang: str | None = None,
              time_limit: float | None = None) -> CheckResult:
        """Run the checker on `function`. Returns a CheckResult (prints as a verdict in `lang`, default
        the current language: see set_language). `time_limit` (seconds per case) overrides the
        exercise's."""
        lang = resolve_language(lang)
        limit = self.time_limit if time_limit is None else time_limit
        check_number("time_limit", limit, low=0, low_open=True)
        call, notes, problem = self.adapt(function)
        name = getattr(function, "__name__", self.name)
        if not (isinstance(name, str) and name.isidentifier()):
            name = self.name  # a lambda or a partial: show the exercise's name in the call
        positional = any(key == "by_position" for key, _ in notes)
        if problem is not None:
            return CheckResult(self, passed=False, cases=0, lang=lang, signature_problem=problem,
                               function_name=name)
        cases = self.make_cases(seed)
        expected = [self.run(self.reference, case) for case in cases]
        got = []
        for case in cases:
            timed_out = any(g.get("raises") == "CaseTimeout" for g in got)
            got.append(self.run(call, case, min(limit, AFTER_TIMEOUT_LIMIT) if timed_out else limit))
        failing = [i for i in range(len(cases)) if not self.agrees(got[i], expected[i])]
        base = dict(cases=len(cases), lang=lang, notes=notes, function_name=name, positional=positional)
        if not failing:
            return CheckResult(self, passed=True, **base)
        diagnosis = Diagnosis(self, cases, expected, got, failing, seed)
        return CheckResult(self, passed=False, failed=len(failing), case_list=cases, expected_list=expected,
                           got_list=got, failing=failing, diagnosis=diagnosis, **base)

    # ------------------------------------------------------------------ the catalogue's observations

    def mistake_runs(self, seed: int, cases: list[Case]) -> dict[str, list[list[dict]]]:
        """Each mistake's forms' observations on the cases of `seed` (pure, so cached)."""
        if seed not in self.variant_runs:
            runs = {m.name: [[self.run(form, case) for case in cases] for form in m.all_forms]
                    for m in self.mistakes}
            self.variant_runs[seed] = runs
        return self.variant_runs[seed]

    def combination_forms(self, seed: int, cases: list[Case], pair: frozenset) -> list[list[dict]]:
        """Observations of the functions that make both mistakes of `pair` (exercise.combine)."""
        runs = self.combination_runs.setdefault(seed, {})
        if pair not in runs:
            forms = self.combine(pair) if self.combine is not None else ()
            runs[pair] = [[self.run(form, case) for case in cases] for form in forms]
        return runs[pair]


def _raising_line(function: Callable, error: BaseException) -> str:
    """The source line of the learner's code where `error` was raised (the deepest frame in the file
    that defines `function`), or ""."""
    function = getattr(function, "__wrapped_learner__", function)
    code = getattr(function, "__code__", None)
    if code is None:
        return ""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == code.co_filename]
    return (frames[-1].line or "").strip() if frames else ""


# ----------------------------------------------------------------------------------------------
# the diagnosis


def _components(observation: dict) -> list | None:
    """The outputs of a tuple-returning function, or None for a single output / a raise."""
    output = observation.get("output")
    if "raises" in observation or not isinstance(output, (tuple, list)):
        return None
    return list(output)


@dataclass
class Diagnosis:
    """What the catalogue says about a failed check (computed once, rendered in either language).

    kind: "certain" (one mistake reproduces every case), "pair" (two mistakes together reproduce
    every case), "possible" (a mistake reproduces every failing case), "partial" (mistakes explain
    some failing cases: `covered` lists them), or "none".
    """

    exercise: Exercise
    cases: list[Case]
    expected: list[dict]
    got: list[dict]
    failing: list[int]
    seed: int
    kind: str = "none"
    mistakes: list[Mistake] = field(default_factory=list)
    pairs: list[tuple[Mistake, Mistake]] = field(default_factory=list)
    covered: list[tuple[Mistake, list[int]]] = field(default_factory=list)
    component_sources: list[tuple[int, Mistake | None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        exercise = self.exercise
        if not exercise.mistakes:
            return
        self.runs = exercise.mistake_runs(self.seed, self.cases)
        self.by_name = {m.name: m for m in exercise.mistakes}
        n = len(self.cases)
        self.explains = {m.name: [self._explains(m, i) for i in range(n)] for m in exercise.mistakes}
        self.silent = {m.name: [exercise.agrees(self.runs[m.name][0][i], self.expected[i]) for i in range(n)]
                       for m in exercise.mistakes}
        certain = [m for m in exercise.mistakes if all(self.explains[m.name])]
        if certain:
            self.kind, self.mistakes = "certain", certain
            return
        self.pairs = [pair for pair in itertools.combinations(exercise.mistakes, 2)
                      if self._pair_explains(pair)]
        if self.pairs:
            self.kind = "pair"
            return
        possible = [m for m in exercise.mistakes if all(self.explains[m.name][i] for i in self.failing)]
        if possible:
            self.kind, self.mistakes = "possible", possible
            return
        self._partial()

    # a mistake explains case i: a form reproduces it, or its mark is seen in the output
    def _explains(self, mistake: Mistake, i: int) -> bool:
        got, expected, case = self.got[i], self.expected[i], self.cases[i]
        if any(self.exercise.agrees(got, form[i]) for form in self.runs[mistake.name]):
            return True
        if mistake.error_line and "raises" in got and re.search(mistake.error_line, got.get("line", "")):
            return True
        if mistake.recognise is None or not _safe(mistake.recognise, got, expected, case):
            return False
        if mistake.component is None:
            return True
        # the mark is in one output: every other output must be the reference's
        got_parts, expected_parts = _components(got), _components(expected)
        if got_parts is None or expected_parts is None or len(got_parts) != len(expected_parts):
            return False
        return all(values_agree(g, e, self.exercise.tolerance)
                   for j, (g, e) in enumerate(zip(got_parts, expected_parts)) if j != mistake.component)

    def _component_agrees(self, source: Mistake | None, i: int, j: int) -> bool:
        """The learner's output j on case i is the reference's (source None) or the mistake's."""
        got_parts = _components(self.got[i])
        if got_parts is None:
            return False
        tolerance = self.exercise.tolerance
        if source is None:
            expected_parts = _components(self.expected[i])
            return expected_parts is not None and len(expected_parts) == len(got_parts) and values_agree(
                got_parts[j], expected_parts[j], tolerance)
        for form in self.runs[source.name]:
            parts = _components(form[i])
            same_form = parts is not None and len(parts) == len(got_parts)
            if same_form and values_agree(got_parts[j], parts[j], tolerance):
                return True
        return (source.recognise is not None and source.component == j
                and _safe(source.recognise, self.got[i], self.expected[i], self.cases[i]))

    def _hides_the_rest(self, mistake: Mistake, i: int) -> bool:
        """The learner's code raised on case i on the line this mistake is known by: nothing else of
        that case can be seen (the other mistake of a pair is not contradicted there)."""
        got = self.got[i]
        return bool(mistake.error_line and "raises" in got
                    and re.search(mistake.error_line, got.get("line", "")))

    def _components_explained(self, i: int, a: Mistake, b: Mistake) -> tuple[bool, bool, bool]:
        """Case i of a tuple output: (every output is the reference's, a's or b's; a is needed;
        b is needed)."""
        parts = _components(self.got[i])
        expected = _components(self.expected[i])
        if parts is None or expected is None or len(parts) != len(expected):
            return False, False, False
        needs_a = needs_b = False
        for j in range(len(parts)):
            if self._component_agrees(None, i, j):
                continue
            from_a, from_b = self._component_agrees(a, i, j), self._component_agrees(b, i, j)
            if not (from_a or from_b):
                return False, False, False
            needs_a, needs_b = needs_a or (from_a and not from_b), needs_b or (from_b and not from_a)
        return True, needs_a, needs_b

    def _pair_explains(self, pair: tuple[Mistake, Mistake]) -> bool:
        """Both mistakes together reproduce every case: a function making both does (exercise.combine),
        or on each case one of them shows while the other is silent or hidden (n = -1 refused by
        nobody, an overflow elsewhere), or each output of a tuple is the reference's or one mistake's."""
        a, b = pair
        exercise, n = self.exercise, len(self.cases)
        forms = exercise.combination_forms(self.seed, self.cases, frozenset((a.name, b.name)))
        together = [any(exercise.agrees(self.got[i], form[i]) for form in forms) for i in range(n)]
        if all(together):
            return True
        used_a = used_b = any(together)
        for i in range(n):
            if together[i]:
                continue
            if self.explains[a.name][i] and (self.silent[b.name][i] or self._hides_the_rest(a, i)):
                used_a = used_a or not self.silent[a.name][i]
                continue
            if self.explains[b.name][i] and (self.silent[a.name][i] or self._hides_the_rest(b, i)):
                used_b = used_b or not self.silent[b.name][i]
                continue
            explained, needs_a, needs_b = self._components_explained(i, a, b)
            if not explained:
                return False
            used_a, used_b = used_a or needs_a, used_b or needs_b
        return used_a and used_b

    def _partial(self) -> None:
        """Mistakes that each explain a part of the failing cases (greedy cover, at most three), and,
        for tuple outputs, which outputs agree with the reference or with a mistake."""
        left = set(self.failing)
        while left and len(self.covered) < 3:
            best = max(self.exercise.mistakes, key=lambda m: sum(self.explains[m.name][i] for i in left))
            explained = [i for i in sorted(left) if self.explains[best.name][i]]
            if not explained:
                break
            self.covered.append((best, explained))
            left -= set(explained)
        parts = _components(self.expected[0])
        if parts is not None and all(_components(g) is not None and len(_components(g)) == len(parts)
                                     for g in self.got):
            n = len(self.cases)
            for j in range(len(parts)):
                source = next((s for s in (None, *self.exercise.mistakes)
                               if all(self._component_agrees(s, i, j) for i in range(n))), "none")
                if source != "none" and source is not None:
                    self.component_sources.append((j, source))
        if self.covered or self.component_sources:
            self.kind = "partial"

    @property
    def unexplained(self) -> list[int]:
        covered = {i for _, cases in self.covered for i in cases}
        return [i for i in self.failing if i not in covered]


def _safe(predicate: Callable, *args) -> bool:
    try:
        return bool(predicate(*args))
    except Exception:  # a recogniser reads an output of any form; an odd one simply does not match
        return False


# ----------------------------------------------------------------------------------------------
# comparing values


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
        atol = tolerance * max(scale, 1e-3)
        return bool(torch.allclose(got[finite], expected[finite], rtol=0.0, atol=atol))
    if isinstance(expected, bool) or isinstance(got, bool):
        return type(got) is type(expected) and got == expected
    if isinstance(expected, int) and not isinstance(got, bool) and isinstance(got, int):
        return int(got) == int(expected)
    if isinstance(expected, float) or isinstance(got, float):
        try:
            return values_agree(torch.tensor(float(got)), torch.tensor(float(expected)), tolerance)
        except (TypeError, ValueError, RuntimeError):
            return False
    if isinstance(expected, dict):
        return isinstance(got, dict) and got.keys() == expected.keys() and all(
            values_agree(got[k], expected[k], tolerance) for k in expected)
    if isinstance(expected, (list, tuple)):
        return isinstance(got, (list, tuple)) and len(got) == len(expected) and all(
            values_agree(g, e, tolerance) for g, e in zip(got, expected))
    return got == expected


def _kind(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return "tensor"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, (tuple, list)):
        return "tuple"
    if value is None:
        return "None"
    return type(value).__name__


def _shape_text(shape) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def structure_problem(exercise: Exercise, got: Any, expected: Any) -> tuple[str, dict] | None:
    """The first difference in type or shape between a learner's output and the reference's, as
    (key, fields) for the verdict; None when the structures agree."""
    names = exercise.outputs
    if _kind(expected) == "tuple":
        if _kind(got) != "tuple":
            return "not_tuple", {"count": len(expected), "names": ", ".join(names) or str(len(expected)),
                                 "got": _kind(got)}
        if len(got) != len(expected):
            return "tuple_length", {"got": len(got), "count": len(expected), "names": ", ".join(names)}
        for j, (g, e) in enumerate(zip(got, expected)):
            problem = structure_problem(exercise, g, e)
            if problem is not None:
                key, fields = problem
                label = names[j] if j < len(names) else str(j + 1)
                return "in_output", {"index": j + 1, "name": label, "inner": (key, fields)}
        return None
    if isinstance(expected, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            if isinstance(got, (float, int)) and not isinstance(got, bool):
                return "python_number", {"shape": _shape_text(expected.shape)}
            return "wrong_type", {"expected": "tensor " + _shape_text(expected.shape), "got": _kind(got)}
        if got.shape != expected.shape:
            if got.dim() == 0 and expected.dim() >= 1:
                fields = {"shape": _shape_text(expected.shape)}
                value = got.detach().double()
                flat = expected.detach().double()
                scale = max(flat.abs().max().item(), 1e-3) * exercise.tolerance
                if torch.isfinite(value) and abs(value.item() - flat.mean().item()) <= scale:
                    return "scalar_mean", fields
                if torch.isfinite(value) and abs(value.item() - flat.sum().item()) <= scale * flat.numel():
                    return "scalar_sum", fields
                return "scalar", fields
            return "shape", {"got": _shape_text(got.shape), "expected": _shape_text(expected.shape)}
        if expected.is_floating_point() and not got.is_floating_point():
            return "dtype", {"got": str(got.dtype).replace("torch.", ""),
                             "expected": str(expected.dtype).replace("torch.", "")}
        return None
    if isinstance(expected, float) and not isinstance(got, (float, int, torch.Tensor)) or (
            isinstance(expected, int) and not isinstance(expected, bool) and isinstance(got, float)):
        return "wrong_type", {"expected": _kind(expected), "got": _kind(got)}
    return None


# ----------------------------------------------------------------------------------------------
# printing values: inputs in full, as code that can be pasted and re-run


def _float_text(x: float, single: bool) -> str:
    if math.isnan(x):
        return 'float("nan")'
    if math.isinf(x):
        return 'float("inf")' if x > 0 else 'float("-inf")'
    if single:
        import numpy

        return str(numpy.float32(x))  # the shortest text that gives back the same float32
    return repr(float(x))


def _nested(values, single: bool, integer: bool):
    if isinstance(values, list):
        return "[" + ", ".join(_nested(v, single, integer) for v in values) + "]"
    if isinstance(values, bool):
        return repr(values)
    return repr(int(values)) if integer else _float_text(values, single)


def paste_text(value: Any) -> str:
    """`value` as Python source that rebuilds it exactly (tensors with their dtype, float32 values in
    their shortest exact form, FixedWidthInts with their width)."""
    maker = getattr(value, "paste_text", None)
    if callable(maker):
        return maker()
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        integer = not value.is_floating_point() and value.dtype != torch.bool
        body = _nested(value.tolist(), value.dtype == torch.float32, integer)
        default = value.dtype in (torch.float32, torch.int64, torch.bool)
        dtype = "" if default else f", dtype={str(value.dtype)}"
        return f"torch.tensor({body}{dtype})"
    if isinstance(value, float):
        return _float_text(value, single=False)
    if isinstance(value, tuple):
        return "(" + ", ".join(paste_text(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    if isinstance(value, list):
        return "[" + ", ".join(paste_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {paste_text(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _size(value: Any) -> tuple[int, int]:
    """How big a case is: (number of elements, then the magnitude of its integers) - the smaller the
    easier to read and to work through by hand."""
    if isinstance(value, torch.Tensor):
        return value.numel(), 0
    if isinstance(value, (list, tuple)):
        sizes = [_size(v) for v in value]
        return sum(s[0] for s in sizes) + 1, sum(s[1] for s in sizes)
    if isinstance(value, dict):
        sizes = [_size(v) for v in value.values()]
        return sum(s[0] for s in sizes), sum(s[1] for s in sizes)
    if isinstance(value, int) and not isinstance(value, bool):
        return 1, abs(int(value))
    return 1, 0


SHOW_LIMIT = 256  # elements: a larger output is summarised by its shape and its largest differences


def _display_nested(values) -> str:
    if isinstance(values, list):
        return "[" + ", ".join(_display_nested(v) for v in values) + "]"
    if values == 0:
        return "0."  # also -0.0
    text = f"{values:.6g}"
    return text if any(c in text for c in ".en") else text + "."  # 1. is a float, as torch prints it


def show_value(value: Any, other: Any = None) -> str:
    """A value for the verdict, in full (no cut in the middle of a tensor); a tensor of more than
    SHOW_LIMIT elements is summarised by its shape and the places where it differs from `other`."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        if value.numel() > SHOW_LIMIT:
            text = f"tensor of shape {_shape_text(value.shape)}"
            if isinstance(other, torch.Tensor) and other.shape == value.shape and value.is_floating_point():
                gap = (value.double() - other.detach().cpu().double()).abs().nan_to_num(float("inf"))
                index = tuple(int(k) for k in torch.unravel_index(gap.argmax(), gap.shape))
                text += f"; largest difference at {index}: {value[index].item():.6g}"
            return text
        if value.is_floating_point():
            body = _display_nested(value.tolist())
        else:
            body = str(value.tolist())
        suffix = f", shape {_shape_text(value.shape)}" if value.dim() != 1 else ""
        return f"tensor({body}{suffix})"
    if isinstance(value, float):
        text = f"{value:.6g}"
        return text if any(c in text for c in ".en") else text + ".0"  # 1.0 stays a float to the eye
    if isinstance(value, (tuple, list)):
        paired = isinstance(other, (tuple, list)) and len(other) == len(value)
        others = other if paired else [None] * len(value)
        inner = ", ".join(show_value(v, o) for v, o in zip(value, others))
        return f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
    return repr(value)


def _structure_text(words: dict, exercise: Exercise, lang: str, problem: tuple[str, dict]) -> str:
    key, fields = problem
    if key == "in_output":
        fields = dict(fields, inner=_structure_text(words, exercise, lang, fields["inner"]))
    unit = (exercise.output_unit_zh if lang == "zh" else exercise.output_unit) or words["unit_default"]
    return words[key].format(unit=unit, **fields)


def _which(cases: list[Case], indices: list[int], lang: str, limit: int = 3) -> str:
    labels = [f"'{cases[i].label(lang)}'" if lang == "en" else f"「{cases[i].label(lang)}」"
              for i in indices[:limit]]
    more = len(indices) - limit
    if lang == "zh":
        return "、".join(labels) + ("等" if more > 0 else "")
    return ", ".join(labels + ([f"+{more}"] if more > 0 else []))


@dataclass
class CheckResult:
    """The verdict of one check. `str(result)` is the text a learner reads (in `lang`; `result.text("zh")`
    gives the other language); `passed`, `mistakes` (a list of Mistake, best guesses first), `certain`
    (the learner's outputs matched catalogued mistakes on every case), `combination` (two at once) and
    `partial` are for code."""

    exercise: Exercise
    passed: bool
    cases: int
    failed: int = 0
    lang: str = "en"
    notes: list = field(default_factory=list)
    signature_problem: tuple | None = None
    function_name: str = ""
    positional: bool = False
    case_list: list[Case] = field(default_factory=list)
    expected_list: list[dict] = field(default_factory=list)
    got_list: list[dict] = field(default_factory=list)
    failing: list[int] = field(default_factory=list)
    diagnosis: Diagnosis | None = None

    @property
    def mistakes(self) -> list[Mistake]:
        d = self.diagnosis
        if d is None:
            return []
        if d.kind == "pair":
            return list(dict.fromkeys(m for pair in d.pairs for m in pair))
        if d.kind == "partial":
            return list(dict.fromkeys([m for m, _ in d.covered] + [m for _, m in d.component_sources]))
        return list(d.mistakes)

    @property
    def mistake_names(self) -> list[str]:
        return [m.name for m in self.mistakes]

    @property
    def certain(self) -> bool:
        return self.diagnosis is not None and self.diagnosis.kind in ("certain", "pair")

    @property
    def combination(self) -> bool:
        return self.diagnosis is not None and self.diagnosis.kind == "pair"

    @property
    def partial(self) -> bool:
        return self.diagnosis is not None and self.diagnosis.kind == "partial"

    @property
    def smallest(self) -> int | None:
        """Index of the smallest failing case still unexplained (else the smallest failing case)."""
        if not self.failing:
            return None
        pool = self.diagnosis.unexplained if self.diagnosis and self.diagnosis.kind == "partial" else []
        pool = pool or self.failing
        return min(pool, key=lambda i: (*_size(self.case_list[i].kwargs), i))

    @property
    def diagnosis_line(self) -> str:
        """The first line after the FAIL line: the one-line diagnosis."""
        lines = self.text().splitlines()
        return lines[1] if len(lines) > 1 else ""

    def text(self, lang: str | None = None) -> str:
        lang = self.lang if lang is None else resolve_language(lang)
        words = WORDS[lang]
        e = self.exercise
        title = f"{e.name} ({e.title_in(lang)})" if lang == "en" else f"{e.name}（{e.title_in(lang)}）"
        if self.signature_problem is not None:
            key, fields = self.signature_problem
            return "\n".join([words["fail_signature"].format(title=title), words[key].format(**fields),
                              e.def_line])
        notes = [words[key].format(**_note_fields(key, fields, lang)) for key, fields in self.notes]
        if self.passed:
            return "\n".join([words["pass"].format(title=title, cases=self.cases), *notes])
        lines = [words["fail"].format(title=title, failed=self.failed, cases=self.cases)]
        lines += self._diagnosis_lines(words, lang)
        lines += notes
        lines += self._case_lines(words, lang)
        return "\n".join(lines)

    def _runaway_line(self, words: dict, lang: str) -> str | None:
        raised = {self.got_list[i].get("raises") for i in self.failing}
        if "CaseTimeout" in raised:
            limit = max(g.get("limit", 0) for g in self.got_list if g.get("raises") == "CaseTimeout")
            reason = words["timeout_reason"].format(limit=limit)
        elif "OperationBudgetExceeded" in raised:
            reason = words["budget_reason"]
        else:
            return None
        hint = self.exercise.runaway_zh if lang == "zh" else self.exercise.runaway
        hint = hint or words["runaway_default"]
        return words["runaway"].format(reason=reason, hint=hint)

    def _diagnosis_lines(self, words: dict, lang: str) -> list[str]:
        d = self.diagnosis
        lines = []
        if d is not None and d.kind == "certain":
            lines += [words["certain"].format(name=m.name, message=m.text(lang)) for m in d.mistakes]
        elif d is not None and d.kind == "pair":
            names = " / ".join(f"[{a.name}] + [{b.name}]" for a, b in d.pairs)
            lines.append(words["pair_head"].format(names=names))
            lines += [words["pair_item"].format(name=m.name, message=m.text(lang)) for m in self.mistakes]
        elif d is not None and d.kind == "possible":
            lines += [words["possible"].format(name=m.name, message=m.text(lang)) for m in d.mistakes]
        structure = self._structure_line(words, lang)
        runaway = self._runaway_line(words, lang)
        if d is not None and d.kind == "partial":
            if structure:
                lines.append(structure)
            for m, explained in d.covered:
                lines.append(words["partial"].format(
                    name=m.name, count=len(explained), failed=len(self.failing),
                    which=_which(self.case_list, explained, lang), message=m.text(lang)))
            names = self.exercise.outputs
            for j, source in d.component_sources:
                if source not in [m for m, _ in d.covered]:
                    lines.append(words["component_mistake"].format(
                        index=j + 1, name=names[j] if j < len(names) else j + 1, mistake=source.name,
                        message=source.text(lang)))
            if d.unexplained and d.covered:
                lines.append(words["unexplained"].format(count=len(d.unexplained),
                                                         which=_which(self.case_list, d.unexplained, lang)))
            if runaway:
                lines.append(runaway)
        elif d is None or d.kind == "none":
            if structure:
                lines.append(structure)
            if runaway:
                lines.append(runaway)
            if not structure and not runaway:
                lines.append(words["none"])
        elif structure:
            lines.append(structure)  # the catalogue named the mistake; the form of the output adds to it
        return lines

    def _structure_line(self, words: dict, lang: str) -> str | None:
        for i in self.failing:
            got, expected = self.got_list[i], self.expected_list[i]
            if "raises" in got or "raises" in expected:
                continue
            problem = structure_problem(self.exercise, got.get("output"), expected.get("output"))
            if problem is not None:
                return words["structure"].format(text=_structure_text(words, self.exercise, lang, problem))
        return None

    def _case_lines(self, words: dict, lang: str) -> list[str]:
        i = self.smallest
        case = self.case_list[i]
        lines = [words["smallest"].format(name=case.label(lang))]
        dropped = [name for key, fields in self.notes if key == "dropped" for name in fields["list"]]
        kwargs = {k: v for k, v in case.kwargs.items() if k not in dropped}  # what the function was given
        needs = sorted({getattr(v, "paste_import", "") for v in _leaves(kwargs)} - {""})
        lines += [words["import_note"].format(line=line) for line in needs]
        if self.positional:
            order = [name for name, _ in self.exercise.parameters if name in kwargs]
            arguments = [paste_text(kwargs[name]) for name in order]
        else:
            arguments = [f"{k}={paste_text(v)}" for k, v in kwargs.items()]
        call = f"{self.function_name}({', '.join(arguments)})"
        if len(call) > 106:
            call = f"{self.function_name}(\n" + ",\n".join(f"        {a}" for a in arguments) + ")"
        lines.append(f"    {call}")
        lines += self._observation_lines(words, lang, self.expected_list[i], self.got_list[i])
        return lines

    def _observation_lines(self, words: dict, lang: str, expected: dict, got: dict) -> list[str]:
        def one(observation: dict, other: dict, learner: bool) -> str:
            if "raises" in observation:
                message = observation.get("message", "")
                if observation["raises"] == "CaseTimeout":
                    message = words["timeout_message"].format(limit=observation["limit"])
                elif observation["raises"] == "OperationBudgetExceeded":
                    message = words["budget_message"]
                text = words["raised"].format(error=observation["raises"], message=message)
                if learner and observation.get("line"):
                    text += words["at_line"].format(line=observation["line"])
                return text
            value = observation.get("output")
            return show_value(value, other.get("output"))

        simple = ("raises" in expected or "raises" in got or set(expected) == {"output"}
                  or expected.keys() != got.keys())
        if simple:
            return [words["expected"].format(value=one(expected, got, False)),
                    words["got"].format(value=one(got, expected, True))]
        lines = []
        for key in expected:  # an observation with gradients: say which part differs
            label = words["output_key"] if key == "output" else key
            if values_agree(got[key], expected[key], self.exercise.tolerance):
                if key == "output":  # "the value is right, the gradient is not" is the lesson
                    lines.append(words["key_agrees"].format(key=label))
            else:
                pad = " " * (len(label) * (2 if lang == "zh" and key == "output" else 1))
                lines.append(words["key_differs"].format(key=label, pad=pad, expected=show_value(
                    expected[key], got[key]), got=show_value(got[key], expected[key])))
        return lines

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        return str(self)

    def _repr_pretty_(self, printer, cycle) -> None:  # IPython shows the verdict as plain text
        printer.text(str(self))


def _note_fields(key: str, fields: dict, lang: str) -> dict:
    if key == "dropped":
        return {"names": fields["names"]}
    if key != "by_position":
        return fields
    joiner = " 对应 " if lang == "zh" else " for "
    separator = ", " if lang == "en" else "，"
    return dict(fields, renamed=separator.join(f"{a}{joiner}{b}" for a, b in fields["renamed"]))


def _leaves(value: Any):
    if isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _leaves(v)
    else:
        yield value


def spec_cases(vectors: Sequence[tuple], tolerance: float = 1e-4) -> list[Case]:
    """Cases from (name, kwargs, expected) or (name, kwargs, expected, name_zh) tuples with published
    values (quoted rounded, hence the tolerance)."""
    return [Case(v[0], v[1], v[2], tolerance, v[3] if len(v) > 3 else "") for v in vectors]


def raises_where_reference_returns(exercise: Exercise, mistake: Mistake, seed: int = 0) -> list[str]:
    """The cases where a catalogued variant raises an exception its mistake does not explain while the
    reference returns: a bug of the catalogue (such a variant can never be named). Empty = sound."""
    problems = []
    for case in exercise.make_cases(seed):
        reference = exercise.run(exercise.reference, case)
        if "raises" in reference:
            continue
        for form in mistake.all_forms:
            observed = exercise.run(form, case)
            if "raises" in observed and observed["raises"] not in mistake.raises:
                problems.append(f"{case.name}: {observed['raises']}: {observed.get('message', '')}")
    return problems
