"""Repeat-previous: output the symbol observed ``delay`` steps ago (a delay line of fixed length).

A memory probe in the spirit of POPGym's RepeatPrevious (Morad et al. 2023, arXiv 2303.01859) and the
copy/recall tasks of recurrent-network benchmarks. Each episode has ``T = episode_length`` steps; at step t
the agent observes a fresh uniformly random symbol ``s_t`` in {0..n-1} as a one-hot vector and must answer
``s_{t-d}`` with ``d = delay``. Steps t < d have no target and give no reward; each correct answer on the
``T - d`` scored steps gives ``1 / (T - d)``, a wrong one 0, so returns lie in [0, 1]. The memory needed is a
FIFO of the last d symbols (d = 0 needs none: it is a sanity check).

``MultiRepeatPreviousEnv`` asks for several delays at once with a ``MultiDiscrete`` action (one head per
delay, e.g. delays (1, 4): answer both ``s_{t-1}`` and ``s_{t-4}``); head i contributes
``1 / (H (T - d_i))`` per correct answer, so returns again lie in [0, 1].

Scores (undiscounted return): optimal 1 (answer from memory); uniform random and every memoryless policy
exactly ``1/n`` in expectation (the target is independent of the current observation when d >= 1).

Spaces: observation ``Box(float32, (n,))`` one-hot (all zeros after the last step); action ``Discrete(n)``
(``MultiDiscrete([n] * H)`` for the multi variant).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces


def _check_common(n_symbols: int, episode_length: int) -> None:
    if int(n_symbols) != n_symbols or n_symbols < 2:
        raise ValueError(f"n_symbols must be an integer >= 2, got {n_symbols!r}")
    if int(episode_length) != episode_length or episode_length < 1:
        raise ValueError(f"episode_length must be an integer >= 1, got {episode_length!r}")


class _DelayedRecallBase(gym.Env):
    """Shared dynamics: a random symbol stream and per-delay scoring of the answers."""

    metadata = {"render_modes": []}

    def __init__(self, n_symbols: int, delays: Sequence[int], episode_length: int) -> None:
        _check_common(n_symbols, episode_length)
        if len(delays) == 0:
            raise ValueError("delays must not be empty")
        for d in delays:
            if int(d) != d or not 0 <= d < episode_length:
                raise ValueError(
                    f"delay {d!r} must be an integer in [0, episode_length) = [0, {episode_length}) "
                    "so that at least one step is scored"
                )
        self.n_symbols = int(n_symbols)
        self.delays = tuple(int(d) for d in delays)
        self.episode_length = int(episode_length)
        self.horizon = self.episode_length
        self.render_mode = None
        self.observation_space = spaces.Box(0.0, 1.0, shape=(self.n_symbols,), dtype=np.float32)
        self._symbols = np.zeros(self.episode_length, dtype=np.int64)
        self._t = 0

    def _obs(self) -> np.ndarray:
        obs = np.zeros(self.n_symbols, dtype=np.float32)
        if self._t < self.episode_length:
            obs[self._symbols[self._t]] = 1.0
        return obs

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._symbols = self.np_random.integers(0, self.n_symbols, size=self.episode_length)
        self._t = 0
        return self._obs(), {}

    def _score(self, answers: np.ndarray) -> float:
        """Reward for ``answers`` (one per delay) at the current step, before the clock advances."""
        t = self._t
        reward = 0.0
        n_heads = len(self.delays)
        for answer, d in zip(answers, self.delays):
            if t >= d and int(answer) == int(self._symbols[t - d]):
                reward += 1.0 / (n_heads * (self.episode_length - d))
        return reward

    def _advance(self, answers: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self._t >= self.episode_length:
            raise RuntimeError("step() called after the episode ended; call reset() first")
        reward = self._score(answers)
        self._t += 1
        terminated = self._t >= self.episode_length
        return self._obs(), reward, terminated, False, {}


class RepeatPreviousEnv(_DelayedRecallBase):
    """Answer the symbol seen ``delay`` steps ago; ``Discrete(n_symbols)`` action.

    Args:
        n_symbols: alphabet size n (observation is a one-hot of length n); >= 2.
        delay: d, how many steps back the answer is; 0 <= d < episode_length.
        episode_length: T, number of steps per episode (the episode terminates after T actions).
    """

    def __init__(self, n_symbols: int = 4, delay: int = 4, episode_length: int = 32) -> None:
        super().__init__(n_symbols, (delay,), episode_length)
        self.delay = int(delay)
        self.action_space = spaces.Discrete(self.n_symbols)

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        a = np.asarray(action).reshape(1)
        if not 0 <= int(a[0]) < self.n_symbols:
            raise ValueError(f"action must be in 0..{self.n_symbols - 1}, got {action!r}")
        return self._advance(a)


class MultiRepeatPreviousEnv(_DelayedRecallBase):
    """Answer the symbols seen ``delays[i]`` steps ago, one per head; ``MultiDiscrete([n] * H)`` action.

    Args:
        n_symbols: alphabet size n; >= 2.
        delays: one delay per action head (H = len(delays)); each in [0, episode_length).
        episode_length: T, number of steps per episode.
    """

    def __init__(self, n_symbols: int = 4, delays: Sequence[int] = (1, 4), episode_length: int = 32) -> None:
        super().__init__(n_symbols, tuple(delays), episode_length)
        self.action_space = spaces.MultiDiscrete([self.n_symbols] * len(self.delays))

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        a = np.asarray(action, dtype=np.int64).reshape(-1)
        if a.shape != (len(self.delays),) or a.min() < 0 or a.max() >= self.n_symbols:
            raise ValueError(
                f"action must hold {len(self.delays)} answers in 0..{self.n_symbols - 1}, got {action!r}"
            )
        return self._advance(a)
