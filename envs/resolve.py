"""One safe resolver for every environment named by a flag or a file (dataset, checkpoint, config).

``gym.make("mod:Env-v0")`` imports ``mod`` and ``gym.make(EnvSpec)`` imports the spec's ``entry_point``, so an
env named by a file could run code (an HDF5 ``env_spec`` with ``entry_point = "os:system"``). Every path of
this project builds envs through :func:`resolve_env` / :func:`make_env` instead, with these rules:

* An id (``"CartPole-v1"``, ``"rlt/TMaze-v0"``) must be registered after ``import envs`` (and, when an id is
  unknown, after importing the installed optional packages ``minigrid`` / ``popgym``). Unknown ids raise
  :class:`UnknownEnvError` with the closest registered ids.
* A ``"module:Env-v0"`` prefix is imported only when ``module`` is allowed (below).
* A serialized :class:`~gymnasium.envs.registration.EnvSpec` (JSON text or dict) is parsed here -- never with
  ``EnvSpec.from_json`` -- and its ``entry_point`` (and each wrapper's / the vector entry point) is accepted
  when it is the entry point of a registered env, or its module lies under a module the user allowed, or its
  module lies under a default package (``gymnasium``, ``envs``, ``popgym``, ``minigrid``) *and* it names a
  ``gymnasium.Env`` subclass -- so a file cannot call functions such as ``gymnasium.make`` through an entry
  point. A wrapper must be one of a named list of harmless wrappers (or lie under a module the user allowed),
  keywords naming paths are refused and sizes bounded (:mod:`envs.file_rules`).

Anything else raises :class:`EnvRefusedError` naming the spec, the file / flag it came from and how to
allow it. Allowed modules: :data:`DEFAULT_ALLOWED_MODULES`, those given in ``allow_modules=`` and those
registered process-wide with :func:`allow_env_modules` (what the CLIs' ``--allow-env-modules`` flag / the
``allow_env_modules`` config field call). Allowing a module trusts its code: only allow modules you
installed yourself. Environment keyword arguments are checked against the constructor's signature
(:class:`EnvKwargsError` names the env, the bad keyword and the closest accepted ones).
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import importlib.util
import inspect
import json
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import gymnasium as gym
from gymnasium.envs.registration import EnvSpec, WrapperSpec

from envs.file_rules import check_file_kwargs, wrapper_refusal
from rl_transformers.utils.errors import UserError

__all__ = [
    "ALLOW_FLAG",
    "DEFAULT_ALLOWED_MODULES",
    "EnvKwargsError",
    "EnvRefusedError",
    "EnvResolutionError",
    "UnknownEnvError",
    "allow_env_modules",
    "allowed_env_modules",
    "check_env_kwargs",
    "make_env",
    "resolve_env",
]

DEFAULT_ALLOWED_MODULES: tuple[str, ...] = ("gymnasium", "envs", "popgym", "minigrid")
"""Packages whose environment classes a file may name by entry point."""
ALLOW_FLAG = "--allow-env-modules"
"""The CLI flag (config field ``allow_env_modules``) that extends the allow-list; named in the errors."""
_OPTIONAL_REGISTRARS = ("minigrid", "popgym")
_SPEC_FIELDS = {
    "id",
    "entry_point",
    "reward_threshold",
    "nondeterministic",
    "max_episode_steps",
    "order_enforce",
    "disable_env_checker",
    "kwargs",
    "additional_wrappers",
    "vector_entry_point",
}
_LEGACY_FIELDS = {"apply_api_compatibility", "autoreset"}  # written by older gymnasium versions; ignored
_lock = threading.Lock()
_user_allowed: set[str] = set()


class EnvResolutionError(UserError):
    """An environment named by a flag or a file could not be resolved (the message says why and how to fix).

    A :class:`~rl_transformers.utils.errors.UserError` (so a ``ValueError``): the CLIs print it without a
    traceback."""


class UnknownEnvError(EnvResolutionError):
    """The id is not registered (the message lists the closest registered ids)."""


class EnvRefusedError(EnvResolutionError):
    """The spec would import or call code outside the allowed modules."""


class EnvKwargsError(EnvResolutionError):
    """Keyword arguments the env's constructor does not accept."""


def allow_env_modules(modules: Iterable[str]) -> None:
    """Allow entry points / ``module:`` prefixes under ``modules`` for the rest of the process (CLI flag)."""
    with _lock:
        for module in modules:
            _check_module_name(module, "allow_env_modules")
            _user_allowed.add(module)


