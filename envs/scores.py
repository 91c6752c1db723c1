"""Measure the score (mean undiscounted episode return) of a uniformly random policy on a registered task.

``python -m envs.scores`` prints the Markdown table of ``envs.MEMORY_TASKS`` with a fresh measurement next to
the documented random score (tasks whose optional extra is missing are skipped).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from envs.registry import MEMORY_TASKS


@dataclass(frozen=True)
class ScoreEstimate:
    """Monte-Carlo estimate of a policy's mean episode return."""

    mean: float
    """Mean undiscounted return over the episodes."""
    stderr: float
    """Standard error of the mean (sample std / sqrt(n))."""
    n_episodes: int
    """Number of episodes averaged."""
    success_rate: float | None = None
    """Fraction of episodes with ``info["success"]`` true, when the task reports it."""


def random_policy_score(
    env_id: str, n_episodes: int = 200, seed: int = 0, **make_kwargs: Any
) -> ScoreEstimate:
    """Run ``n_episodes`` episodes of uniformly random actions (``action_space.sample()``) and average.

    Reproducible: the environment is reset with ``seed`` once and the action space is seeded with ``seed``.
    """
    if n_episodes < 1:
        raise ValueError(f"n_episodes must be >= 1, got {n_episodes}")
    env = gym.make(env_id, **make_kwargs)
    env.action_space.seed(seed)
    returns: list[float] = []
    successes: list[bool] = []
    try:
        for episode in range(n_episodes):
            env.reset(seed=seed if episode == 0 else None)
            total, done = 0.0, False
            info: dict[str, Any] = {}
            while not done:
                _, reward, terminated, truncated, info = env.step(env.action_space.sample())
                total += float(reward)
                done = terminated or truncated
            returns.append(total)
            if "success" in info:
                successes.append(bool(info["success"]))
    finally:
        env.close()
    values = np.asarray(returns)
    stderr = float(values.std(ddof=1) / math.sqrt(len(values))) if len(values) > 1 else math.inf
    success_rate = float(np.mean(successes)) if successes else None
    return ScoreEstimate(float(values.mean()), stderr, len(values), success_rate)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--episodes", type=int, default=2000, help="episodes per task")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print("| id | memory | random (documented) | random (measured ± s.e.) | optimal |")
    print("|---|---|---|---|---|")
    for task in MEMORY_TASKS.values():
        try:
            est = random_policy_score(task.id, n_episodes=args.episodes, seed=args.seed)
        except ImportError as err:
            print(f"| `{task.id}` | {task.memory} | {task.random_score:.4g} | skipped: {err} | |")
            continue
        print(
            f"| `{task.id}` | {task.memory} | {task.random_score:.4g} | "
            f"{est.mean:.4g} ± {est.stderr:.2g} | {task.optimal_score:.4g} |"
        )


if __name__ == "__main__":
    main()
