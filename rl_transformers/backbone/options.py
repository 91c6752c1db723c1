"""Validation shared by the options dataclasses of the registry entries (and :class:`BackboneConfig`).

Two layers:

* :func:`check_types` runs in :func:`registry.build_options` before an options dataclass is built from a dict
  (JSON / CLI / config.json): every given value must match its field's annotation (``int``, ``float``, ``bool``,
  ``str``, ``Literal[...]`` as ``str``, ``X | None``, ``tuple[...]``), so ``{"mem_len": "abc"}`` is refused with
  the field, the value and the expected type instead of failing later inside a comparison.
* the ``check_*`` helpers are what each options class calls in ``__post_init__`` for values: ints with a minimum,
  numbers in a range, probabilities, (rows, cols) pairs, position lists, divisors, aux-loss weights (each a loss
  the model produces) and ``Literal`` choices — the message lists the valid choices and the closest match
  (difflib).

Errors are :class:`~rl_transformers.utils.errors.UserError` (a ``ValueError``).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any, Literal, Union

from rl_transformers.utils.errors import UserError, choice_hint, closest, describe


# -- choices --------------------------------------------------------------------------------------------------
def literal_choices(tp: Any) -> tuple[Any, ...]:
    """The values of a ``Literal[...]`` type (also inside ``Literal[...] | None``)."""
    if typing.get_origin(tp) is Literal:
        return typing.get_args(tp)
    out: tuple[Any, ...] = ()
    for arg in typing.get_args(tp):
        out += literal_choices(arg)
    return out


def check_choice(label: str, value: Any, choices: Any) -> None:
    """``value`` must be one of ``choices`` (a tuple or a ``Literal`` type); the message suggests the closest."""
    valid = literal_choices(choices) if not isinstance(choices, (tuple, list)) else tuple(choices)
    if value in valid:
        return
    match = closest(value, valid)
    hint = f" Did you mean {match!r}?" if match else ""
    raise UserError(f"{label}={value!r} is not one of {list(valid)} (unknown {label} {value!r}).{hint}")


# -- numbers --------------------------------------------------------------------------------------------------
def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_int(label: str, value: Any, minimum: int = 1, *, optional: bool = False) -> None:
    """An int >= ``minimum`` (``None`` allowed when ``optional``)."""
    if optional and value is None:
        return
    if not _is_int(value) or value < minimum:
        extra = " or None" if optional else ""
        raise UserError(f"{label} must be an int >= {minimum}{extra}, got {value!r}")


def check_number(
    label: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    optional: bool = False,
) -> None:
    """A finite number in the interval given by ``low`` / ``high`` (open ends with ``*_open``)."""
    if optional and value is None:
        return
    ok = _is_number(value) and math.isfinite(value)
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    if not ok:
        extra = " or None" if optional else ""
        if high is None and low is not None:
            bound = f"{'>' if low_open else '>='} {low:g}"
        elif low is None and high is not None:
            bound = f"{'<' if high_open else '<='} {high:g}"
        else:
            left, right = "(" if low_open else "[", ")" if high_open else "]"
            bound = f"in {left}{low:g}, {high:g}{right}" if low is not None else "finite"
        raise UserError(
            f"{label} must be {'a number ' if bound[0] in '<>' else ''}{bound}{extra}, got {value!r}"
        )


def check_positive(label: str, value: Any, *, optional: bool = False) -> None:
    """A finite number > 0."""
    check_number(label, value, low=0.0, low_open=True, optional=optional)


def check_probability(label: str, value: Any, *, allow_one: bool = False, optional: bool = False) -> None:
    """A probability in [0, 1) (dropout), or [0, 1] with ``allow_one``."""
    check_number(label, value, low=0.0, high=1.0, high_open=not allow_one, optional=optional)


# -- tuples ---------------------------------------------------------------------------------------------------
def check_pair(label: str, value: Any, minimum: int) -> None:
    """A (rows, cols) pair of ints >= ``minimum``."""
    if not (isinstance(value, tuple) and len(value) == 2 and all(_is_int(v) and v >= minimum for v in value)):
        raise UserError(f"{label} must be a pair (rows, cols) of ints >= {minimum}, got {value!r}")


def check_positions(label: str, value: Any) -> None:
    """A tuple of distinct positions (ints >= 0)."""
    if not isinstance(value, tuple) or not all(_is_int(p) and p >= 0 for p in value):
        raise UserError(f"{label} must be a tuple of positions (ints >= 0), got {value!r}")
    if len(set(value)) != len(value):
        raise UserError(f"{label} has repeated positions: {value!r}")


# -- field types (before construction) ------------------------------------------------------------------------
def check_aux_weights(weights: Mapping[str, Any], produced: Iterable[str], source: str) -> None:
    """Every name in ``weights`` is an aux loss the model produces; every weight a finite number >= 0."""
    valid = sorted(set(produced))
    for name, weight in weights.items():
        if name not in valid:
            where = (
                f"valid for this backbone: {', '.join(valid)}"
                if valid
                else "this model produces no aux losses"
            )
            close = choice_hint(name, valid) if valid else ""
            hint = close[close.index(" (") :] if " (" in close else ""
            raise UserError(f"unknown aux loss {name!r}; {where}{hint}", source=source)
        check_number(f"{source} {name!r}", weight, low=0.0)


def check_divides(name: str, value: int, total: int, what: str, *, source: str | None = None) -> None:
    """``value`` (an int >= 1) divides ``total``; the message names ``name=value`` (``source``: its flag) and
    lists the valid values."""
    label = f"{name}={value}" + (f" ({source})" if source else "")
    check_int(label, value, 1)
    if total % value:
        divisors = [d for d in range(1, total + 1) if total % d == 0]
        shown = ", ".join(map(str, divisors[:12])) + (", ..." if len(divisors) > 12 else "")
        raise UserError(f"{label} does not divide {what}; valid: {shown}")


def _expected(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if tp is type(None):
        return "None"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_expected(a) for a in typing.get_args(tp))
    if origin is tuple:
        return "a list of values"
    return {bool: "true/false", int: "an int", float: "a number", str: "a string", dict: "a JSON object"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def _matches(value: Any, tp: Any) -> bool:
    """Does ``value`` fit annotation ``tp``? Unknown annotations accept anything (the class checks them)."""
    if tp is Any or tp is object:
        return True
    if tp is type(None):
        return value is None
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return any(_matches(value, a) for a in typing.get_args(tp))
    if origin is Literal:  # membership is the class's check (with its own message); here only the type
        return any(isinstance(value, type(a)) and _is_int(value) == _is_int(a) for a in typing.get_args(tp))
    if origin is tuple:  # JSON gives lists (build_options turns the outer one into a tuple)
        if not isinstance(value, (tuple, list)):
            return False
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_matches(v, args[0]) for v in value)
        if args and len(args) != len(value):
            return False
        return all(_matches(v, a) for v, a in zip(value, args, strict=False))
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return _is_int(value)
    if tp is float:
        return _is_number(value)
    if tp is str:
        return isinstance(value, str)
    if tp is dict or origin is dict:
        return isinstance(value, dict)
    return True


def check_types(cls: type, values: dict[str, Any], prefix: str) -> None:
    """Every value in ``values`` matches the annotation of the field of dataclass ``cls`` it is given for.

    ``prefix`` starts the message, e.g. ``"memory 'xl' option "`` or ``"BackboneConfig."``.
    """
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # an annotation that does not resolve: leave the checks to the class itself
        return
    names = {f.name for f in dataclasses.fields(cls)}
    for key, value in values.items():
        if key in names and key in hints and not _matches(value, hints[key]):
            raise UserError(f"{prefix}{key}={describe(value)} must be {_expected(hints[key])}")
