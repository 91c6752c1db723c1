"""The tuning search space: learning rate, entropy coefficient, training window and one context knob.

Ranges are sampled log-uniformly (learning rate, entropy coefficient, the knob as an integer) and the
training window from a list, by Optuna's TPE sampler (Bergstra et al. 2011, "Algorithms for hyper-parameter
optimization", NeurIPS). The knob is the encoder's own (:mod:`rl_transformers.study.knobs`): a reach (mem_len,
max_cache, window, ...) or a capacity (hidden size of the RNNs, random features). Tuning a capacity would let an
encoder buy parameters the others lack, so by default a capacity knob is searched only over the widths whose
policy stays within :data:`~rl_transformers.policies.sizing.TOLERANCE` (10 %) of the encoder's own parameter count
(:func:`capacity_range`): the trial budget and the size are the same for every encoder. A space is checked when it is
built (ranges) and against the encoder and PPO settings before a study starts (:meth:`SearchSpace.check`): a bad
one is a :class:`UserError` naming the flag, the value and what is valid.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rl_transformers.policies.sizing import TOLERANCE
from rl_transformers.study.knobs import Knob
from rl_transformers.utils.errors import UserError

DEFAULT_REACH = (4, 256)
"""Default range of a reach knob (steps): the dependency lengths of the POPGym RepeatPrevious ladder and more."""


def _check_range(flag: str, value: Any, integer: bool = False) -> None:
    kind = "integers" if integer else "numbers"
    if (
        not isinstance(value, (tuple, list))
        or len(value) != 2
        or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
        or (integer and not all(isinstance(v, int) for v in value))
    ):
        raise UserError(f"expected two {kind} LOW HIGH, got {value!r}", source=flag)
    low, high = value
    if not 0 < low < high:
        raise UserError(f"needs 0 < LOW < HIGH (sampled log-uniformly), got {low!r} {high!r}", source=flag)


@dataclass(frozen=True)
class SearchSpace:
    """What a trial samples (flags ``--space.*``)."""

    learning_rate: tuple[float, float] = (1e-5, 3e-3)
    """Adam learning rate LOW HIGH (log-uniform)."""
    ent_coef: tuple[float, float] = (1e-4, 0.1)
    """Entropy-bonus weight LOW HIGH (log-uniform)."""
    seq_len: tuple[int, ...] = (8, 16, 32)
    """Training windows to choose from; each must divide --ppo.num-steps."""
    knob: tuple[int, int] | None = None
    """Context knob LOW HIGH (log-uniform integers); default: reach knobs 4 256, capacity knobs half to twice
    the encoder's value."""
    tune_knob: bool = True
    """Search the encoder's context knob (--space.no-tune-knob keeps it at the encoder's value)."""
    param_tolerance: float | None = TOLERANCE
    """A capacity knob's default range: only the widths whose policy's parameter count is within this fraction
    of the encoder's own (inside half to twice its value), so tuning keeps encoders parameter-matched. None:
    half to twice the value, whatever the count (the range the encoder study's confirmation stage was tuned
    with). An explicit --space.knob is used as given."""

    def __post_init__(self) -> None:
        _check_range("--space.learning-rate", self.learning_rate)
        _check_range("--space.ent-coef", self.ent_coef)
        windows = self.seq_len
        if (
            not isinstance(windows, (tuple, list))
            or not windows
            or not all(isinstance(w, int) and not isinstance(w, bool) and w >= 1 for w in windows)
            or len(set(windows)) != len(windows)
        ):
            raise UserError(f"expected distinct integers >= 1, got {windows!r}", source="--space.seq-len")
        if self.knob is not None:
            _check_range("--space.knob", self.knob, integer=True)
        tol = self.param_tolerance
        if tol is not None and not (isinstance(tol, (int, float)) and 0 < tol < 1):
            raise UserError(
                f"must be a fraction in (0, 1) or None, got {tol!r}", source="--space.param-tolerance"
            )

    def knob_range(self, knob: Knob) -> tuple[int, int]:
        if self.knob is not None:
            return self.knob
        if knob.kind == "reach":
            return DEFAULT_REACH
        return max(1, knob.default // 2), max(2, knob.default * 2)

    def check(self, knob: Knob | None, num_steps: int, encoder: str) -> None:
        """Refuse what this encoder and PPO setting cannot run (UserError naming the flag)."""
        bad = [w for w in self.seq_len if num_steps % w]
        if bad:
            good = [w for w in range(1, num_steps + 1) if num_steps % w == 0]
            raise UserError(
                f"training windows {bad} do not divide --ppo.num-steps {num_steps}; valid: {good}",
                source="--space.seq-len",
            )
        if self.knob is not None and (knob is None or not self.tune_knob):
            why = "has no context knob" if knob is None else "is not tuned (--space.no-tune-knob)"
            raise UserError(f"encoder {encoder!r} {why}; drop --space.knob", source="--space.knob")

    def sample(self, trial: Any, knob: Knob | None) -> dict[str, Any]:
        """One point: {learning_rate, ent_coef, seq_len[, <knob name>]} from an Optuna trial."""
        params: dict[str, Any] = {
            "learning_rate": trial.suggest_float("learning_rate", *self.learning_rate, log=True),
            "ent_coef": trial.suggest_float("ent_coef", *self.ent_coef, log=True),
            "seq_len": trial.suggest_categorical("seq_len", list(self.seq_len)),
        }
        if knob is not None and self.tune_knob:
            low, high = self.knob_range(knob)
            params[knob.name] = trial.suggest_int(knob.name, low, high, log=True)
        return params


def capacity_range(space: SearchSpace, knob: Knob, count: Callable[[int], int]) -> tuple[int, int]:
    """The values of capacity ``knob`` a study searches when ``space`` gives no --space.knob: half to twice the
    knob's value, narrowed (``space.param_tolerance`` not None) to the values ``v`` whose parameter count
    ``count(v)`` (non-decreasing in ``v``) lies within the tolerance of ``count(knob.default)``. A tolerance
    that leaves one value is a :class:`UserError`: nothing to search."""
    low, high = max(1, knob.default // 2), max(2, knob.default * 2)
    tol = space.param_tolerance
    if space.knob is not None or knob.kind != "capacity" or tol is None:
        return space.knob_range(knob)
    ref = count(knob.default)
    lo, hi = low, knob.default  # the smallest value at or above (1 - tol) * ref
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if count(mid) < (1 - tol) * ref else (lo, mid)
    first = lo
    lo, hi = knob.default, high  # the largest value at or below (1 + tol) * ref
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if count(mid) <= (1 + tol) * ref else (lo, mid - 1)
    if first >= lo:
        raise UserError(
            f"within {tol:.0%} of the encoder's {ref:,} parameters, {knob.name} can only be {knob.default}: "
            "nothing to search; raise --space.param-tolerance, give --space.knob LOW HIGH, or --space.no-tune-knob",
            source="--space.param-tolerance",
        )
    return first, lo


__all__ = ["DEFAULT_REACH", "SearchSpace", "capacity_range"]
