"""The registry: name -> (options dataclass, module class, capabilities), per family.

Every variant registers itself with one decorator line in its own module::

    @register("attention", "performer", options=PerformerOptions,
              capabilities=Capabilities(causal=True, exact=False, streaming="exact"))
    class PerformerAttention(Attention): ...

Modules are discovered by importing every module of the ``position``, ``attention``, ``memory`` and ``depth``
sub-packages and the ``blocks`` module the first time the registry is read, so adding a variant is one new file,
one ``register`` line and one test file.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from rl_transformers.backbone.options import check_choice, check_types
from rl_transformers.utils.errors import UserError, closest

Streaming = Literal["exact", "window", "none"]
FAMILIES = ("attention", "position", "memory", "block", "depth")
_PACKAGES = ("position", "attention", "memory", "depth")
_MODULES = ("blocks",)


@dataclass(frozen=True)
class Capabilities:
    """What a registry entry can do (see docs/design.md)."""

    causal: bool = True
    """Supports causal (autoregressive) masking."""
    exact: bool = True
    """Equals dense softmax attention under its own mask / bias (False: an approximation)."""
    streaming: Streaming = "exact"
    """exact: chunked == full run; window: state is a bounded window of past inputs; none: caller recomputes."""
    noncausal: bool = True
    """Supports bidirectional (non-causal) attention."""

    def __post_init__(self) -> None:
        check_choice("streaming", self.streaming, Streaming)


@dataclass(frozen=True)
class Entry:
    family: str
    name: str
    cls: type[Any]
    options: type
    capabilities: Capabilities

    def validate(self, cfg: Any, options: Any) -> None:
        """Reject incompatible combinations at construction (the class may add its own ``check_config``)."""
        caps = self.capabilities
        if cfg.causal and not caps.causal:
            raise ValueError(
                f"{self.family} {self.name!r} does not support causal=True (it needs the whole sequence); "
                f"use causal=False or another {self.family}"
            )
        if not cfg.causal and not caps.noncausal:
            raise ValueError(f"{self.family} {self.name!r} is causal-only; set causal=True")
        check = getattr(self.cls, "check_config", None)
        if check is not None:
            check(cfg, options)


_REGISTRY: dict[str, dict[str, Entry]] = {family: {} for family in FAMILIES}
_loaded = False  # True from the start of the first load (so lookups made while importing see it)
_done = False
_load_lock = threading.RLock()  # re-entrant: a module imported by _load may itself look names up


def register(
    family: str, name: str, *, options: type, capabilities: Capabilities | None = None
) -> Callable[[type], type]:
    """Class decorator adding an entry to the registry."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; valid families: {list(FAMILIES)}")
    if not dataclasses.is_dataclass(options):
        raise TypeError(f"options of {family} {name!r} must be a dataclass, got {options!r}")

    def decorate(cls: type) -> type:
        existing = _REGISTRY[family].get(name)
        if existing is not None and existing.cls.__qualname__ != cls.__qualname__:
            raise ValueError(
                f"{family} {name!r} is registered twice ({existing.cls.__qualname__}, {cls.__qualname__})"
            )
        _REGISTRY[family][name] = Entry(family, name, cls, options, capabilities or Capabilities())
        cls.registry_name = name  # type: ignore[attr-defined]
        cls.Options = options  # type: ignore[attr-defined]
        cls.capabilities = capabilities or Capabilities()  # type: ignore[attr-defined]
        return cls

    return decorate


def _load() -> None:
    """Import every variant module once; other threads wait until the registry is complete."""
    global _loaded, _done
    if _done:
        return
    with _load_lock:
        if _loaded:  # finished by another thread, or a recursive lookup from inside the imports below
            return
        _loaded = True
        try:
            base = __name__.rsplit(".", 1)[0]
            order = [f"{base}.{mod}" for mod in _MODULES]
            for pkg_name in _PACKAGES:
                pkg = importlib.import_module(f"{base}.{pkg_name}")
                infos = sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name)
                order += [f"{pkg.__name__}.{info.name}" for info in infos if not info.name.startswith("_")]
            for module in order:
                importlib.import_module(module)
        except BaseException:
            _loaded = False
            raise
        _sort(order)
        _done = True


def _sort(order: list[str]) -> None:
    """Put each family's entries in the order of ``order`` (their modules), whatever imported them first.

    A test or a script that imports one variant module before the registry loads registers that variant
    first; without this, ``available()`` (and every table, parametrization and document built from it) would
    depend on import history. Within a module the decorators' order is kept; entries of modules outside
    ``order`` (registered from elsewhere) follow, in registration order.
    """
    rank = {module: i for i, module in enumerate(order)}
    for family, entries in _REGISTRY.items():
        ranked = sorted(entries.values(), key=lambda e: rank.get(e.cls.__module__, len(rank)))
        _REGISTRY[family] = {entry.name: entry for entry in ranked}


def _unknown(kind: str, value: str, valid: list[str]) -> UserError:
    match = closest(value, valid)
    hint = f" Did you mean {match!r}?" if match else ""
    return UserError(f"unknown {kind} {value!r}.{hint} Valid {kind} names: {valid}")


def get(family: str, name: str) -> Entry:
    """The registry entry of ``family`` called ``name`` (ValueError listing valid names otherwise)."""
    _load()
    if family not in _REGISTRY:
        raise _unknown("family", family, list(FAMILIES))
    entries = _REGISTRY[family]
    if name not in entries:
        raise _unknown(family, name, sorted(entries))
    return entries[name]


def available() -> dict[str, list[str]]:
    """Registered names per family: {"attention": [...], "position": [...], ...}."""
    _load()
    return {family: list(entries) for family, entries in _REGISTRY.items()}


def capabilities(family: str, name: str) -> Capabilities:
    """Capabilities of one entry, e.g. ``capabilities("attention", "performer")``."""
    return get(family, name).capabilities


def build_options(family: str, name: str, options: Any) -> Any:
    """Validate ``options`` (dict or dataclass) against the entry's options dataclass and return an instance."""
    entry = get(family, name)
    if isinstance(options, entry.options):
        return options
    if options is None:
        options = {}
    if dataclasses.is_dataclass(options) and not isinstance(options, type):
        raise UserError(f"{family} {name!r} takes {entry.options.__name__}, got {type(options).__name__}")
    if not isinstance(options, dict):
        raise UserError(
            f"{family}_options for {name!r} must be a dict or {entry.options.__name__}, got {options!r}"
        )
    valid = [f.name for f in dataclasses.fields(entry.options)]
    for key in options:
        if key not in valid:
            match = closest(key, valid)
            hint = f" Did you mean {match!r}?" if match else ""
            raise UserError(
                f"unknown option {key!r} for {family} {name!r}.{hint} Valid options: {valid or '(none)'}"
            )
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in options.items()}
    check_types(entry.options, values, f"{family} {name!r} option ")
    try:
        return entry.options(**values)
    except TypeError as err:  # e.g. a wrong type inside a value the annotation check cannot see
        raise UserError(f"bad options for {family} {name!r}: {err}") from err
