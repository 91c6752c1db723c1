"""Passive T-Maze: remember a one-bit cue shown only at the first step, over a corridor of length L.

The T-Maze of Bakker (2001, "Reinforcement learning with long short-term memory", NeurIPS 14) in the passive
form used by Ni et al. (2023, "When do transformers shine in RL?", arXiv 2307.03864) to measure pure memory
length. The agent starts at the west end (x = 0) of a corridor of ``L = corridor_length`` cells; the
T-junction is at x = L, with the two goal cells north (y = +1) and south (y = -1) of it. At t = 0 the
observation carries the cue: +1 if the goal is north, -1 if south. Afterwards every corridor cell looks the
same, and the junction cells only say "junction". The episode lasts exactly ``horizon = L + 1`` steps: the
fastest route walks east L times and turns at step L + 1; on that last step the reward is ``goal_reward``
(default 1) if the agent stands on the cued goal and 0 otherwise, and ``info["success"]`` reports which.
Following Ni et al., each of the first L steps costs ``penalty`` (default ``-1/L``) when the agent is behind
the optimal schedule (x < t), so a random policy earns about -1 and exploring the corridor is easy; with
``penalty=0`` the reward is Bakker's sparse one. The memory needed is exactly L steps (the cue at t = 0 is
used at t = L); a memoryless policy reaches the junction but can only guess, succeeding half of the time.

``penalty_on="action"`` is the recoverable variant of AMAGO (Grigsby et al. 2024, arXiv 2310.09971, its
``TMazeAltPassive``): the penalty is charged for each non-east action of the first L steps, wherever the agent
stands, so a mistake costs once instead of on every later step. Under Ni et al.'s ``penalty_on="lag"`` (the
default) a policy that moves east with probability p reaches the junction on schedule with probability p^L
(0.37 for p = 0.99 at L = 100) and every step behind schedule keeps costing, so its return and gradients are
dominated by the exploration of the corridor rather than by memory; with ``"action"`` each wrong move is
charged exactly once, at the step that made it, and the policy's east probability is learnt from a clean
per-step signal. The horizon (L + 1) is the same in both, so either variant's solution is the same policy.

Scores (undiscounted return): optimal = ``goal_reward`` = 1 (east L times, then the cued turn: no penalty);
best memoryless = 0.5 (right schedule, coin-flip turn). Uniform random, exactly: the agent is on schedule at
step t only if it moved east t times in a row (probability 4^-t), and succeeds only from the junction at
t = L with the one correct move, so ``E[return] = penalty * sum_{t=1..L} (1 - 4^-t) + goal_reward * 4^-(L+1)``
(:func:`random_policy_return`): -0.9332, -0.9667, -0.9967 for L = 5, 10, 100 with the default penalty. With
``penalty_on="action"`` a random policy pays for 3/4 of its L corridor moves: ``E[return] = 0.75 L penalty +
goal_reward * 4^-(L+1)`` = -0.75 (+ 4^-(L+1)) with the default penalty.

Spaces: observation ``Box(float32, (2,))`` = ``[cue, at_junction]`` with cue in {-1, 0, +1} (non-zero only at
t = 0) and at_junction in {0, 1}; action ``Discrete(4)``: 0 east (forward), 1 north, 2 west, 3 south. Moves
into walls leave the agent in place. ``reset(options={"goal": +1 | -1})`` fixes the goal side.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

EAST, NORTH, WEST, SOUTH = 0, 1, 2, 3
_MOVES = {EAST: (1, 0), NORTH: (0, 1), WEST: (-1, 0), SOUTH: (0, -1)}


class TMazeEnv(gym.Env[np.ndarray, np.int64]):
    """Passive T-Maze (Bakker 2001; Ni et al. 2023, arXiv 2307.03864) with a configurable corridor length.

    Args:
        corridor_length: L, number of cells from the start to the junction (memory length); L >= 1.
        penalty: reward of each of the first L steps on which the agent is behind schedule (x < t);
            ``None`` means Ni et al.'s ``-1/L`` (sum over an idle episode = -1); 0 disables it. Must be <= 0.
        goal_reward: reward for standing on the cued goal at the last step; > 0.
        penalty_on: "lag" (Ni et al.: each of the first L steps on which x < t) or "action" (AMAGO's
            recoverable variant: each non-east action of the first L steps).
        render_mode: ``None``, ``"ansi"`` (a text picture of the maze) or ``"rgb_array"`` (an image, 16 px per
            cell: corridor grey, agent blue, cued goal green, other arm red; used for videos and by SB3's
            ``make_vec_env``, which asks for ``rgb_array``).
    """

    metadata = {"render_modes": ["ansi", "rgb_array"], "render_fps": 4}

    def __init__(
        self,
        corridor_length: int = 10,
        penalty: float | None = None,
        goal_reward: float = 1.0,
        render_mode: str | None = None,
        penalty_on: str = "lag",
    ) -> None:
        if int(corridor_length) != corridor_length or corridor_length < 1:
            raise ValueError(f"corridor_length must be an integer >= 1, got {corridor_length!r}")
        if penalty is not None and penalty > 0:
            raise ValueError(f"penalty must be <= 0 (a cost for lagging behind), got {penalty!r}")
        if goal_reward <= 0:
            raise ValueError(f"goal_reward must be > 0, got {goal_reward!r}")
        if penalty_on not in ("lag", "action"):
            raise ValueError(f"penalty_on must be 'lag' or 'action', got {penalty_on!r}")
        if render_mode not in (None, *self.metadata["render_modes"]):
            raise ValueError(f"render_mode={render_mode!r}; valid: None, {self.metadata['render_modes']}")
        self.corridor_length = int(corridor_length)
        self.penalty = -1.0 / self.corridor_length if penalty is None else float(penalty)
        self.goal_reward = float(goal_reward)
        self.penalty_on = penalty_on
        self.render_mode = render_mode
        self.horizon = self.corridor_length + 1
        self.observation_space = spaces.Box(
            low=np.array([-1.0, 0.0], np.float32), high=np.array([1.0, 1.0], np.float32), dtype=np.float32
        )
        self.action_space = spaces.Discrete(4)
        self._x = 0
        self._y = 0
        self._t = 0
        self._goal = 1

    def _obs(self) -> np.ndarray:
        cue = float(self._goal) if self._t == 0 else 0.0
        at_junction = 1.0 if self._x == self.corridor_length else 0.0
        return np.array([cue, at_junction], dtype=np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        goal = (options or {}).get("goal")
        if goal is None:
            self._goal = 1 if self.np_random.integers(2) == 1 else -1
        elif goal in (1, -1):
            self._goal = int(goal)
        else:
            raise ValueError(f"options['goal'] must be +1 (north) or -1 (south), got {goal!r}")
        self._x, self._y, self._t = 0, 0, 0
        return self._obs(), {}

    def _can_enter(self, x: int, y: int) -> bool:
        if y == 0:
            return 0 <= x <= self.corridor_length
        return x == self.corridor_length and y in (-1, 1)

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self._t >= self.horizon:
            raise RuntimeError("step() called after the episode ended; call reset() first")
        a = int(np.asarray(action).item())
        if a not in _MOVES:
            raise ValueError(f"action must be in 0..3 (east, north, west, south), got {action!r}")
        dx, dy = _MOVES[a]
        if self._can_enter(self._x + dx, self._y + dy):
            self._x, self._y = self._x + dx, self._y + dy
        self._t += 1
        info: dict[str, Any] = {}
        if self._t < self.horizon:
            behind = a != EAST if self.penalty_on == "action" else self._x < self._t
            reward = self.penalty if behind else 0.0
            terminated = False
        else:
            success = self._y == self._goal
            reward = self.goal_reward if success else 0.0
            terminated = True
            info["success"] = bool(success)
        return self._obs(), float(reward), terminated, False, info

    def render(self) -> str | np.ndarray | None:
        if self.render_mode == "rgb_array":
            return self._image()
        if self.render_mode != "ansi":
            return None
        length = self.corridor_length
        rows = []
        for y in (1, 0, -1):
            row = [" "] * (length + 1)
            if y == 0:
                row = ["."] * (length + 1)
                row[0] = "N" if self._goal == 1 else "S"
            else:
                row[length] = "G" if y == self._goal else "x"
            if self._y == y:
                row[self._x] = "A"
            rows.append("".join(row))
        return "\n".join(rows) + f"\nt={self._t}/{self.horizon}\n"

    def _image(self, cell: int = 16) -> np.ndarray:
        """(3 * cell, (L + 1) * cell, 3) uint8 picture: rows north / corridor / south, walls black."""
        length = self.corridor_length
        grid = np.zeros((3, length + 1, 3), dtype=np.uint8)
        grid[1, :] = (128, 128, 128)
        if self._t == 0:  # the cue is visible only at the first step
            grid[1, 0] = (0, 160, 0) if self._goal == 1 else (160, 0, 0)
        for y in (1, -1):
            grid[1 - y, length] = (0, 200, 0) if y == self._goal else (200, 0, 0)
        grid[1 - self._y, self._x] = (40, 80, 255)
        return np.repeat(np.repeat(grid, cell, axis=0), cell, axis=1)


def random_policy_return(
    corridor_length: int, penalty: float | None = None, goal_reward: float = 1.0, penalty_on: str = "lag"
) -> float:
    """Exact expected return of the uniformly random policy on :class:`TMazeEnv` (see the module docstring)."""
    length = int(corridor_length)
    step_penalty = -1.0 / length if penalty is None else float(penalty)
    if penalty_on == "action":
        return step_penalty * 0.75 * length + goal_reward * 0.25 ** (length + 1)
    on_schedule = sum(0.25**t for t in range(1, length + 1))
    return step_penalty * (length - on_schedule) + goal_reward * 0.25 ** (length + 1)
