"""Count-recall: answer how many times the queried symbol has been seen so far (order-agnostic memory).

After POPGym's CountRecall (Morad et al. 2023, arXiv 2303.01859), simplified to one symbol stream. Each
episode has ``T = episode_length`` steps. At step t the agent observes a value symbol ``v_t`` and a query
symbol ``q_t``, both uniform in {0..n-1} and shown as two concatenated one-hots; it must answer
``c_t = #{k <= t : v_k = q_t}``, the number of times ``q_t`` has appeared as a value up to and including
now. Each correct answer gives ``1 / T``, a wrong one 0, so returns lie in [0, 1]. The memory needed is a
set of n counters (a bag of everything seen), not an ordered buffer, which stresses attention differently
from :mod:`envs.repeat_previous`.

Scores (undiscounted return): optimal 1; uniform random exactly ``1 / (T + 1)`` (the answer space is
{0..T} and the true count always lies in it).

Spaces: observation ``Box(float32, (2n,))`` = ``[one_hot(v_t), one_hot(q_t)]`` (zeros after the last step);
action ``Discrete(T + 1)``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class CountRecallEnv(gym.Env):
    """Count how often the queried symbol has been observed so far in the episode.

    Args:
        n_symbols: alphabet size n; >= 2.
        episode_length: T, number of steps per episode; the action space is {0..T}.
    """

    metadata = {"render_modes": []}

    def __init__(self, n_symbols: int = 4, episode_length: int = 16) -> None:
        if int(n_symbols) != n_symbols or n_symbols < 2:
            raise ValueError(f"n_symbols must be an integer >= 2, got {n_symbols!r}")
        if int(episode_length) != episode_length or episode_length < 1:
            raise ValueError(f"episode_length must be an integer >= 1, got {episode_length!r}")
        self.n_symbols = int(n_symbols)
        self.episode_length = int(episode_length)
        self.horizon = self.episode_length
        self.render_mode = None
        self.observation_space = spaces.Box(0.0, 1.0, shape=(2 * self.n_symbols,), dtype=np.float32)
        self.action_space = spaces.Discrete(self.episode_length + 1)
        self._values = np.zeros(self.episode_length, dtype=np.int64)
        self._queries = np.zeros(self.episode_length, dtype=np.int64)
        self._t = 0

    def _obs(self) -> np.ndarray:
        obs = np.zeros(2 * self.n_symbols, dtype=np.float32)
        if self._t < self.episode_length:
            obs[self._values[self._t]] = 1.0
            obs[self.n_symbols + self._queries[self._t]] = 1.0
        return obs

    def target(self) -> int:
        """The correct answer at the current step (for tests and scripted oracles; not part of the obs)."""
        t = self._t
        return int(np.sum(self._values[: t + 1] == self._queries[t]))

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._values = self.np_random.integers(0, self.n_symbols, size=self.episode_length)
        self._queries = self.np_random.integers(0, self.n_symbols, size=self.episode_length)
        self._t = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self._t >= self.episode_length:
            raise RuntimeError("step() called after the episode ended; call reset() first")
        a = int(np.asarray(action).item())
        if not 0 <= a <= self.episode_length:
            raise ValueError(f"action must be a count in 0..{self.episode_length}, got {action!r}")
        reward = 1.0 / self.episode_length if a == self.target() else 0.0
        self._t += 1
        terminated = self._t >= self.episode_length
        return self._obs(), reward, terminated, False, {}
