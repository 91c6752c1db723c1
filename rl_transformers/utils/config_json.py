"""Configs saved as JSON and rebuilt from it (for ``--resume`` and the run records).

A run's config (a nested frozen dataclass) is written to ``config.json`` by :func:`to_jsonable`
(dataclasses -> dicts, tuples -> lists, ``Path`` -> str, ``Enum`` -> its value) and rebuilt by
:func:`from_dict`, which reads the field type hints to turn lists back into tuples, strings into paths and
enums, and nested dicts into nested dataclasses.
"""

from __future__ import annotations

import collections.abc as cabc
import dataclasses
import difflib
import enum
import json
import types
import typing
from collections.abc import Mapping
from pathlib import Path, PurePath
from typing import Any, TypeVar

from rl_transformers.utils.atomic import atomic_write_json

__all__ = ["from_dict", "load_config", "save_config", "to_jsonable"]

T = TypeVar("T")


def to_jsonable(obj: Any, *, strict: bool = True) -> Any:
    """``obj`` as JSON-serialisable data (dict / list / str / number / bool / None).

    Dataclasses become dicts of their fields, mappings dicts with ``str`` keys, tuples/lists/sets lists,
    ``Path`` a string, an ``Enum`` its value, NumPy/torch scalars and arrays numbers and lists,
    ``torch.dtype``/``torch.device`` strings. Anything else raises ``TypeError`` naming where it was found,
    or with ``strict=False`` becomes ``str(obj)`` (for display, e.g. hyper-parameter tables).
    """
    return _to_jsonable(obj, "config", strict)


def _to_jsonable(obj: Any, where: str, strict: bool) -> Any:
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    if isinstance(obj, enum.Enum):
        return _to_jsonable(obj.value, where, strict)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {
            f.name: _to_jsonable(getattr(obj, f.name), f"{where}.{f.name}", strict)
            for f in dataclasses.fields(obj)
        }
    if isinstance(obj, Mapping):
        return {_key(k): _to_jsonable(v, f"{where}[{k!r}]", strict) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_to_jsonable(v, f"{where}[{i}]", strict) for i, v in enumerate(obj)]
    if isinstance(obj, set | frozenset):
        items = [_to_jsonable(v, f"{where}{{}}", strict) for v in obj]
        try:
            return sorted(items)
        except TypeError:
            return items
    if isinstance(obj, PurePath):
        return str(obj)
    tolist = getattr(obj, "tolist", None)  # NumPy arrays/scalars and torch tensors
    if callable(tolist) and type(obj).__module__.split(".")[0] in ("numpy", "torch"):
        return _to_jsonable(tolist(), where, strict)
    if type(obj).__module__.split(".")[0] == "torch" and type(obj).__name__ in ("dtype", "device"):
        return str(obj)
    if strict:
        raise TypeError(f"{where}: cannot convert {type(obj).__name__} {obj!r} to JSON")
    return str(obj)


def _key(key: Any) -> str:
    if isinstance(key, enum.Enum):
        key = key.value
    return key if isinstance(key, str) else str(key)


def save_config(run_dir: str | Path, config: Any, filename: str = "config.json") -> Path:
    """Write ``to_jsonable(config)`` to ``run_dir/filename`` (indented, atomically) and return its path."""
    return atomic_write_json(Path(run_dir) / filename, to_jsonable(config))


