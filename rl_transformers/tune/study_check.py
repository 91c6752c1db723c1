"""Reading a tuning study back: every trial checked, storage failures as one error line.

:func:`open_checked` wraps the opening of ``<out>/<study>.db`` and :func:`check_trials` reads every trial of it
(enqueued, running, complete, pruned) against the current search space
(:mod:`rl_transformers.study.tuning_checks`): each parameter's distribution must be the space's own (a foreign distribution, a categorical index past the
choices and a parameter out of range are refused), each value a finite number within the task's possible
returns. A complete or pruned trial that fails the check means the file is not this study's results: a
:class:`UserError` naming the trial, the file and the fix. An enqueued or running trial that fails it is marked
failed (with a log line), so it is never run and never blocks the study; running trials whose heartbeat went
stale are failed too (Optuna's :func:`~optuna.storages.fail_stale_trials`). A file that is not SQLite, a
database another process holds locked, or a schema of another Optuna version end in a :class:`UserError`, not
a traceback.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rl_transformers.study.knobs import Knob
from rl_transformers.study.tuning_checks import expected_names, param_problem, value_problem
from rl_transformers.study.tuning_space import SearchSpace
from rl_transformers.utils.errors import UserError

__all__ = ["check_trials", "expected_distributions", "storage_error"]

FIX = "give another --study-name or --out for a new study, or remove the file to start this one over"


def storage_error(db: Path, err: BaseException) -> UserError:
    """The one-line error of a study file that cannot be opened or read (``err``: what the storage raised)."""
    text = str(err).splitlines()[0][:300] if str(err) else type(err).__name__
    if "locked" in text:
        why = "another process holds the database locked (wait for it, or stop it)"
    elif "not a database" in text or "file is encrypted" in text:
        why = "it is not an SQLite database"
    else:
        why = f"{type(err).__name__}: {text}"
    return UserError(f"cannot read this tuning study: {why}; {FIX}", source=str(db))


def expected_distributions(space: SearchSpace, knob: Knob | None) -> dict[str, Any]:
    """The Optuna distribution of each parameter a trial of ``space`` samples (as :meth:`SearchSpace.sample`)."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    out: dict[str, Any] = {
        "learning_rate": FloatDistribution(*space.learning_rate, log=True),
        "ent_coef": FloatDistribution(*space.ent_coef, log=True),
        "seq_len": CategoricalDistribution(list(space.seq_len)),
    }
    if knob is not None and space.tune_knob:
        out[knob.name] = IntDistribution(*space.knob_range(knob), log=True)
    return out


def _problem(
    trial: Any, space: SearchSpace, knob: Knob | None, bounds: tuple[float, float] | None
) -> str | None:
    from optuna.trial import TrialState

    expected = expected_distributions(space, knob)
    for name, dist in trial.distributions.items():
        if expected.get(name) != dist:
            return (
                f"parameter {name} has the distribution {dist}, not this search space's {expected.get(name)}"
            )
    params = dict(trial.params)
    if trial.state in (TrialState.WAITING, TrialState.RUNNING):  # enqueued values bypass the distributions
        fixed = trial.system_attrs.get("fixed_params") or {}
        params = {**(fixed if isinstance(fixed, dict) else {"fixed_params": fixed}), **params}
    for name, value in params.items():
        why = param_problem(name, value, space, knob)
        if why is not None:
            return why
    if trial.state == TrialState.COMPLETE:
        missing = sorted(expected_names(space, knob) - set(params))
        if missing:
            return f"parameters {missing} are missing"
        why = value_problem(trial.value, bounds)
        if why is not None:
            return why
    for point in trial.user_attrs.get("curve") or ():
        why = value_problem(
            point[1] if isinstance(point, list) and len(point) == 2 else None, bounds, "curve point"
        )
        if why is not None:
            return why
    return None


def check_trials(
    study: Any,
    space: SearchSpace,
    knob: Knob | None,
    bounds: tuple[float, float] | None,
    db: Path,
    log: Callable[[str], None] = print,
) -> None:
    """Check every trial of ``study`` (see the module docstring); ``bounds``: the task's possible returns."""
    import optuna
    from optuna.trial import TrialState

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    for trial in study.get_trials(deepcopy=False):
        why = _problem(trial, space, knob, bounds)
        if why is None:
            continue
        state = trial.state.name.lower()
        if trial.state in (TrialState.COMPLETE, TrialState.PRUNED):
            raise UserError(
                f"trial {trial.number} ({state}) is not a trial of this study's search space and task: {why}; "
                f"the file holds results this tuner did not produce with these settings; {FIX}",
                source=str(db),
            )
        if trial.state in (TrialState.WAITING, TrialState.RUNNING):
            study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
            log(f"trial {trial.number} ({state}) marked failed, it is never run: {why}")