def allowed_env_modules(extra: Iterable[str] = ()) -> tuple[str, ...]:
    """The current allow-list: defaults, process-wide user modules and ``extra``."""
    with _lock:
        user = set(_user_allowed)
    return tuple(dict.fromkeys((*DEFAULT_ALLOWED_MODULES, *sorted(user), *extra)))


def _check_module_name(module: Any, where: str) -> None:
    if not isinstance(module, str) or not all(part.isidentifier() for part in module.split(".")):
        raise EnvResolutionError(f"{where}: {module!r} is not a dotted module name such as 'my_package.envs'")


def _under(module: str, roots: Iterable[str]) -> bool:
    return any(module == root or module.startswith(root + ".") for root in roots)


def _register_ours() -> None:
    module = importlib.import_module("envs")
    register = getattr(module, "register_all", None)
    if register is None:  # a stale editable install resolving ``envs`` to a namespace package
        register = importlib.import_module("envs.registry").register_all
    register()


def _import_optional_registrars() -> None:
    for name in _OPTIONAL_REGISTRARS:
        if importlib.util.find_spec(name) is not None:
            with contextlib.suppress(Exception):  # a broken optional install must not hide the real error
                importlib.import_module(name)


def _refused(what: str, source: str, module: str, reason: str) -> EnvRefusedError:
    return EnvRefusedError(
        f"refused env spec {what} from {source}: {reason}. Files (datasets, checkpoints, configs) may only name "
        f"registered environments or environment classes of the allowed modules {list(allowed_env_modules())}. "
        f"If you trust {source} and the module {module!r}, allow it with {ALLOW_FLAG} {module} "
        f"(config field allow_env_modules)."
    )


def _unknown(env_id: str, source: str) -> UnknownEnvError:
    ids = sorted(gym.registry)
    close = difflib.get_close_matches(env_id, ids, n=5, cutoff=0.5)
    if not close:  # e.g. "tmaze" for "rlt/TMaze-v0": compare case-insensitively without namespace / version
        lowered = {i.lower(): i for i in ids}
        close = [
            lowered[m] for m in difflib.get_close_matches(env_id.lower(), list(lowered), n=5, cutoff=0.4)
        ]
    hint = f" Closest registered ids: {close}." if close else ""
    return UnknownEnvError(
        f"unknown environment id {env_id!r} (from {source}): not registered with gymnasium after importing "
        f"envs{''.join(' and ' + m for m in _OPTIONAL_REGISTRARS if importlib.util.find_spec(m))}.{hint} "
        "List the ids with: python -c \"import gymnasium, envs; print('\\n'.join(gymnasium.registry))\""
    )


def _registered(env_id: str, source: str) -> EnvSpec:
    """The registered spec of a plain id (no ``module:`` prefix); unversioned ids take the latest version."""
    _register_ours()
    for attempt in range(2):
        spec = gym.registry.get(env_id)
        if spec is None:
            try:
                ns, name, version = gym.envs.registration.parse_env_id(env_id)
            except gym.error.Error:
                raise _unknown(env_id, source) from None
            if version is None:
                latest = gym.envs.registration.find_highest_version(ns, name)
                if latest is not None:
                    spec = gym.registry.get(gym.envs.registration.get_env_id(ns, name, latest))
        if spec is not None:
            return spec
        if attempt == 0:
            _import_optional_registrars()
    raise _unknown(env_id, source)


def _registered_entry_points() -> set[str]:
    points = set()
    for spec in gym.registry.values():
        for value in (spec.entry_point, spec.vector_entry_point):
            if isinstance(value, str):
                points.add(value)
    return points


def _check_entry_point(
    value: Any, base: type, what: str, source: str, allow: tuple[str, ...], user: tuple[str, ...]
) -> None:
    """Refuse an entry point a file may not name (see the module docstring); never imports a refused module."""
    if not isinstance(value, str) or value.count(":") != 1:
        raise _refused(what, source, "?", f"entry point {value!r} is not a 'module:attribute' string")
    module, attr = value.split(":")
    _check_module_name(module, f"entry point {value!r} of {what} from {source}")
    if value in _registered_entry_points() or _under(module, user):
        return
    if not _under(module, allow):
        raise _refused(what, source, module, f"entry point {value!r} lies outside the allowed modules")
    try:
        obj = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as err:
        raise EnvResolutionError(
            f"entry point {value!r} of {what} from {source} cannot be loaded: {err}"
        ) from None
    if not (inspect.isclass(obj) and issubclass(obj, base)):
        raise _refused(
            what,
            source,
            module,
            f"entry point {value!r} is not a {base.__module__}.{base.__qualname__} subclass",
        )


def _refused_value(what: str, source: str, reason: str) -> EnvRefusedError:
    return EnvRefusedError(f"refused env spec {what} from {source}: {reason}")


