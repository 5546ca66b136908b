"""Coding warm-up: integer square root, by binary search and by Newton's method (interview Q12).

The package has no integer square root, so the reference solutions live here.

Python's ints never overflow, but the interview question is asked about C, C++ and Java, where
`(lo + hi) / 2` and `mid * mid` overflow a 32-bit int. To make that mistake visible in Python, the
checker passes `FixedWidthInt`s: ints that raise OverflowError when a result leaves the signed
32-bit range, and that count their operations so that a loop that never ends (or a linear scan)
stops with a clear error instead of hanging the notebook.
"""

from __future__ import annotations

import math
import random

from .core import Case, Exercise, Mistake

INT32_MAX = 2**31 - 1
OPERATION_BUDGET = 20_000  # binary search and Newton need < 1000 operations on every case here


class OperationBudgetExceeded(RuntimeError):
    """Raised when a function does more integer operations than OPERATION_BUDGET on one input."""


class FixedWidthInt(int):
    """An int that behaves like a signed `bits`-bit machine integer: an arithmetic result outside
    [-2^(bits-1), 2^(bits-1) - 1] raises OverflowError (bits=None: unbounded, like Python). Every
    operation is counted against a budget shared by all ints derived from the same input.

    Results of +, -, *, //, %, <<, >>, unary -, abs and pow are FixedWidthInts again, also when the
    other operand is a plain int (`0 + n`, `n - 1`). `/` gives a float, as in Python.
    """

    def __new__(cls, value: int, bits: int | None = 32, budget: list[int] | None = None):
        number = super().__new__(cls, value)
        number.bits = bits
        number.budget = budget if budget is not None else [OPERATION_BUDGET]
        if bits is not None and not -(2 ** (bits - 1)) <= int(value) <= 2 ** (bits - 1) - 1:
            raise OverflowError(f"{int(value)} does not fit in a signed {bits}-bit int")
        return number

    def __reduce__(self):  # deep copies get their own budget (a fresh one per checked call)
        return (FixedWidthInt, (int(self), self.bits, list(self.budget)))

    def _wrap(self, value):
        if value is NotImplemented:
            return value
        self.budget[0] -= 1
        if self.budget[0] < 0:
            raise OperationBudgetExceeded(
                f"more than {OPERATION_BUDGET} integer operations on one input: does the loop always "
                "shrink its range (lo = mid + 1 / hi = mid - 1), and does it stop?")
        return FixedWidthInt(value, self.bits, self.budget)

    def __add__(self, other): return self._wrap(int.__add__(self, other))
    def __radd__(self, other): return self._wrap(int.__radd__(self, other))
    def __sub__(self, other): return self._wrap(int.__sub__(self, other))
    def __rsub__(self, other): return self._wrap(int.__rsub__(self, other))
    def __mul__(self, other): return self._wrap(int.__mul__(self, other))
    def __rmul__(self, other): return self._wrap(int.__rmul__(self, other))
    def __floordiv__(self, other): return self._wrap(int.__floordiv__(self, other))
    def __rfloordiv__(self, other): return self._wrap(int.__rfloordiv__(self, other))
    def __mod__(self, other): return self._wrap(int.__mod__(self, other))
    def __rmod__(self, other): return self._wrap(int.__rmod__(self, other))
    def __lshift__(self, other): return self._wrap(int.__lshift__(self, other))
    def __rshift__(self, other): return self._wrap(int.__rshift__(self, other))
    def __pow__(self, other, modulo=None): return self._wrap(int.__pow__(self, other, modulo))
    def __neg__(self): return self._wrap(int.__neg__(self))
    def __abs__(self): return self._wrap(int.__abs__(self))

    def __repr__(self) -> str:
        return f"{int(self)} (int{self.bits})" if self.bits else f"{int(self)}"


# ----------------------------------------------------------------------------------------------
# reference solutions