def load_config(path: str | Path, cls: type[T] | None = None) -> T | dict[str, Any]:
    """Read a ``config.json`` (or the one inside run directory ``path``); rebuild ``cls`` when given."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if cls is None else from_dict(cls, data)


def from_dict(
    cls: type[T], data: Mapping[str, Any], *, strict: bool = True, require_sections: bool = False
) -> T:
    """Rebuild dataclass ``cls`` (nested dataclasses included) from the output of :func:`to_jsonable`.

    Field type hints guide the conversion: ``tuple[...]``/``list[...]``/``set``, ``dict[K, V]``, ``Path``,
    ``Enum`` subclasses, nested dataclasses, ``X | None`` and other unions. Missing keys take the field
    defaults (configs saved by older versions still load); unknown keys raise ``ValueError`` listing the
    valid fields, unless ``strict=False`` (then they are ignored); ``require_sections=True`` refuses missing
    nested-dataclass fields (a config file missing its ``ppo`` / ``backbone`` section). Values are type-checked
    against the hints (``int``, ``float`` (ints accepted), ``bool``, ``str``, ``Literal``, paths): a wrong type
    raises ``TypeError`` naming the field. ``__post_init__`` validation runs as usual (its errors get the
    field path).
    """
    if require_sections:
        _check_sections(cls, data, cls.__name__)
    return _from_dict(cls, data, cls.__name__, strict)


def _from_dict(cls: type[T], data: Mapping[str, Any], where: str, strict: bool) -> T:
    if not (dataclasses.is_dataclass(cls) and isinstance(cls, type)):
        raise TypeError(f"{where}: from_dict needs a dataclass type, got {cls!r}")
    if not isinstance(data, Mapping):
        raise TypeError(f"{where}: expected a dict for {cls.__name__}, got {type(data).__name__}: {data!r}")
    try:
        hints = typing.get_type_hints(cls)
    except (NameError, TypeError):  # unresolvable forward references: fall back to raw annotations
        hints = {}
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [k for k in data if k not in fields]
    if unknown and strict:
        key = unknown[0]
        close = difflib.get_close_matches(key, list(fields), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"{where}: unknown field {key!r}{hint}; valid fields: {sorted(fields)}")
    kwargs = {}
    for name, value in data.items():
        if name in fields:
            kwargs[name] = _convert(hints.get(name, Any), value, f"{where}.{name}", strict)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as err:  # __post_init__ validation
        raise ValueError(f"{where}: {err}") from err


def _section_type(tp: Any) -> type | None:
    """The dataclass a field holds (``Annotated`` unwrapped), else None."""
    if typing.get_origin(tp) is typing.Annotated:
        tp = typing.get_args(tp)[0]
    return tp if isinstance(tp, type) and dataclasses.is_dataclass(tp) else None


def _check_sections(cls: type, data: Any, where: str) -> None:
    """Every nested-dataclass field of ``cls`` is present in ``data`` (recursively)."""
    if not isinstance(data, Mapping):
        return
    try:
        hints = typing.get_type_hints(cls, include_extras=True)
    except (NameError, TypeError):
        return
    for f in dataclasses.fields(cls):
        section = _section_type(hints.get(f.name, Any)) if f.init else None
        if section is None:
            continue
        if f.name not in data:
            raise ValueError(f"{where}: section {f.name!r} is missing (present: {sorted(data)})")
        _check_sections(section, data[f.name], f"{where}.{f.name}")


_NONE_TYPE = type(None)
_ABSTRACT_SEQUENCES = (cabc.Sequence, cabc.MutableSequence, cabc.Set, cabc.MutableSet, cabc.Iterable)
_ABSTRACT_MAPPINGS = (cabc.Mapping, cabc.MutableMapping)


def _convert(tp: Any, value: Any, where: str, strict: bool) -> Any:
    """``value`` (JSON data) converted to type hint ``tp`` where the hint says how; otherwise unchanged."""
    if tp is Any or isinstance(tp, typing.TypeVar | str):
        return value
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        return _convert(args[0], value, where, strict)
    if origin is typing.Union or origin is types.UnionType:
        return _convert_union(args, value, where, strict)
    if origin is typing.Literal:
        if value not in args:
            raise ValueError(f"{where}: {value!r} is not one of {list(args)}")
        return value
    if value is None:
        if tp in _PRIMITIVES or (isinstance(tp, type) and dataclasses.is_dataclass(tp)):
            raise TypeError(f"{where}: expected {_type_name(tp)}, got null")
        return None
    if tp in _PRIMITIVES:
        return _check_primitive(tp, value, where)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _from_dict(tp, value, where, strict)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        if isinstance(value, tp):
            return value
        try:
            return tp(value)
        except ValueError:
            if isinstance(value, str) and value in tp.__members__:
                return tp[value]
            valid = [m.value for m in tp]
            raise ValueError(f"{where}: {value!r} is not a valid {tp.__name__}; valid: {valid}") from None
    if isinstance(tp, type) and issubclass(tp, PurePath):
        if not isinstance(value, str | PurePath):
            raise TypeError(f"{where}: expected a path string, got {type(value).__name__} {value!r}")
        return tp(value)
    container = origin if origin is not None else tp
    if container in (tuple, list, set, frozenset) or container in _ABSTRACT_SEQUENCES:
        if not isinstance(value, list | tuple | set | frozenset):
            raise TypeError(f"{where}: expected a list for {tp}, got {type(value).__name__}: {value!r}")
        if container is tuple and len(args) == 2 and args[1] is Ellipsis:
            items = [_convert(args[0], v, f"{where}[{i}]", strict) for i, v in enumerate(value)]
        elif container is tuple and args:
            if len(args) != len(value):
                raise ValueError(f"{where}: expected {len(args)} items for {tp}, got {len(value)}")
            items = [_convert(a, v, f"{where}[{i}]", strict) for i, (a, v) in enumerate(zip(args, value))]
        else:
            item_tp = args[0] if args else Any
            items = [_convert(item_tp, v, f"{where}[{i}]", strict) for i, v in enumerate(value)]
        if container in (list, set, frozenset):
            return container(items)
        return tuple(items)  # tuple and abstract Sequence: immutable, as frozen configs want
    if container in (dict, Mapping) or container in _ABSTRACT_MAPPINGS:
        if not isinstance(value, Mapping):
            raise TypeError(f"{where}: expected a dict for {tp}, got {type(value).__name__}: {value!r}")
        key_tp, val_tp = args if len(args) == 2 else (Any, Any)
        return {
            _convert(key_tp, _json_key(key_tp, k), f"{where}", strict): _convert(
                val_tp, v, f"{where}[{k!r}]", strict
            )
            for k, v in value.items()
        }
    return value


_PRIMITIVES = (bool, int, float, str)


def _type_name(tp: Any) -> str:
    return {bool: "a bool", int: "an int", float: "a number", str: "a string"}.get(tp, str(tp))


def _check_primitive(tp: type, value: Any, where: str) -> Any:
    """``value`` if it is a ``tp`` (ints are accepted as floats; bools are not numbers), else TypeError."""
    if tp is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, tp) and (tp is bool or not isinstance(value, bool)):
        return value
    raise TypeError(f"{where}: expected {_type_name(tp)}, got {type(value).__name__} {value!r}")


def _json_key(key_tp: Any, key: Any) -> Any:
    """JSON object keys are strings: turn them back into ints/floats when the hint asks for it."""
    if key_tp is int and isinstance(key, str):
        return int(key)
    if key_tp is float and isinstance(key, str):
        return float(key)
    return key


def _convert_union(args: tuple[Any, ...], value: Any, where: str, strict: bool) -> Any:
    if value is None and _NONE_TYPE in args:
        return None
    options = [a for a in args if a is not _NONE_TYPE]
    # an exact primitive match wins (``int | str`` with "3" stays a string)
    for option in options:
        if option in (bool, int, float, str) and type(value) is option:
            return value
    errors = []
    for option in options:
        try:
            return _convert(option, value, where, strict)
        except (TypeError, ValueError) as exc:
            errors.append(str(exc))
    raise ValueError(f"{where}: {value!r} matches none of {options}: {errors}")
