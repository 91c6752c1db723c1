"""Reward scaling by the running standard deviation of the discounted return, as SB3's ``VecNormalize``
(``norm_reward=True``) and Gymnasium's ``NormalizeReward`` do (Engstrom et al. 2020, arXiv 2005.12729, call it
"reward scaling").

Per env, the discounted return ``G_t = γ G_{t-1} + r_t`` (restarted after an episode end) is merged into a
running variance σ² (mean and variance over every env and step seen, Chan et al.'s parallel rule, starting from
mean 0, variance 1 and a count of 1e-4 as SB3's ``RunningMeanStd``); the trainer stores
``clip(r_t / sqrt(σ² + ε), ±clip)``. Only the learner sees scaled rewards: episode returns, logs and
evaluations stay in the env's units. The statistics update with every step before the step's reward is
scaled, in SB3's order, so a recipe ported from rl-zoo (``normalize: True``) means the same thing here.

Why it matters beyond the value scale: the global gradient-norm clip (``max_grad_norm``) acts on the sum of
the policy and value gradients, so an unscaled value loss of returns in the tens or hundreds shrinks the
policy's step as well.
"""

from __future__ import annotations

from typing import Any

import numpy as np

EPS = 1e-8
INITIAL_COUNT = 1e-4


class RewardNorm:
    """Running reward scaler for ``n_envs`` envs with discount ``gamma`` (see the module docstring)."""

    def __init__(self, n_envs: int, gamma: float, clip: float = 10.0) -> None:
        if not clip > 0:
            raise ValueError(f"reward clip must be > 0, got {clip!r}")
        self.gamma, self.clip = float(gamma), float(clip)
        self.returns = np.zeros(n_envs, dtype=np.float64)
        self.mean, self.var, self.count = 0.0, 1.0, INITIAL_COUNT

    def _update(self, batch: np.ndarray) -> None:
        n = batch.shape[0]
        b_mean, b_var = float(batch.mean()), float(batch.var())
        delta = b_mean - self.mean
        total = self.count + n
        m2 = self.var * self.count + b_var * n + delta**2 * self.count * n / total
        self.mean += delta * n / total
        self.var = m2 / total
        self.count = total

    def __call__(self, reward: np.ndarray, done: np.ndarray) -> np.ndarray:
        """Scaled rewards of one vector step (``reward`` (N,), ``done`` (N,) bool: terminated or truncated)."""
        reward = np.asarray(reward, dtype=np.float64)
        self.returns = self.returns * self.gamma + reward
        self._update(self.returns)
        scaled = np.clip(reward / np.sqrt(self.var + EPS), -self.clip, self.clip)
        self.returns[np.asarray(done, dtype=bool)] = 0.0
        return scaled

    def restart_episodes(self) -> None:
        """Forget the running returns (the envs were reset); the statistics stay."""
        self.returns[:] = 0.0

    def state_dict(self) -> dict[str, Any]:
        """Plain data for a checkpoint."""
        return {"returns": self.returns.tolist(), "mean": self.mean, "var": self.var, "count": self.count}

    def load_state_dict(self, saved: dict[str, Any], source: str) -> None:
        """Restore :meth:`state_dict` (ValueError naming ``source`` for a malformed entry)."""
        try:
            returns = np.asarray(saved["returns"], dtype=np.float64)
            mean, var, count = float(saved["mean"]), float(saved["var"]), float(saved["count"])
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{source}: its reward_norm entry is malformed ({err})") from None
        if returns.shape != self.returns.shape or not np.isfinite([mean, var, count, *returns]).all():
            raise ValueError(
                f"{source}: its reward_norm entry holds {returns.shape[0]} env returns or non-finite "
                f"statistics; this run has {self.returns.shape[0]} envs"
            )
        if var < 0 or count <= 0:
            raise ValueError(
                f"{source}: its reward_norm statistics are impossible (var={var}, count={count})"
            )
        self.returns, self.mean, self.var, self.count = returns, mean, var, count
