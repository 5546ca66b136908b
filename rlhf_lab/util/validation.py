"""One way to declare and check a setting, used by every config in the package.

A config is a dataclass whose fields say what they accept, next to the field:

    @dataclass
    class SFTConfig(Validated):
        learning_rate: float = setting(3e-3, gt=0, le=1, help="peak AdamW learning rate")
        task: str = setting("addition", choices=task_names, help="which task to imitate")

        def check(self) -> None:             # only the rules that tie two fields together
            if self.eval_examples > self.n_test: ...

The annotation gives the kind (int, float, bool, str, dict; `| None` also allows None), `gt` / `ge` /
`lt` / `le` the range, `choices` the allowed values (or a function returning them), `check` a
function `(name, value)` for anything else, and `help` what the field means (kept in the field's
metadata, as TRL's config dataclasses keep theirs). `Validated` checks every field at construction
and again whenever one is assigned, then runs the class's `check()`. A subclass that only changes a
default (`epsilon: float = 3e-4`) keeps the constraint its base class declared.

Each failure raises ValueError whose message names the field, states what is allowed and shows the
value received, e.g. ``learning_rate must satisfy 0 < learning_rate <= 1, got -1``.
"""

from __future__ import annotations

import dataclasses
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
    """Raise ValueError naming `name` and listing `choices` unless `value` is one of them (a bool
    only matches a bool: `1 == True` in Python, but 1 is not the choice True)."""
    if not any(value == choice and isinstance(value, bool) == isinstance(choice, bool) for choice in choices):
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


# ---------------------------------------------------------------------------------------- settings


@dataclasses.dataclass(frozen=True)
class Constraint:
    """What one field accepts: the kinds of its annotation, a range, choices, a custom check."""

    kinds: tuple[str, ...] = ()  # "int", "float", "bool", "str", "dict"; () = any
    optional: bool = False  # None is allowed (`X | None`)
    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    choices: tuple | Callable[[], tuple] | None = None
    check: Callable[[str, Any], None] | None = None

    def __call__(self, name: str, value: Any) -> None:
        """Raise ValueError naming `name` unless `value` satisfies this constraint."""
        if value is None and self.optional:
            return
        try:
            self._check(name, value)
        except ValueError as error:
            if self.optional:
                raise ValueError(f"{error}; None is also allowed") from None
            raise

    def _check(self, name: str, value: Any) -> None:
        if self.choices is not None:
            check_choice(name, value, tuple(self.choices() if callable(self.choices) else self.choices))
        elif self.kinds == ("bool",):
            check_bool(name, value)
        elif "int" in self.kinds or "float" in self.kinds:
            low, high = (self.gt, self.ge), (self.lt, self.le)
            check_number(name, value, low=next((b for b in low if b is not None), None),
                         high=next((b for b in high if b is not None), None), low_open=self.gt is not None,
                         high_open=self.lt is not None, integer="float" not in self.kinds)
        elif self.kinds == ("str",) and not isinstance(value, str):
            raise ValueError(f"{name} must be a string, got {value!r}")
        elif self.kinds == ("dict",) and not isinstance(value, dict):
            raise ValueError(f"{name} must be a dict, got {value!r}")
        if self.check is not None:
            self.check(name, value)


def setting(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING,
            gt: float | None = None, ge: float | None = None, lt: float | None = None,
            le: float | None = None, choices: tuple | Callable[[], tuple] | None = None,
            check: Callable[[str, Any], None] | None = None, help: str = "") -> Any:
    """A dataclass field of a `Validated` config that declares what it accepts (module docstring):
    `gt`/`ge` a lower bound (exclusive / inclusive), `lt`/`le` an upper one, `choices` the allowed
    values, `check(name, value)` any other rule. Its kind (and whether None is allowed) comes from
    the field's annotation."""
    if gt is not None and ge is not None or lt is not None and le is not None:
        raise TypeError("give at most one lower bound (gt or ge) and one upper bound (lt or le)")
    rule = {"gt": gt, "ge": ge, "lt": lt, "le": le, "choices": choices, "check": check}
    return dataclasses.field(default=default, default_factory=default_factory,
                             metadata={"setting": rule, "help": help})


def _annotation_kinds(annotation: Any) -> tuple[tuple[str, ...], bool]:
    """("int", "float"...) and whether None is allowed, from an annotation such as "int | None"."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    parts = [part.strip() for part in text.split("|")]
    known = ("int", "float", "bool", "str", "dict")
    kinds = tuple(part for part in parts if part != "None")
    return (kinds if all(kind in known for kind in kinds) else ()), "None" in parts


def constraints(config_class: type) -> dict[str, Constraint]:
    """Each declared field of a dataclass -> its Constraint. A field redeclared in a subclass with
    only a new default (no `setting`) keeps the rule of the nearest base class that declares one."""
    cached = config_class.__dict__.get("_constraints")
    if cached is not None:
        return cached
    rules: dict[str, Constraint] = {}
    for field in dataclasses.fields(config_class):
        declared = _declaration(config_class, field.name)
        if declared is not None:
            kinds, optional = _annotation_kinds(declared.type)
            rules[field.name] = Constraint(kinds=kinds, optional=optional, **declared.metadata["setting"])
    config_class._constraints = rules
    return rules


def _declaration(config_class: type, name: str) -> dataclasses.Field | None:
    """The field `name` as the nearest class in the MRO declares it with `setting`, or None."""
    for klass in config_class.__mro__:
        field = getattr(klass, "__dataclass_fields__", {}).get(name)
        if field is not None and "setting" in field.metadata:
            return field
    return None


def help_text(config_class: type) -> dict[str, str]:
    """{field: its help} for every field of a config class that declares one (a base class's help
    for a field a subclass only gives a new default)."""
    names = [field.name for field in dataclasses.fields(config_class)]
    declared = {name: _declaration(config_class, name) for name in names}
    return {name: field.metadata["help"] for name, field in declared.items()
            if field is not None and field.metadata["help"]}


_VALIDATING: set[int] = set()  # ids of configs whose checks are running (their own reassignments pass)


class Validated:
    """Mixin for a config dataclass whose fields are `setting`s: every field is checked at
    construction and whenever it is assigned later, then `check()` runs the rules between fields.
    A refused assignment raises and leaves the old value, so `config.learning_rate = float("nan")`
    fails as the constructor would. (A config is read by the trainer at every step: an unchecked
    assignment would reach the weights.)"""

    def __post_init__(self) -> None:
        for name, constraint in constraints(type(self)).items():
            constraint(name, getattr(self, name))
        _VALIDATING.add(id(self))
        try:
            self.check()
        finally:
            _VALIDATING.discard(id(self))

    def check(self) -> None:
        """The rules that tie fields together (each field's own rule is declared with it); may also
        set derived values. Raise ValueError naming the fields."""

    def __setattr__(self, name: str, value: Any) -> None:
        fields = getattr(type(self), "__dataclass_fields__", {})
        if name not in fields or name not in self.__dict__ or id(self) in _VALIDATING:
            object.__setattr__(self, name, value)  # construction, or a reassignment inside the checks
            return
        constraint = constraints(type(self)).get(name)
        if constraint is not None:
            constraint(name, value)
        old = self.__dict__[name]
        object.__setattr__(self, name, value)
        _VALIDATING.add(id(self))
        try:
            self.check()
        except BaseException:
            object.__setattr__(self, name, old)
            raise
        finally:
            _VALIDATING.discard(id(self))