def _parse_spec(data: Any, source: str, allow: tuple[str, ...], user: tuple[str, ...]) -> EnvSpec:
    if isinstance(data, str | bytes):
        try:
            data = json.loads(data)
        except ValueError as err:
            raise EnvResolutionError(f"env spec from {source} is not valid JSON: {err}") from None
    if not isinstance(data, Mapping):
        raise EnvResolutionError(f"env spec from {source} must be a JSON object, got {type(data).__name__}")
    unknown = set(data) - _SPEC_FIELDS - _LEGACY_FIELDS
    if unknown:
        raise EnvResolutionError(f"env spec from {source} has unknown field(s) {sorted(unknown)}")
    env_id = data.get("id")
    if not isinstance(env_id, str) or not env_id:
        raise EnvResolutionError(f"env spec from {source} has no string 'id' (got {env_id!r})")
    what = repr(env_id)
    kwargs = data.get("kwargs") or {}
    if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
        raise EnvResolutionError(f"env spec {what} from {source}: 'kwargs' must be an object, got {kwargs!r}")
    for name, kind in (("max_episode_steps", int), ("reward_threshold", int | float)):
        value = data.get(name)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            raise EnvResolutionError(f"env spec {what} from {source}: {name} must be a number, got {value!r}")
    check_file_kwargs(
        {"max_episode_steps": data.get("max_episode_steps")}, "its", lambda r: _refused_value(what, source, r)
    )
    for name in ("nondeterministic", "order_enforce", "disable_env_checker"):
        if name in data and not isinstance(data[name], bool):
            raise EnvResolutionError(
                f"env spec {what} from {source}: {name} must be true/false, got {data[name]!r}"
            )
    entry_point = data.get("entry_point")
    if entry_point is None:  # only the id: use the registered env
        entry_point = _registered(env_id.split(":")[-1], source).entry_point
        if not isinstance(entry_point, str):
            raise EnvResolutionError(f"env spec {what} from {source} has no entry point")
    _check_entry_point(entry_point, gym.Env, what, source, allow, user)
    vector_entry_point = data.get("vector_entry_point")
    if vector_entry_point is not None:
        _check_entry_point(vector_entry_point, gym.vector.VectorEnv, what, source, allow, user)
    check_file_kwargs(kwargs, "its kwargs", lambda reason: _refused_value(what, source, reason))
    wrappers = []
    for index, raw in enumerate(data.get("additional_wrappers") or ()):
        if not isinstance(raw, Mapping) or set(raw) - {"name", "entry_point", "kwargs"}:
            raise EnvResolutionError(
                f"env spec {what} from {source}: additional_wrappers[{index}] is malformed"
            )
        w_kwargs = raw.get("kwargs")
        if not isinstance(w_kwargs, Mapping):  # null: gymnasium cannot rebuild the wrapper
            raise EnvResolutionError(
                f"env spec {what} from {source}: wrapper {index} kwargs must be an object, got {w_kwargs!r}"
            )
        entry = raw.get("entry_point")
        _check_module_name(str(entry).split(":")[0], f"wrapper {entry!r} of {what} from {source}")
        reason = wrapper_refusal(entry, trusted=lambda m: _under(m, user), default=lambda m: _under(m, allow))
        if reason is not None:
            raise _refused(f"{what} (wrapper {index})", source, str(entry).split(":")[0], reason)
        check_file_kwargs(
            w_kwargs, f"wrapper {index} kwargs", lambda reason: _refused_value(what, source, reason)
        )
        wrappers.append(WrapperSpec(str(raw.get("name", "")), raw["entry_point"], dict(w_kwargs)))
    return EnvSpec(
        id=env_id,
        entry_point=entry_point,
        reward_threshold=data.get("reward_threshold"),
        nondeterministic=bool(data.get("nondeterministic", False)),
        max_episode_steps=data.get("max_episode_steps"),
        order_enforce=bool(data.get("order_enforce", True)),
        disable_env_checker=bool(data.get("disable_env_checker", False)),
        kwargs=dict(kwargs),
        additional_wrappers=tuple(wrappers),
        vector_entry_point=vector_entry_point,
    )


def _spec_as_dict(spec: EnvSpec) -> dict[str, Any]:
    data = {name: getattr(spec, name) for name in _SPEC_FIELDS}
    data["additional_wrappers"] = [
        {"name": w.name, "entry_point": w.entry_point, "kwargs": w.kwargs} for w in spec.additional_wrappers
    ]
    return data


