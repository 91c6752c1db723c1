"""Offline memory tasks: scripted oracles and the episode generator of the memory datasets.

Two tasks whose data a policy can only imitate with memory, as in RATE's offline T-Maze (Cherepanov et al.
2023, arXiv 2306.09459):

    tmaze            passive T-Maze (``rlt/TMaze-v0``, Bakker 2001; Ni et al. 2023, arXiv 2307.03864) with
                     corridor length L = the memory length; horizon L + 1. Oracle: remember the cue of t = 0,
                     walk east until the junction flag, turn to the cued side.
    repeat-previous  RepeatPrevious (``rlt/RepeatPreviousLong-v0``; POPGym, Morad et al. 2023, arXiv
                     2303.01859) with delay k = the memory length and 2k steps (k = 32 is the registered id).
                     Oracle: a FIFO of the symbols seen, answer the one k steps back.

Behaviour: a share ``random_share`` of the episodes (exactly ``round(random_share * N)``, at seeded random
positions) is played by a uniform random policy; the others by the oracle whose every action is replaced,
with probability ``epsilon``, by a uniform random one. Episode i resets with ``seed + i``; its ε draws and
random actions come from ``numpy.random.default_rng([seed, i])``, so an episode never depends on the
others (a build is reproducible and can be cut anywhere). Closed forms used by the tests: on the T-Maze a
single non-east action in the corridor (horizon L + 1) makes the turn unreachable, so an ε-oracle succeeds
with probability ``(1 - 3ε/4)^(L+1)``; on RepeatPrevious its expected return is ``1 - 3ε/4``.

References (``reference_scores``): the random score is the exact expected return of the uniform policy
(:func:`envs.tmaze.random_policy_return`, 1/n for RepeatPrevious); the oracle score is the oracle's mean
return at ε = 0, measured (it equals the optimum 1 on both tasks).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import gymnasium as gym
import numpy as np
from tqdm.auto import tqdm

from envs.tmaze import EAST, NORTH, SOUTH, random_policy_return
from offline_data.episode import Episode

__all__ = [
    "MEMORY_TASKS",
    "MemoryTaskName",
    "OfflineMemoryTask",
    "Oracle",
    "RepeatPreviousOracle",
    "TMazeOracle",
    "generate_episodes",
    "make_task_env",
    "random_episode_mask",
]

MemoryTaskName = Literal["tmaze", "repeat-previous"]


class Oracle(Protocol):
    """A scripted policy with memory: ``reset`` at each episode start, then one action per observation."""

    def reset(self) -> None: ...

    def __call__(self, observation: np.ndarray) -> int: ...


class TMazeOracle:
    """Optimal T-Maze policy: remembers the cue of the first observation, east until the junction, then turn."""

    def __init__(self) -> None:
        self._cue = 0.0

    def reset(self) -> None:
        self._cue = 0.0

    def __call__(self, observation: np.ndarray) -> int:
        cue, at_junction = float(observation[0]), float(observation[1])
        if cue != 0.0:  # only the first observation carries the cue
            self._cue = cue
        if at_junction < 0.5:
            return EAST
        return NORTH if self._cue > 0 else SOUTH


class RepeatPreviousOracle:
    """Optimal RepeatPrevious policy: a FIFO of the symbols seen; answers the one ``delay`` steps back."""

    def __init__(self, delay: int) -> None:
        self.delay = int(delay)
        self._seen: list[int] = []

    def reset(self) -> None:
        self._seen = []

    def __call__(self, observation: np.ndarray) -> int:
        self._seen.append(int(np.argmax(observation)))
        t = len(self._seen) - 1
        return self._seen[t - self.delay] if t >= self.delay else 0  # steps t < delay are not scored


@dataclass(frozen=True)
class OfflineMemoryTask:
    """How to build, solve and score one memory task at a given memory length."""

    name: MemoryTaskName
    """CLI name of the task."""
    env_id: str
    """Registered Gymnasium id; the memory length enters through ``env_kwargs``."""
    env_kwargs: Callable[[int], dict[str, Any]]
    """Constructor keyword arguments for a memory length."""
    oracle: Callable[[int], Oracle]
    """A fresh oracle for a memory length."""
    random_score: Callable[[int], float]
    """Exact expected return of the uniform random policy at a memory length."""
    default_lengths: tuple[int, ...]
    """Memory lengths built when none are given."""
    length_meaning: str
    """What the memory length is, for descriptions and docs."""


MEMORY_TASKS: dict[str, OfflineMemoryTask] = {
    "tmaze": OfflineMemoryTask(
        name="tmaze",
        env_id="rlt/TMaze-v0",
        env_kwargs=lambda length: {"corridor_length": length},
        oracle=lambda _length: TMazeOracle(),
        random_score=random_policy_return,
        default_lengths=(10, 50, 200),
        length_meaning="corridor length L (cue at t = 0, used at t = L)",
    ),
    "repeat-previous": OfflineMemoryTask(
        name="repeat-previous",
        env_id="rlt/RepeatPreviousLong-v0",
        env_kwargs=lambda length: {"n_symbols": 4, "delay": length, "episode_length": 2 * length},
        oracle=RepeatPreviousOracle,
        random_score=lambda _length: 0.25,
        default_lengths=(32,),
        length_meaning="delay k (answer the symbol seen k steps ago; 4 symbols, 2k steps)",
    ),
}
"""The offline memory tasks by CLI name."""


def make_task_env(task: OfflineMemoryTask, length: int) -> gym.Env:
    """The task's env at memory length ``length`` (through ``envs.resolve``; its spec stores the kwargs)."""
    from envs.resolve import make_env

    return make_env(task.env_id, source=f"memory task {task.name!r}", **task.env_kwargs(length))


