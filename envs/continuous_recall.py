"""Continuous recall: remember a scalar cue shown at t = 0 and output it after a delay (Box action).

The smallest memory task with a continuous action, for testing Gaussian policy heads. At t = 0 the agent
observes a cue ``c ~ U(-1, 1)``; for the next ``delay - 1`` steps it observes zeros; at step t = ``delay``
a query flag is raised and the agent's action ``a`` in [-1, 1] is scored with reward ``-|a - c|``, which ends
the episode (``horizon = delay + 1`` steps). Actions at earlier steps are ignored and give 0. The memory
needed is one real number held for ``delay`` steps. ``info["abs_error"]`` holds ``|a - c|`` at the end.

Scores (undiscounted return, analytic): optimal 0 (answer c); best memoryless -E|c| = -1/2 (answer 0);
uniform random -E|a - c| = -2/3 for independent a, c ~ U(-1, 1).

Spaces: observation ``Box(float32, (2,))`` = ``[cue_or_zero, query_flag]``; action ``Box(float32, (1,))`` in
[-1, 1] (values outside are clipped before scoring).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class ContinuousRecallEnv(gym.Env):
    """Remember a scalar cue for ``delay`` steps, then output it; reward ``-|a - cue|`` at the query.

    Args:
        delay: steps between the cue (t = 0) and the query (t = delay); 0 shows cue and query together.
    """

    metadata = {"render_modes": []}

    def __init__(self, delay: int = 5) -> None:
        if int(delay) != delay or delay < 0:
            raise ValueError(f"delay must be an integer >= 0, got {delay!r}")
        self.delay = int(delay)
        self.horizon = self.delay + 1
        self.render_mode = None
        self.observation_space = spaces.Box(
            low=np.array([-1.0, 0.0], np.float32), high=np.array([1.0, 1.0], np.float32), dtype=np.float32
        )
        self.action_space = spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
        self._cue = 0.0
        self._t = 0

    def _obs(self) -> np.ndarray:
        value = self._cue if self._t == 0 else 0.0
        query = 1.0 if self._t == self.delay else 0.0
        return np.array([value, query], dtype=np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        # Rounded to float32 so the cue the agent sees is exactly the one it is scored against.
        self._cue = float(np.float32(self.np_random.uniform(-1.0, 1.0)))
        self._t = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self._t > self.delay:
            raise RuntimeError("step() called after the episode ended; call reset() first")
        info: dict[str, Any] = {}
        if self._t == self.delay:
            a = float(np.clip(np.asarray(action, dtype=np.float64).reshape(-1)[0], -1.0, 1.0))
            error = abs(a - self._cue)
            info["abs_error"] = error
            reward, terminated = -error, True
        else:
            reward, terminated = 0.0, False
        self._t += 1
        return self._obs(), float(reward), terminated, False, info