def isqrt_binary_search(n: int) -> int:
    """floor(sqrt(n)) by binary search on the answer. O(log n) steps; ValueError for n < 0.

    Invariant: every x < lo has x*x <= n and every x > hi has x*x > n; `answer` is the largest
    x seen with x*x <= n. Two details keep it inside a 32-bit int:
        mid = lo + (hi - lo) // 2     (lo + hi overflows when both are near 2^31)
        mid <= n // mid               (mid * mid overflows; mid >= 1 here, so no division by 0)
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    lo, hi, answer = 1, n, 0
    while lo <= hi:
        mid = lo + (hi - lo) // 2  # overflow-safe midpoint
        if mid <= n // mid:  # mid * mid <= n, without the product
            answer = mid
            lo = mid + 1
        else:
            hi = mid - 1
    return answer


def isqrt_newton(n: int) -> int:
    """floor(sqrt(n)) by Newton's method on f(x) = x^2 - n, in integers. ValueError for n < 0.

        x_{k+1} = floor((x_k + floor(n / x_k)) / 2)

    Started at x_0 = n >= sqrt(n), the iterates decrease (AM >= GM) until the first k with
    x_{k+1} >= x_k; that x_k is floor(sqrt(n)). Stop on "no longer decreasing", not on "unchanged":
    for n = 3, 8, 15, ... (n + 1 a square) the iterates end up alternating between two values.
    Overflow-safe: with q = n // x < x, floor((x + q) / 2) = q + (x - q) // 2 (the midpoint again),
    and "x <= q" replaces "x * x <= n".
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if n < 2:
        return n  # also avoids n // 0
    x = n
    while True:
        q = n // x
        if x <= q:  # x_{k+1} = floor((x + q) / 2) >= x: converged
            return x
        x = q + (x - q) // 2  # floor((x + q) / 2) without x + q


# ----------------------------------------------------------------------------------------------
# wrong variants (each one a mistake seen in interviews)


def _binary_unsafe_midpoint(n):
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    lo, hi, answer = 1, n, 0
    while lo <= hi:
        mid = (lo + hi) // 2
        if mid <= n // mid:
            answer, lo = mid, mid + 1
        else:
            hi = mid - 1
    return answer


def _binary_square_overflow(n):
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    lo, hi, answer = 1, n, 0
    while lo <= hi:
        mid = lo + (hi - lo) // 2
        if mid * mid <= n:
            answer, lo = mid, mid + 1
        else:
            hi = mid - 1
    return answer


def _binary_returns_lo(n):
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    lo, hi = 1, n
    while lo <= hi:
        mid = lo + (hi - lo) // 2
        if mid <= n // mid:
            lo = mid + 1
        else:
            hi = mid - 1
    return lo


def _binary_no_progress(n):
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    lo, hi = 0, n
    while lo < hi:
        mid = lo + (hi - lo) // 2
        if mid == 0 or mid <= n // mid:
            lo = mid  # with the lower midpoint, lo == mid once hi = lo + 1: no progress
        else:
            hi = mid - 1
    return lo


def _linear_scan(n):
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    x = 0
    while (x + 1) <= n // (x + 1):
        x = x + 1
    return x


def _float_sqrt(n):
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return int(math.sqrt(n))


