"""Tuning results are data: every parameter and value read back is checked against the search space and the task.

A study's SQLite file, a ``best.json`` or a committed tuning file can hold anything: an enqueued trial with
``hidden_size`` 10^7 (Optuna only warns when a fixed parameter lies outside its distribution), a complete trial
whose value is 10^9 on a task whose returns are at most 1, a NaN, a categorical index past the choices, a
distribution of another search space. :func:`param_problem` checks one parameter against the current
:class:`~rl_transformers.study.tuning_space.SearchSpace` (type, range, categorical membership), :func:`value_problem` a
trial's value (and curve points) against the task's possible returns (:func:`envs.registry.return_bounds`),
:func:`check_params` all of a result's parameters and the memory its encoder would need at the study's batch
(:mod:`rl_transformers.agents.memory_bound`). Commands are never read back: they are rebuilt from the checked
parameters (:func:`~rl_transformers.tune.tuner.train_command`).
"""

from __future__ import annotations

import math
from typing import Any

from rl_transformers.study.knobs import Knob
from rl_transformers.study.tuning_space import SearchSpace
from rl_transformers.utils.errors import UserError

__all__ = ["SEARCHED", "check_params", "expected_names", "param_problem", "value_problem"]

SEARCHED = ("learning_rate", "ent_coef", "seq_len")
"""The parameters every trial samples (the knob's name joins them when it is tuned)."""


def expected_names(space: SearchSpace, knob: Knob | None) -> set[str]:
    """The parameter names a trial of this space holds."""
    return set(SEARCHED) | ({knob.name} if knob is not None and space.tune_knob else set())


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def param_problem(name: str, value: Any, space: SearchSpace, knob: Knob | None) -> str | None:
    """Why ``value`` is not a point of ``space`` for parameter ``name`` (None: it is one)."""
    if name not in expected_names(space, knob):
        return f"{name} is not a parameter of this search space ({sorted(expected_names(space, knob))})"
    if name == "seq_len":
        ok = isinstance(value, int) and not isinstance(value, bool) and value in space.seq_len
        return None if ok else f"seq_len {value!r} is not one of the windows {list(space.seq_len)}"
    if name in ("learning_rate", "ent_coef"):
        low, high = getattr(space, name)
        return (
            None
            if _number(value) and low <= value <= high
            else f"{name} {value!r} is outside [{low}, {high}]"
        )
    assert knob is not None  # expected_names: the knob's own name
    low, high = space.knob_range(knob)
    ok = isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
    return None if ok else f"{name} {value!r} is not an integer in [{low}, {high}]"


def value_problem(value: Any, bounds: tuple[float, float] | None, what: str = "value") -> str | None:
    """Why ``value`` is not a possible trial value: not a finite number, or outside the task's ``bounds``."""
    if not _number(value):
        return f"{what} {value!r} is not a finite number"
    if bounds is not None:
        from rl_transformers.study.ranges import outside

        if outside(float(value), bounds):
            return f"{what} {value!r} is outside the task's possible returns {list(bounds)}"
    return None


def check_params(
    params: Any,
    space: SearchSpace,
    knob: Knob | None,
    spec: str,
    batch: tuple[int, int],
    source: str,
    max_memory_gib: float | None = None,
) -> None:
    """Refuse (:class:`UserError` naming ``source``) parameters that are not a point of ``space``, or whose
    encoder (``spec`` with the knob applied) needs more memory than allowed at ``batch`` = (envs, window)."""
    if not isinstance(params, dict):
        raise UserError(f"parameters {params!r} are not an object", source=source)
    missing = sorted(expected_names(space, knob) - set(params))
    if missing:
        raise UserError(f"parameters {missing} are missing", source=source)
    for name, value in params.items():
        why = param_problem(name, value, space, knob)
        if why is not None:
            raise UserError(why, source=source)
    from rl_transformers.agents.memory_bound import check_memory, policy_bytes
    from rl_transformers.study.encoders import policy_config

    applied = knob.apply(spec, params[knob.name]) if knob is not None and knob.name in params else spec
    envs, window = batch
    estimate = policy_bytes(policy_config(applied), envs, int(params.get("seq_len", window)))
    check_memory(estimate, source, f"the encoder these parameters give (at {envs} envs)", max_memory_gib)
