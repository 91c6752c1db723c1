"""The ``--resume`` rules shared by the PPO and Decision Transformer trainers.

A resumed run starts from the config saved in its checkpoint. Each setting of the new invocation is then
compared with the saved value, field by field (nested sections included):

* equal to the saved value: nothing to do (whether the flag was typed or not);
* different, and the field is *mutable* (budget, evaluation, saving, targets, logging, progress, device,
  threads; the list is the trainer's ``RESUME_MUTABLE``): the new value applies;
* different, and the field is *frozen* (everything else: env, seed, model / backbone / policy, algorithm,
  dataset, learning rate and the other optimisation settings, run root): the resume is refused with one
  message listing every such flag with its saved and given values. Nothing is dropped silently.

The rule compares with the *saved* value, never with the flag's default, so passing a default explicitly
(``--eval-every 0`` on a run saved with 10000) is honoured. For this to work on the command line the scripts
parse flags with the saved config as the defaults (:func:`parse_cli`): flags not typed take the saved values.
A library caller passes a config built the same way, e.g. ``dataclasses.replace(saved_config(...), ...)``.

Fields in ``per_invocation`` (``resume``, ``trust_checkpoint``, ``allow_env_modules``) are never read from a saved file: they always
come from the current invocation (a crafted checkpoint cannot switch its own trust on).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

from rl_transformers.runs.checkpoint_load import latest_checkpoint, load_checkpoint
from rl_transformers.utils.errors import UserError, offer_resume
from rl_transformers.utils.config_json import from_dict, to_jsonable

__all__ = ["ResumeRefused", "flag_name", "merge_resume", "parse_cli", "saved_config"]

T = TypeVar("T")


class ResumeRefused(UserError):
    """``--resume`` with flags that cannot change for an existing run."""


def saved_config(cls: type[T], ckpt: Mapping[str, Any], path: str | Path) -> T:
    """The run config stored in checkpoint ``ckpt`` (read from ``path``), parsed as plain JSON data.

    Wrong types, unknown fields or missing sections raise :class:`UserError` naming the file and the field.
    """
    data = ckpt.get("config") if isinstance(ckpt, Mapping) else None
    if not isinstance(data, Mapping):
        raise UserError(
            f"checkpoint {path} has no 'config' section (a dict of the run's settings); "
            "it was not written by this trainer"
        )
    try:
        return from_dict(cls, data, require_sections=True)
    except (TypeError, ValueError) as err:
        raise UserError(f"checkpoint {path}: invalid config: {err}") from err


def flag_name(path: str, renames: Mapping[str, str] | None = None) -> str:
    """The command-line flag of a dotted field path (tyro style): ``ppo.learning_rate`` ->
    ``--ppo.learning-rate``. ``renames`` maps path prefixes (longest first) to their flag prefixes."""
    for prefix, new in sorted((renames or {}).items(), key=lambda kv: -len(kv[0])):
        if path == prefix or path.startswith(prefix + "."):
            path = (new + path[len(prefix) :]).lstrip(".")
            break
    return "--" + path.replace("_", "-")


def _leaves(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted field paths of a (nested) dataclass -> JSON values of the leaf fields."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        path = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out.update(_leaves(value, path + "."))
        else:
            out[path] = to_jsonable(value)
    return out


def _replace_path(obj: Any, path: str, value: Any) -> Any:
    head, _, rest = path.partition(".")
    if not rest:
        return dataclasses.replace(obj, **{head: value})
    return dataclasses.replace(obj, **{head: _replace_path(getattr(obj, head), rest, value)})


def _matches(path: str, names: Collection[str]) -> bool:
    return any(path == n or path.startswith(n + ".") for n in names)


def merge_resume(
    saved: T,
    given: T,
    *,
    mutable: Collection[str],
    per_invocation: Collection[str],
    source: str | Path,
    renames: Mapping[str, str] | None = None,
) -> T:
    """``saved`` with the mutable fields of ``given`` that differ, per the module's rule; frozen fields
    that differ raise :class:`ResumeRefused` listing each flag with its saved and given value."""
    old, new = _leaves(saved), _leaves(given)
    merged = saved
    refused = []
    for path in new:
        if _matches(path, per_invocation):
            merged = _replace_path(merged, path, _get(given, path))
        elif old.get(path) != new[path]:
            if _matches(path, mutable):
                merged = _replace_path(merged, path, _get(given, path))
            else:
                refused.append(f"{flag_name(path, renames)} (saved: {old.get(path)!r}, given: {new[path]!r})")
    if refused:
        allowed = ", ".join(flag_name(m, renames) for m in sorted(mutable))
        raise ResumeRefused(
            f"--resume {source}: these settings are fixed by the saved run and cannot change: "
            + "; ".join(refused)
            + f". Leave them out (the saved values are used) or start a new run. On resume only these "
            f"may change: {allowed}"
        )
    return merged


def _get(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def _flag_value(argv: Sequence[str], flag: str) -> str | None:
    value = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1 :]
    return None if value in (None, "None") else value


def parse_cli(
    cls: type[T],
    *,
    per_invocation: Collection[str] = ("resume",),
    argv: Sequence[str] | None = None,
    **tyro_kwargs: Any,
) -> T:
    """``tyro.cli(cls)``, except that with ``--resume X`` the defaults are the config saved in X's checkpoint
    (per-invocation fields reset to the class defaults), so untyped flags keep the saved values and typed
    ones are compared with them by :func:`merge_resume`."""
    import tyro

    offer_resume()
    args = list(sys.argv[1:] if argv is None else argv)
    resume = _flag_value(args, "--resume")
    if resume is None:
        return tyro.cli(cls, args=args, **tyro_kwargs)
    path = latest_checkpoint(resume)
    if path is None:
        raise UserError(f"--resume {resume}: no checkpoint (last.pt / step_<n>.pt) found there")
    saved = saved_config(cls, load_checkpoint(path), path)
    blank = cls()
    fresh = {name: getattr(blank, name) for name in per_invocation if hasattr(blank, name)}
    defaults = dataclasses.replace(cast(Any, saved), **fresh)
    return tyro.cli(cls, args=args, default=defaults, **tyro_kwargs)
