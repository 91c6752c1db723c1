"""Parameter matching: a baseline core (LSTM / GRU / MLP) sized to the parameter count of the transformer policy.

"Baselines on equal terms" means equal parameter counts, as in the encoder study: the width ``hidden_size`` of
the baseline core is chosen so that the whole actor-critic (observation encoder, core and heads) has as many
parameters as the transformer policy that the same :class:`~rl_transformers.policies.gtrxl.PolicyConfig` builds
on the same spaces. Counts grow monotonically with the width, so :func:`closest_value` bisects for the smallest
width whose count reaches the target and keeps whichever of it and the width below is closer. The study
(:mod:`rl_transformers.study.encoders`) sizes its encoders with the same function and :data:`TOLERANCE`.

:func:`match_width` works on spaces; a PPO run's config is sized on its env's spaces by
:func:`rl_transformers.algos.ppo_sizing.match_run_config` (a layer up: it builds the env). The chosen
``hidden_size`` is written into the config, so ``config.json`` says what was built and loading a run never sizes
anything again.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from gymnasium import spaces

if TYPE_CHECKING:
    from rl_transformers.policies.gtrxl import PolicyConfig

TOLERANCE = 0.10
"""Allowed relative difference of a matched parameter count from its reference."""


def closest_value(count: Callable[[int], int], target: int, lo: int = 4, hi: int = 2048) -> int:
    """The value in [lo, hi] whose ``count`` is closest to ``target`` (``count`` non-decreasing); ties go low."""
    floor = lo
    while lo < hi:  # smallest value whose count >= target
        mid = (lo + hi) // 2
        if count(mid) < target:
            lo = mid + 1
        else:
            hi = mid
    return min((max(floor, lo - 1), lo), key=lambda v: abs(count(v) - target))


def count_policy_parameters(
    config: PolicyConfig, observation_space: spaces.Space, action_space: spaces.Space
) -> int:
    """Parameters of the actor-critic ``config`` builds on these spaces (a shared tensor counts once)."""
    from rl_transformers.policies.gtrxl import make_policy

    with warnings.catch_warnings():  # replay-exactness notes of some backbones: irrelevant to a count
        warnings.simplefilter("ignore")
        policy = make_policy(config, observation_space, action_space)
    return sum(p.numel() for p in policy.parameters())


@dataclass(frozen=True)
class Sizing:
    """What :func:`match_width` chose, with both counts."""

    kind: str
    hidden_size: int
    n_parameters: int
    """Parameters of the sized baseline policy."""
    n_reference: int
    """Parameters of the transformer policy of the same config."""
    default_width: int
    n_default: int
    """Parameters of the baseline at its unmatched width (backbone.d_model)."""

    @property
    def relative_difference(self) -> float:
        return (self.n_parameters - self.n_reference) / self.n_reference

    @property
    def within_tolerance(self) -> bool:
        return abs(self.relative_difference) <= TOLERANCE

    def text(self) -> str:
        verdict = "within" if self.within_tolerance else "OUTSIDE"
        return (
            f"--match-params: {self.kind} hidden_size {self.hidden_size}: {self.n_parameters:,} parameters; "
            f"transformer policy: {self.n_reference:,} ({self.relative_difference:+.1%}, {verdict} "
            f"±{TOLERANCE:.0%}). --no-match-params keeps width {self.default_width} ({self.n_default:,})"
        )


def match_width(
    config: PolicyConfig,
    observation_space: spaces.Space,
    action_space: spaces.Space,
    lo: int = 4,
    hi: int = 2048,
) -> tuple[PolicyConfig, Sizing | None]:
    """``config`` with the baseline's ``hidden_size`` matched to the transformer policy's parameter count.

    Unchanged (and no :class:`Sizing`) for a transformer, with ``match_params`` off, or when ``hidden_size``
    is given."""
    if config.kind == "transformer" or not config.match_params or config.hidden_size is not None:
        return config, None

    @cache
    def count(width: int) -> int:
        return count_policy_parameters(
            dataclasses.replace(config, hidden_size=width), observation_space, action_space
        )

    reference = count_policy_parameters(
        dataclasses.replace(config, kind="transformer"), observation_space, action_space
    )
    width = closest_value(count, reference, lo, hi)
    sizing = Sizing(config.kind, width, count(width), reference, config.width, count(config.width))
    return dataclasses.replace(config, hidden_size=width), sizing


__all__ = [
    "TOLERANCE",
    "Sizing",
    "closest_value",
    "count_policy_parameters",
    "match_width",
]
