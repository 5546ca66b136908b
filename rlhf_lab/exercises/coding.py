"""Coding warm-up: integer square root, by binary search and by Newton's method (interview Q12).

The package has no integer square root, so the reference solutions live here.

Python's ints never overflow, but the interview question is asked about C, C++ and Java, where
`(lo + hi) / 2` and `mid * mid` overflow a 32-bit int. To make that mistake visible in Python, the
checker passes `FixedWidthInt`s: ints that raise OverflowError when a result leaves the signed
32-bit range, and that count their operations so that a loop that never ends (or a linear scan)
stops with a clear error instead of hanging the notebook.

The wrong variants are built from one binary search and one Newton iteration with a switch per
mistake, so that two mistakes can be made together (an overflow and a missing check of n < 0).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from .core import Case, Exercise, Mistake

INT32_MAX = 2**31 - 1
OPERATION_BUDGET = 2_000  # both references need < 800 operations on the largest case here (n < 2^121)


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
        if self.budget[0] < 0:  # what the loop should do is the exercise's to say (Exercise.runaway)
            raise OperationBudgetExceeded(f"more than {OPERATION_BUDGET} integer operations on one input; "
                                          "an O(log n) method needs far fewer")
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

    paste_import = "from rlhf_lab.exercises import FixedWidthInt"

    def paste_text(self) -> str:
        """Source that rebuilds this int (for the checker's smallest failing case)."""
        return f"FixedWidthInt({int(self)}, bits={self.bits})"


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


BINARY_EXCLUSIVE = frozenset({"no_progress", "linear_scan", "float_sqrt"})  # other algorithms altogether
BINARY_PARTS = frozenset({"unsafe_midpoint", "square_overflow", "returns_lo"})  # pieces of the binary search


def _binary_variant(flags: frozenset) -> Callable:
    """The reference's binary search with the mistakes named in `flags` made: how the midpoint is
    formed, how "mid * mid <= n" is asked, what is returned after the loop, whether n < 0 is refused;
    or another algorithm altogether (no_progress, linear_scan, float_sqrt)."""

    def variant(n):
        if n < 0 and "negative_not_rejected" not in flags:
            raise ValueError(f"n must be >= 0, got {n}")
        if "float_sqrt" in flags:
            return int(math.sqrt(n))
        if "linear_scan" in flags:
            x = 0
            while (x + 1) <= n // (x + 1):
                x = x + 1
            return x
        if "no_progress" in flags:
            lo, hi = 0, n
            while lo < hi:
                mid = lo + (hi - lo) // 2
                if mid == 0 or mid <= n // mid:
                    lo = mid  # with the lower midpoint, lo == mid once hi = lo + 1: no progress
                else:
                    hi = mid - 1
            return lo
        lo, hi, answer = 1, n, 0
        while lo <= hi:
            mid = (lo + hi) // 2 if "unsafe_midpoint" in flags else lo + (hi - lo) // 2
            if (mid * mid <= n) if "square_overflow" in flags else (mid <= n // mid):
                answer, lo = mid, mid + 1
            else:
                hi = mid - 1
        return lo if "returns_lo" in flags else answer

    return variant


def _binary_forms(flags: frozenset) -> tuple:
    whole = flags & BINARY_EXCLUSIVE
    if len(whole) > 1 or (whole and flags & BINARY_PARTS):
        return ()
    return (_binary_variant(flags),)


NEWTON_EXCLUSIVE = frozenset({"float_newton", "float_sqrt"})


def _safe_step(x, n):
    """floor((x + n // x) / 2) as the overflow-safe midpoint of x and q = n // x (either may be larger)."""
    q = n // x
    return q + (x - q) // 2 if x > q else x + (q - x) // 2


def _newton_variant(flags: frozenset) -> Callable:
    """The reference's Newton iteration with the mistakes named in `flags` made: the step
    (unsafe_sum), the stopping rule (square_overflow: while x * x > n; until_unchanged: next == x),
    the n < 2 guard (zero_division), the n < 0 check; or floats altogether (float_newton, float_sqrt)."""

    def variant(n):
        if n < 0 and "negative_not_rejected" not in flags:
            raise ValueError(f"n must be >= 0, got {n}")
        if "float_sqrt" in flags:
            return int(math.sqrt(n))
        if "zero_division" not in flags and n < 2:
            return n
        if "float_newton" in flags:
            x = float(n)
            for _ in range(200):
                x = (x + n / x) / 2
            return int(x)
        step = (lambda x: (x + n // x) // 2) if "unsafe_sum" in flags else (lambda x: _safe_step(x, n))
        x = n
        if "square_overflow" in flags:
            while x * x > n:
                x = step(x)
            return x
        while True:
            following = step(x)
            if following == x if "until_unchanged" in flags else following >= x:
                return x
            x = following

    return variant


def _newton_forms(flags: frozenset) -> tuple:
    whole = flags & NEWTON_EXCLUSIVE
    if len(whole) > 1 or (whole and flags - whole - {"negative_not_rejected"}):
        return ()
    if {"square_overflow", "until_unchanged"} <= flags:  # two stopping rules: one loop has only one
        return ()
    return (_newton_variant(flags),)


def _negative_accepted(got: dict, expected: dict, case: Case) -> bool:
    """n < 0 answered with something other than the ValueError the reference raises."""
    return expected.get("raises") == "ValueError" and got.get("raises") != "ValueError"


def _mistake(forms: Callable, name: str, message: str, zh: str, raises: tuple[str, ...] = ()) -> Mistake:
    return Mistake(name, message, forms(frozenset({name}))[0], zh=zh, raises=raises,
                   recognise=_negative_accepted if name == "negative_not_rejected" else None)


_NEGATIVE = ("negative_not_rejected", "n < 0 has no square root: raise ValueError (as math.isqrt does) "
             "instead of returning a number.",
             "n < 0 没有平方根：应当抛出 ValueError（与 `math.isqrt` 一致），而不是返回一个数。")

BINARY_MISTAKES = (
    _mistake(_binary_forms, "unsafe_midpoint", "mid = (lo + hi) // 2 overflows a 32-bit int when lo + hi > "
             "2^31 - 1; write mid = lo + (hi - lo) // 2.",
             "lo + hi 超过 2^31 − 1 时，mid = (lo + hi) // 2 会让 32 位整数溢出；写成 mid = lo + (hi − lo) "
             "// 2。",
             raises=("OverflowError",)),
    _mistake(_binary_forms, "square_overflow", "mid * mid overflows a 32-bit int for mid > 46340; compare "
             "mid <= n // mid (mid >= 1) instead.",
             "mid > 46340 时 mid * mid 会让 32 位整数溢出；改为比较 mid <= n // mid（mid ≥ 1）。",
             raises=("OverflowError",)),
    _mistake(_binary_forms, "returns_lo", "after the loop lo is the first x with x*x > n (one too many); "
             "return hi, or the last mid that passed.",
             "循环结束时 lo 是第一个满足 x*x > n 的数（大了 1）；应返回 hi，或者最后一个通过判断的 mid。"),
    _mistake(_binary_forms, "no_progress", "lo = mid with the lower midpoint never moves once hi = lo + 1: "
             "the loop never ends. Use lo = mid + 1 (keeping the best answer), or the upper midpoint.",
             "用下中位数时写 lo = mid，一旦 hi = lo + 1，lo 就再也不动，循环永远不会结束。改用 lo = mid + 1"
             "（同时记下目前最好的答案），或者改用上中位数。", raises=("OperationBudgetExceeded",)),
    _mistake(_binary_forms, "linear_scan", "counting x up until x*x > n takes sqrt(n) steps (46341 for "
             "n = 2^31 - 1): the question asks for O(log n).",
             "从 0 往上数到 x*x > n 需要 sqrt(n) 步（n = 2^31 − 1 时是 46341 步）：题目要求 O(log n)。",
             raises=("OperationBudgetExceeded",)),
    _mistake(_binary_forms, "float_sqrt", "int(math.sqrt(n)) goes through a 53-bit float: wrong for large n "
             "(e.g. n = (10^15 + 1)^2 - 1), and not what the interviewer asked.",
             "`int(math.sqrt(n))` 经过了只有 53 位精度的浮点数：n 很大时会算错（例如 n = (10^15 + 1)^2 − 1）"
             "，"
             "而且也不是面试官想考的。"),
    _mistake(_binary_forms, *_NEGATIVE),
)

NEWTON_MISTAKES = (
    _mistake(_newton_forms, "unsafe_sum", "(x + n // x) // 2 overflows a 32-bit int when x starts at "
             "n = 2^31 - 1; with q = n // x < x write q + (x - q) // 2 (the overflow-safe midpoint).",
             "x 从 n = 2^31 − 1 开始时，(x + n // x) // 2 会让 32 位整数溢出；令 q = n // x < x，写成 "
             "q + (x − q) // 2（不会溢出的中点）。", raises=("OverflowError",)),
    _mistake(_newton_forms, "square_overflow", "x * x > n overflows a 32-bit int while x > 46340; test "
             "x > n // x instead.",
             "x > 46340 时，x * x > n 这个判断本身就会让 32 位整数溢出；改为判断 x > n // x。",
             raises=("OverflowError",)),
    _mistake(_newton_forms, "zero_division", "n = 0 divides by zero (x starts at n = 0): return n for n < 2 "
             "first.", "n = 0 时会除以零（x 从 n = 0 开始）：先对 n < 2 直接返回 n。",
             raises=("ZeroDivisionError",)),
    _mistake(_newton_forms, "until_unchanged", "stopping when x stops changing never ends for n = 3, 8, 15, "
             "... (n + 1 a square): the iterates alternate between two values. Stop as soon as the next "
             "iterate is not smaller (x <= n // x).",
             "以“x 不再变化”作为停止条件，在 n = 3、8、15……（n + 1 是完全平方数）时永远停不下来："
             "迭代值会在两个数"
             "之间来回跳。应当在下一个迭代值不再变小时立刻停止（x <= n // x）。",
             raises=("OperationBudgetExceeded",)),
    _mistake(_newton_forms, "float_newton", "Newton in floats (n / x) loses the last digits for large n; use "
             "integer division n // x throughout.",
             "用浮点数做牛顿迭代（n / x），n 很大时会丢掉最后几位；全程都用整数除法 n // x。"),
    _mistake(_newton_forms, "float_sqrt", "int(math.sqrt(n)) goes through a 53-bit float: wrong for large n, "
             "and not Newton's method.",
             "`int(math.sqrt(n))` 经过了只有 53 位精度的浮点数：n 很大时会算错，而且这不是牛顿迭代。"),
    _mistake(_newton_forms, *_NEGATIVE),
)


def isqrt_cases(seed: int) -> list[Case]:
    """Small n, squares and their neighbours, the 32-bit edge (as FixedWidthInt), n < 0, and huge n
    (unbounded ints, where floats fail), then seeded random n of both kinds."""
    def int32(value):
        return Case(f"n={value} (int32)", {"n": FixedWidthInt(value, 32)}, name_zh=f"n={value}（32 位整数）")

    def big(value, label):
        return Case(f"n={label} (unbounded)", {"n": FixedWidthInt(value, None)},
                    name_zh=f"n={label}（不限位宽）")

    cases = [int32(n) for n in range(0, 17)]
    cases += [int32(n) for n in (24, 25, 26, 99, 100, 46340**2 - 1, 46340**2, 46340**2 + 1)]
    cases += [int32(INT32_MAX), int32(INT32_MAX - 1),
              Case("n=-1", {"n": FixedWidthInt(-1, 32)}, name_zh="n=-1")]
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
_ISQRT_HINTS_ZH = (
    "答案在 [0, n] 之间；要找的是满足 x*x <= n 的最大的 x。",
    "在 C/Java 里，lo + hi 可能超过 2^31 − 1。lo + (hi − lo) / 2 是什么？",
    "mid * mid 同样可能溢出：mid <= n / mid 问的是同一个问题。",
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
        observe=_observe_int, combine=_binary_forms,
        runaway="A binary search halves its range every step (about 31 steps for a 32-bit n): does every "
                "branch move lo or hi past mid (lo = mid + 1 / hi = mid - 1), so that the loop ends?",
        runaway_zh="二分查找每一步都把区间减半（32 位的 n 大约 31 步）：检查是否每个分支都让 lo 或 hi "
                   "越过了 mid（lo = mid + 1 / hi = mid − 1），否则循环结束不了。",
        title_zh="手撕代码：二分查找求整数平方根",
        question="Integer square root by binary search, without overflow.",
        question_zh="用二分查找求整数平方根，并且不能溢出（LeetCode 69）。",
        explanation="Search for the largest x with x*x <= n. In a 32-bit language both lo + hi and mid * mid "
                    "overflow, so write the midpoint as lo + (hi - lo) // 2 and compare mid <= n // mid.",
        explanation_zh="找满足 x*x <= n 的最大的 x。在 32 位整数的语言里，lo + hi 和 mid * mid 都会溢出，"
                       "所以中点要写成 "
                       "lo + (hi − lo) // 2，比较要写成 mid <= n // mid。",
        hints_zh=_ISQRT_HINTS_ZH,
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
               "x + n // x overflows for x = n = 2^31 - 1. With q = n // x < x, the midpoint is q + (x - q) "
               "// 2."),
        source="Newton's method for x^2 - n in integer arithmetic; Python's math.isqrt for the n < 0 "
               "convention",
        observe=_observe_int, combine=_newton_forms,
        runaway="Newton's iterates decrease from x = n and are done when the next one is not smaller: stop "
                "on x <= n // x, not when x stops changing (for n = 3 the iterates go 3, 2, 1, 2, 1, ...).",
        runaway_zh="牛顿迭代从 x = n 开始单调减小，下一个值不再变小时就结束了：以 x <= n // x 作为停止条件，"
                   "而不是等 x 不再变化（n = 3 时迭代值是 3、2、1、2、1……）。",
        title_zh="手撕代码：牛顿迭代法求整数平方根",
        question="Integer square root by Newton's method.",
        question_zh="用牛顿迭代法求整数平方根，同样不能溢出。",
        explanation="Newton's iteration on x^2 - n, in integers, decreases from x_0 = n until it stops "
                    "decreasing; that is the answer. Each step is the midpoint of x and n // x, which can be "
                    "written without overflow too.",
        explanation_zh="对 x² − n 做整数牛顿迭代，从 x_0 = n 开始单调减小，直到不再减小为止，这时的 x "
                       "就是答案。每一步"
                       "都是 x 与 n // x 的中点，同样可以写成不会溢出的形式。",
        hints_zh=("从 x = n（≥ sqrt(n)）开始；每一步取 x 与 n // x 的中点。",
                  "手算一下 n = 3：3 → 2 → 1 → 2 → 1……应该在什么时候停？",
                  "x = n = 2^31 − 1 时 x + n // x 会溢出。令 q = n // x < x，中点就是 q + (x − q) // 2。"),
    ),
]