def resolve_env(
    env: str | Mapping[str, Any] | EnvSpec,
    *,
    source: str,
    allow_modules: Iterable[str] = (),
) -> EnvSpec:
    """A validated :class:`EnvSpec` for an env id, a ``"module:Env-v0"`` id, or a serialized spec.

    Args:
        env: a registered id; ``"module:id"`` (``module`` imported only when allowed); a spec as JSON text
            or dict (as Minari / our D4RL writer store it); or an ``EnvSpec`` (treated like its JSON).
        source: where the name came from, for the messages (``"--env-id"``, ``"dataset file 'x.hdf5'"``).
        allow_modules: modules trusted beyond the defaults and the process-wide :func:`allow_env_modules`.

    Raises:
        UnknownEnvError: unregistered id (with the closest ids). EnvRefusedError: a module or entry point
        outside the allow-list. EnvResolutionError: malformed spec.
    """
    extra = tuple(allow_modules)
    for module in extra:
        _check_module_name(module, "allow_modules")
    with _lock:
        user = (*sorted(_user_allowed), *extra)
    allow = allowed_env_modules(extra)
    if isinstance(env, EnvSpec):
        if gym.registry.get(env.id) is env or callable(env.entry_point):
            return env  # registered by code (or holding a live callable): nothing read from a file
        env = _spec_as_dict(env)
    if isinstance(env, str) and not env.lstrip().startswith("{"):
        env_id = env.strip()
        if ":" in env_id:
            module, _, env_id = env_id.partition(":")
            _check_module_name(module, f"env id {env!r} from {source}")
            if not _under(module, allow):
                raise _refused(repr(env), source, module, f"the id would import module {module!r}")
            try:
                importlib.import_module(module)
            except ImportError as err:
                raise EnvResolutionError(
                    f"env id {env!r} from {source}: cannot import {module!r}: {err}"
                ) from None
        return _registered(env_id, source)
    return _parse_spec(env, source, allow, user)


def _creator(spec: EnvSpec) -> Callable[..., Any] | None:
    if callable(spec.entry_point):
        return spec.entry_point
    if isinstance(spec.entry_point, str):
        module, attr = spec.entry_point.split(":")
        obj: Any = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
        return obj
    return None


_MAKE_KWARGS = {"max_episode_steps", "disable_env_checker", "render_mode"}


def check_env_kwargs(spec: EnvSpec, kwargs: Mapping[str, Any], *, source: str) -> None:
    """Raise :class:`EnvKwargsError` for keywords ``spec``'s constructor does not accept (when it can tell)."""
    if not kwargs:
        return
    bad_type = [k for k in kwargs if not isinstance(k, str)]
    if bad_type:
        raise EnvKwargsError(f"env {spec.id!r}: keyword names from {source} must be strings, got {bad_type}")
    creator = _creator(spec)
    try:
        params = inspect.signature(creator).parameters if creator is not None else None
    except (TypeError, ValueError):
        params = None
    if params is None or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    accepted = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    accepted = [n for n in accepted if n != "self"]
    for key in kwargs:
        if key not in accepted and key not in _MAKE_KWARGS - {"render_mode"}:
            close = difflib.get_close_matches(key, accepted, n=3)
            hint = f" Did you mean {close}?" if close else ""
            raise EnvKwargsError(
                f"env {spec.id!r} does not accept the keyword argument {key!r} (from {source}); its constructor "
                f"{spec.entry_point} takes {accepted}.{hint}"
            )


def make_env(
    env: str | Mapping[str, Any] | EnvSpec,
    *,
    source: str,
    allow_modules: Iterable[str] = (),
    **kwargs: Any,
) -> gym.Env:
    """``gym.make`` of :func:`resolve_env`'s spec with ``kwargs`` checked (:func:`check_env_kwargs`).

    A constructor that rejects a keyword's *value* (TypeError / ValueError) is reported as
    :class:`EnvKwargsError` naming the env and the keyword arguments.
    """
    spec = resolve_env(env, source=source, allow_modules=allow_modules)
    return make_resolved(spec, source=source, **kwargs)


def make_resolved(spec: EnvSpec, *, source: str, **kwargs: Any) -> gym.Env:
    """``gym.make(spec, **kwargs)`` for a spec :func:`resolve_env` returned, with clear keyword errors."""
    check_env_kwargs(spec, {k: v for k, v in kwargs.items() if k not in _MAKE_KWARGS}, source=source)
    try:
        return gym.make(spec, **kwargs)
    except (TypeError, ValueError, AssertionError) as err:
        if not kwargs:
            raise
        raise EnvKwargsError(
            f"building env {spec.id!r} with keyword arguments {kwargs} (from {source}) failed: {err}"
        ) from err
