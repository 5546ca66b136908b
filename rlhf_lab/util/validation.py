"""One way to check a setting, used by every config in the package.

Each check raises `ValueError` whose message names the field, states what is allowed and shows
the value received, e.g. ``learning_rate must satisfy 0 < learning_rate, got -1``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any


def check_number(name: str, value: Any, low: float | None = None, high: float | None = None,
                 low_open: bool = False, high_open: bool = False, integer: bool = False) -> None:
    """Raise ValueError naming `name` unless `value` is a finite number (an int if `integer`) with
    low (<|<=) value (<|<=) high. Booleans are refused: `True` is not a count."""
    kind = "an integer" if integer else "a number"
    ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok_type or (not integer and not math.isfinite(value)):
        raise ValueError(f"{name} must be {kind}, got {value!r}")
    lo = "" if low is None else (f"{low} < " if low_open else f"{low} <= ")
    hi = "" if high is None else (f" < {high}" if high_open else f" <= {high}")
    bad = (low is not None and (value <= low if low_open else value < low)) or (
        high is not None and (value >= high if high_open else value > high))
    if bad:
        raise ValueError(f"{name} must satisfy {lo}{name}{hi}, got {value!r}")


def check_choice(name: str, value: Any, choices: tuple) -> None:
    """Raise ValueError naming `name` and listing `choices` unless `value` is one of them."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


def check_bool(name: str, value: Any) -> None:
    """Raise ValueError naming `name` unless `value` is True or False."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")


def check_optional(check: Callable[..., None], name: str, value: Any, *args: Any, **kwargs: Any) -> None:
    """Run `check(name, value, *args, **kwargs)` unless `value` is None (a setting left unset).

    e.g. check_optional(check_number, "seed", seed, integer=True); the message adds that None is allowed.
    """
    if value is None:
        return
    try:
        check(name, value, *args, **kwargs)
    except ValueError as error:
        raise ValueError(f"{error}; None is also allowed") from None


def check_known(name: str, keys, known) -> None:
    """Raise ValueError for the first of `keys` not in `known`, naming the closest known one:
    ``unknown GRPOConfig field 'learnig_rate'; did you mean 'learning_rate'?``"""
    import difflib

    for key in keys:
        if key not in known:
            close = difflib.get_close_matches(str(key), list(known), n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(sorted(known))}"
            raise ValueError(f"unknown {name} field {key!r}; {hint}")


_VALIDATING: set[int] = set()  # ids of configs whose checks are running (their own reassignments pass)


class Validated:
    """Mixin for a config dataclass whose `__post_init__` checks its fields: assigning a field after
    construction runs the same checks, so `config.learning_rate = float("nan")` raises as the
    constructor would, and the field keeps its old value. (A config is read by the trainer at every
    step: an unchecked assignment would reach the weights.)"""

    def __setattr__(self, name: str, value: Any) -> None:
        fields = getattr(type(self), "__dataclass_fields__", {})
        if name not in fields or name not in self.__dict__ or id(self) in _VALIDATING:
            object.__setattr__(self, name, value)  # construction, or a reassignment inside the checks
            return
        old = self.__dict__[name]
        object.__setattr__(self, name, value)
        _VALIDATING.add(id(self))
        try:
            self.__post_init__()
        except BaseException:
            object.__setattr__(self, name, old)
            raise
        finally:
            _VALIDATING.discard(id(self))
