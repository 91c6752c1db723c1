"""The tuning search space: learning rate, entropy coefficient, training window and one context knob.

Ranges are sampled log-uniformly (learning rate, entropy coefficient, the knob as an integer) and the
training window from a list, by Optuna's TPE sampler (Bergstra et al. 2011, "Algorithms for hyper-parameter
optimization", NeurIPS). The knob is the encoder's own (:mod:`rl_transformers.study.knobs`): a reach (mem_len,
max_cache, window, ...) or a capacity (hidden size of the RNNs, random features). A space is checked when it is
built (ranges) and against the encoder and PPO settings before a study starts (:meth:`SearchSpace.check`): a bad
one is a :class:`UserError` naming the flag, the value and what is valid.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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


__all__ = ["DEFAULT_REACH", "SearchSpace"]