def random_episode_mask(num_episodes: int, random_share: float, seed: int) -> np.ndarray:
    """(num_episodes,) bool: which episodes the random policy plays (exactly round(share * N), seeded)."""
    count = round(random_share * num_episodes)
    mask = np.zeros(num_episodes, dtype=bool)
    mask[np.random.default_rng([seed, 0x5EED]).permutation(num_episodes)[:count]] = True
    return mask


def _play(env: gym.Env, oracle: Oracle | None, epsilon: float, seed: int, index: int) -> Episode:
    """One episode reset with ``seed + index``; ``oracle=None`` plays uniformly at random."""
    n_actions = int(getattr(env.action_space, "n", 0))
    if n_actions < 1:
        raise ValueError(f"memory tasks need a Discrete action space, got {env.action_space}")
    rng = np.random.default_rng([seed, index])
    obs, _ = env.reset(seed=seed + index)
    if oracle is not None:
        oracle.reset()
    observations, actions, rewards, terminations, truncations = [obs], [], [], [], []
    while True:
        # the oracle sees every observation (its memory stays right) even when ε overrides its action
        planned = oracle(obs) if oracle is not None else 0
        explore = oracle is None or rng.random() < epsilon
        action = int(rng.integers(n_actions)) if explore else planned
        obs, reward, terminated, truncated, _ = env.step(action)
        observations.append(obs)
        actions.append(action)
        rewards.append(float(reward))
        terminations.append(bool(terminated))
        truncations.append(bool(truncated))
        if terminated or truncated:
            break
    return Episode.from_observation_sequence(
        np.stack(observations),
        np.asarray(actions, dtype=np.int64),
        rewards,
        terminations,
        truncations,
        seed=seed + index,
    )


def generate_episodes(
    task: OfflineMemoryTask,
    length: int,
    *,
    num_episodes: int,
    epsilon: float,
    random_mask: Sequence[bool] | np.ndarray,
    seed: int,
    progress: bool = False,
    desc: str = "episodes",
) -> list[Episode]:
    """``num_episodes`` episodes: ``random_mask[i]`` uniform random, else the ε-oracle (module docstring)."""
    if len(random_mask) != num_episodes:
        raise ValueError(f"random_mask has {len(random_mask)} entries for {num_episodes} episodes")
    if not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"epsilon must lie in [0, 1], got {epsilon!r}")
    env = make_task_env(task, length)
    oracle = task.oracle(length)
    episodes = []
    try:
        for index in tqdm(range(num_episodes), desc=desc, unit="ep", disable=not progress, leave=False):
            episodes.append(_play(env, None if random_mask[index] else oracle, epsilon, seed, index))
    finally:
        env.close()
    return episodes
