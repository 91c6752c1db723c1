"""The range of values a study record can hold for its task, from the env registry.

An online (PPO) record's score, final return and every curve point are mean undiscounted episode returns, so
they lie within the task's possible returns: :func:`envs.registry.return_bounds` of the job's ``env_id`` and
``env_kwargs`` (T-Maze ``[L * penalty, goal_reward]``, POPGym ``[-1, 1]``, CartPole ``[0, 500]``). A value
outside is impossible, whatever produced it. Sums of float32 rewards may overshoot a bound by rounding
(``1.0000000000000018`` on a POPGym task): :data:`RELATIVE_SLACK` of the range's width is allowed. Offline
(DT) scores are normalized by the dataset's reference returns, which the record does not carry: their range
is not checked here (their success rates are, in [0, 1]).
"""

from __future__ import annotations

from typing import Any

__all__ = ["RELATIVE_SLACK", "outside", "score_range"]

RELATIVE_SLACK = 1e-9
"""Rounding allowed beyond a bound, as a fraction of the range's width."""


def score_range(spec: dict[str, Any]) -> tuple[float, float] | None:
    """The possible returns of the job ``spec``'s task (None: not stated, or not a return)."""
    if spec.get("algo") != "ppo" or not isinstance(spec.get("env_id"), str):
        return None
    from envs.registry import return_bounds

    kwargs = spec.get("env_kwargs")
    return return_bounds(spec["env_id"], kwargs if isinstance(kwargs, dict) else None)


def outside(value: float, bounds: tuple[float, float]) -> bool:
    """Whether ``value`` lies outside ``bounds`` by more than the rounding slack."""
    low, high = bounds
    slack = RELATIVE_SLACK * max(1.0, high - low)
    return not (low - slack <= value <= high + slack)
