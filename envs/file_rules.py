"""What an env spec read from a file may ask for beyond its environment: which wrappers, which keyword values.

A file's spec is data, but a wrapper or a keyword can still act: ``gymnasium.wrappers:RecordVideo`` with a
``video_folder`` of the file's choosing writes files wherever the file says, and a huge ``corridor_length``
makes every episode endless. So, for specs read from files (:func:`envs.resolve.resolve_env`):

* **Wrappers by callable, not by module.** A wrapper's entry point must resolve to one of
  :data:`HARMLESS_WRAPPERS` (compared by identity, so any module path that names the same class is fine) --
  unless its module lies under a module the user allowed explicitly (``--allow-env-modules``), which trusts that
  code. These are what Gymnasium itself adds from spec fields (``TimeLimit``, ``OrderEnforcing``,
  ``PassiveEnvChecker``), episode statistics, and the observation flattening / masking wrappers of this project
  (``envs/wrappers.py``); the project's own datasets name no other (their ``additional_wrappers`` is empty).
* **No paths.** A keyword (of the env or of a wrapper) whose name says it is a path (``video_folder``,
  ``xml_file``, ``log_dir``, ``path`` ...) or whose string value looks like one (a path separator, a leading
  ``~``) is refused, whoever allowed the module: a file must not choose where a process reads or writes.
* **Bounded sizes.** Integer keyword values and ``max_episode_steps`` are at most :data:`MAX_FILE_INT`
  (their magnitude, nested lists and dicts included), and a kwargs tree at most :data:`MAX_KWARGS_ITEMS` items.

Every refusal is an :class:`~envs.resolve.EnvRefusedError` naming the spec, the file and the keyword.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "HARMLESS_WRAPPERS",
    "MAX_FILE_INT",
    "MAX_KWARGS_ITEMS",
    "check_file_kwargs",
    "harmless_wrapper",
    "wrapper_refusal",
]

HARMLESS_WRAPPERS: tuple[str, ...] = (
    "gymnasium.wrappers:TimeLimit",
    "gymnasium.wrappers:OrderEnforcing",
    "gymnasium.wrappers:PassiveEnvChecker",
    "gymnasium.wrappers:RecordEpisodeStatistics",
    "gymnasium.wrappers:FlattenObservation",
    "envs.wrappers:FloatFlattenObservation",
    "envs.wrappers:MaskObservation",
)
"""The wrappers a file's env spec may name (they neither write files nor run code chosen by the file)."""
MAX_FILE_INT = 100_000
"""Largest integer magnitude a file's env keyword (e.g. ``corridor_length``) or time limit may hold."""
MAX_KWARGS_ITEMS = 1_000
"""Largest number of values in a file's kwargs (nested lists and dicts counted)."""

_PATH_NAME = re.compile(
    r"(^|_)(path|paths|dir|dirs|directory|folder|file|files|filename|filepath|fname|root|log|logdir)$",
    re.IGNORECASE,
)
_Refuse = Callable[[str], Exception]


def _load(entry_point: str) -> Any:
    module, attr = entry_point.split(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def harmless_wrapper(entry_point: str) -> bool:
    """Whether ``entry_point`` (a ``module:Class`` of an allowed package) is one of :data:`HARMLESS_WRAPPERS`.

    Only called for modules under the default packages, so importing it runs no code a file chose."""
    try:
        obj = _load(entry_point)
    except (ImportError, AttributeError, ValueError):
        return False
    for name in HARMLESS_WRAPPERS:
        try:
            if _load(name) is obj:
                return True
        except (ImportError, AttributeError):  # an optional package or an older gymnasium lacks it
            continue
    return False


def wrapper_refusal(
    entry_point: Any, *, trusted: Callable[[str], bool], default: Callable[[str], bool]
) -> str | None:
    """Why a file may not name wrapper ``entry_point`` (None: it may). ``trusted(module)``: the user allowed the
    module explicitly; ``default(module)``: it lies under a default package (only then is it imported)."""
    if not isinstance(entry_point, str) or entry_point.count(":") != 1:
        return f"wrapper entry point {entry_point!r} is not a 'module:attribute' string"
    module = entry_point.split(":")[0]
    if trusted(module) or (default(module) and harmless_wrapper(entry_point)):
        return None
    return f"wrapper {entry_point!r} is not one of the wrappers a file may name {list(HARMLESS_WRAPPERS)}"


def _looks_like_path(value: str) -> bool:
    return "/" in value or "\\" in value or value.startswith("~")


def check_file_kwargs(kwargs: Mapping[str, Any], where: str, refuse: _Refuse) -> None:
    """Refuse (``raise refuse(reason)``) path keywords, path-like strings and oversized numbers in ``kwargs``."""
    count = 0

    def visit(value: Any, key: str) -> None:
        nonlocal count
        count += 1
        if count > MAX_KWARGS_ITEMS:
            raise refuse(f"{where} holds more than {MAX_KWARGS_ITEMS} values")
        if isinstance(value, bool) or value is None:
            return
        if isinstance(value, int) and abs(value) > MAX_FILE_INT:
            raise refuse(
                f"{where} {key}={value} is larger than {MAX_FILE_INT:,} (a value from a file that sizes "
                "work is bounded; pass such a value on the command line instead)"
            )
        if isinstance(value, str) and _looks_like_path(value):
            raise refuse(f"{where} {key}={value!r} looks like a path; files may not name paths")
        if isinstance(value, Mapping):
            for name, item in value.items():
                if isinstance(name, str) and _PATH_NAME.search(name):
                    raise refuse(f"{where} names a path option {name!r}; files may not name paths")
                visit(item, f"{key}.{name}" if key else str(name))
        elif isinstance(value, list | tuple):
            for i, item in enumerate(value):
                visit(item, f"{key}[{i}]")

    visit(dict(kwargs), "")
