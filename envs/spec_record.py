"""The evaluation env a run records, and its exact rebuild.

A Decision Transformer run records in its checkpoint (``dataset.env_spec``) the full spec of the env it was
evaluated on while training: id, entry point, keyword arguments, time limit, wrappers (:func:`spec_record`).
Evaluating the run later rebuilds exactly that env (:func:`recorded_env_factory`), so neither a dataset that
moved nor a registration whose defaults changed can change the task: a run trained on T-Maze corridor 50 is
scored on corridor 50. The recorded spec is read as data like any spec a file names: through
:func:`~envs.resolve.resolve_env` (allow-list, bounded sizes, no path keywords), with a time limit of at least
one step. A recorded spec that is refused or malformed is an error naming the cause and the fix -- restate the
env knowingly (``--env-id`` / ``load(..., env_id=...)``) -- never a silent fall-back to the bare id.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from envs.resolve import EnvResolutionError, make_resolved, resolve_env
from rl_transformers.utils.errors import UserError

__all__ = ["RESTATE_FIX", "evaluated_spec", "recorded_env_factory", "spec_record"]

RESTATE_FIX = (
    "to evaluate on another env knowingly, restate it: --env-id <id> (rl_transformers.load(..., env_id=...)), "
    "which builds <id> as registered here"
)
"""The fix an evaluation error names when the env a run recorded cannot be rebuilt."""


def spec_record(spec: Any) -> dict[str, Any] | None:
    """The JSON form of a gymnasium ``EnvSpec`` (None for None): the fields :func:`~envs.resolve.resolve_env`
    reads back. A callable entry point (an env registered by code) is left out: the id's registration gives
    it on rebuild, and the keyword arguments and time limit recorded here are applied to it."""
    if spec is None:
        return None
    entry = spec.entry_point if isinstance(spec.entry_point, str) else None
    vector = spec.vector_entry_point if isinstance(spec.vector_entry_point, str) else None
    return {
        "id": spec.id,
        "entry_point": entry,
        "kwargs": dict(spec.kwargs),
        "max_episode_steps": spec.max_episode_steps,
        "reward_threshold": spec.reward_threshold,
        "nondeterministic": bool(spec.nondeterministic),
        "order_enforce": bool(spec.order_enforce),
        "disable_env_checker": bool(spec.disable_env_checker),
        "additional_wrappers": [
            {"name": w.name, "entry_point": w.entry_point, "kwargs": dict(w.kwargs or {})}
            for w in spec.additional_wrappers
        ],
        "vector_entry_point": vector,
    }


def evaluated_spec(
    env_id: str | None, info: Any, allow_env_modules: Sequence[str] = ()
) -> dict[str, Any] | None:
    """:func:`spec_record` of the env a Decision Transformer run evaluates on: its ``--env-id`` when given (as
    the trainer builds it), else the dataset's evaluation / collection spec (``info``: its ``DatasetInfo``)."""
    if env_id is not None:
        return spec_record(resolve_env(env_id, source="--env-id", allow_modules=allow_env_modules))
    return spec_record(info.eval_env_spec or info.env_spec)


def recorded_env_factory(
    record: Any, source: str, allow_env_modules: Sequence[str] = ()
) -> Callable[..., Any]:
    """``make_env(**kwargs)`` of the env spec a run recorded (``record``: :func:`spec_record`'s dict, read from
    ``source``), checked now: a refused or malformed spec raises :class:`UserError` naming the cause and
    :data:`RESTATE_FIX`."""
    where = f"the env spec recorded in {source}"
    if not isinstance(record, dict):
        raise UserError(f"{where} is not a JSON object but {type(record).__name__}; {RESTATE_FIX}")
    record = {k: v for k, v in record.items() if v is not None or k == "kwargs"}
    try:
        spec = resolve_env(record, source=where, allow_modules=allow_env_modules)
    except EnvResolutionError as err:
        raise UserError(f"{err}. This run's evaluation env cannot be rebuilt; {RESTATE_FIX}") from None
    steps = spec.max_episode_steps
    if steps is not None and steps < 1:
        raise UserError(f"{where}: max_episode_steps = {steps} is not a positive time limit; {RESTATE_FIX}")

    def make_env(**kwargs: Any) -> Any:
        return make_resolved(spec, source=where, **kwargs)

    return make_env