def _newton_unsafe_sum(n):
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if n < 2:
        return n
    x = n
    while True:
        y = (x + n // x) // 2
        if y >= x:
            return x
        x = y


def _newton_square_overflow(n):
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if n < 2:
        return n
    x = n
    while x * x > n:
        q = n // x
        x = q + (x - q) // 2
    return x


def _newton_zero_division(n):
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    x = n
    while True:
        q = n // x
        if x <= q:
            return x
        x = q + (x - q) // 2


def _newton_until_unchanged(n):
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if n < 2:
        return n
    x = n
    while True:
        q = n // x
        y = q + (x - q) // 2 if x > q else x + (q - x) // 2
        if y == x:
            return x
        x = y


def _newton_float(n):
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if n < 2:
        return n
    x = float(n)
    for _ in range(200):
        x = (x + n / x) / 2
    return int(x)


BINARY_MISTAKES = (
    Mistake("unsafe_midpoint", "mid = (lo + hi) // 2 overflows a 32-bit int when lo + hi > 2^31 - 1; "
            "write mid = lo + (hi - lo) // 2.", _binary_unsafe_midpoint),
    Mistake("square_overflow", "mid * mid overflows a 32-bit int for mid > 46340; compare mid <= n // mid "
            "(mid >= 1) instead.", _binary_square_overflow),
    Mistake("returns_lo", "after the loop lo is the first x with x*x > n (one too many); return hi, or "
            "the last mid that passed.", _binary_returns_lo),
    Mistake("no_progress", "lo = mid with the lower midpoint never moves once hi = lo + 1: the loop never "
            "ends. Use lo = mid + 1 (keeping the best answer), or the upper midpoint.", _binary_no_progress),
    Mistake("linear_scan", "counting x up until x*x > n takes sqrt(n) steps (46341 for n = 2^31 - 1): "
            "the question asks for O(log n).", _linear_scan),
    Mistake("float_sqrt", "int(math.sqrt(n)) goes through a 53-bit float: wrong for large n "
            "(e.g. n = (10^15 + 1)^2 - 1), and not what the interviewer asked.", _float_sqrt),
)

NEWTON_MISTAKES = (
    Mistake("unsafe_sum", "(x + n // x) // 2 overflows a 32-bit int when x starts at n = 2^31 - 1; "
            "with q = n // x < x write q + (x - q) // 2 (the overflow-safe midpoint).", _newton_unsafe_sum),
    Mistake("square_overflow", "x * x > n overflows a 32-bit int while x > 46340; test x > n // x "
            "instead.", _newton_square_overflow),
    Mistake("zero_division", "n = 0 divides by zero (x starts at n = 0): return n for n < 2 first.",
            _newton_zero_division),
    Mistake("until_unchanged", "stopping when x stops changing never ends for n = 3, 8, 15, ... "
            "(n + 1 a square): the iterates alternate between two values. Stop as soon as the next "
            "iterate is not smaller (x <= n // x).", _newton_until_unchanged),
    Mistake("float_newton", "Newton in floats (n / x) loses the last digits for large n; use integer "
            "division n // x throughout.", _newton_float),
    Mistake("float_sqrt", "int(math.sqrt(n)) goes through a 53-bit float: wrong for large n, and not "
            "Newton's method.", _float_sqrt),
)


def isqrt_cases(seed: int) -> list[Case]:
    """Small n, squares and their neighbours, the 32-bit edge (as FixedWidthInt), n < 0, and huge n
    (unbounded ints, where floats fail), then seeded random n of both kinds."""
    def int32(value):
        return Case(f"n={value} (int32)", {"n": FixedWidthInt(value, 32)})

    def big(value, label):
        return Case(f"n={label} (unbounded)", {"n": FixedWidthInt(value, None)})

    cases = [int32(n) for n in range(0, 17)]
    cases += [int32(n) for n in (24, 25, 26, 99, 100, 46340**2 - 1, 46340**2, 46340**2 + 1)]
    cases += [int32(INT32_MAX), int32(INT32_MAX - 1), Case("n=-1", {"n": FixedWidthInt(-1, 32)})]
    cases += [big((10**15 + 1) ** 2 - 1, "(10^15+1)^2-1"), big(10**30, "10^30"), big(2**100 + 7, "2^100+7")]
    rng = random.Random(seed)
    cases += [int32(rng.randrange(0, INT32_MAX)) for _ in range(8)]
    cases += [big(rng.randrange(2**60, 2**120), f"random{i}") for i in range(3)]
    return cases


def _observe_int(function, kwargs) -> dict:
    result = function(**kwargs)
    return {"output": int(result) if isinstance(result, int) else result,
            "is_int": isinstance(result, int) and not isinstance(result, bool)}


_ISQRT_HINTS = (
    "The answer lies in [0, n]; you want the LARGEST x with x*x <= n.",
    "In C/Java, lo + hi can exceed 2^31 - 1. What is lo + (hi - lo) / 2?",
    "mid * mid can overflow too: mid <= n / mid asks the same question.",
)

EXERCISES = [
    Exercise(
        name="isqrt_binary_search", title="integer square root by binary search", topic="coding",
        difficulty="easy", minutes=10,
        signature='''def isqrt_binary_search(n: int) -> int:
    """Return floor(sqrt(n)) for n >= 0 by binary search, in O(log n) steps; raise ValueError for n < 0.

    Write it as if ints were signed 32-bit (C/Java): the checker passes ints that raise
    OverflowError on overflow. No floats, no math.isqrt. (LeetCode 69; interview Q12.)
    """''',
        reference=isqrt_binary_search, make_cases=isqrt_cases, mistakes=BINARY_MISTAKES,
        hints=_ISQRT_HINTS, source="LeetCode 69 'Sqrt(x)'; Python's math.isqrt for the n < 0 convention",
        observe=_observe_int,
    ),
    Exercise(
        name="isqrt_newton", title="integer square root by Newton's method", topic="coding",
        difficulty="medium", minutes=15,
        signature='''def isqrt_newton(n: int) -> int:
    """Return floor(sqrt(n)) for n >= 0 by Newton's method in integers; raise ValueError for n < 0.

        x_{k+1} = floor((x_k + floor(n / x_k)) / 2),   x_0 = n

    Decide when to stop (hint: the iterates decrease until they are done). Write it as if ints were
    signed 32-bit: the checker passes ints that raise OverflowError on overflow. (Interview Q12.)
    """''',
        reference=isqrt_newton, make_cases=isqrt_cases, mistakes=NEWTON_MISTAKES,
        hints=("Start at x = n (>= sqrt(n)); each step is the midpoint of x and n // x.",
               "Try n = 3 by hand: 3 -> 2 -> 1 -> 2 -> 1 ... When should you stop?",
               "x + n // x overflows for x = n = 2^31 - 1. With q = n // x < x, the midpoint is q + (x - q) // 2."),
        source="Newton's method for x^2 - n; the integer form as in Python's math.isqrt documentation",
        observe=_observe_int,
    ),
]
