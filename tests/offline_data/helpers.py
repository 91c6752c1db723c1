"""Small episodes recorded by a plain env loop, independent of the builder and the readers."""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from offline_data import Episode


@dataclass
class RawEpisode:
    """What a plain env loop saw: T + 1 observations, T actions / rewards / flags."""

    observations: list[np.ndarray]
    actions: list[np.ndarray]
    rewards: list[float]
    terminations: list[bool]
    truncations: list[bool]
    seed: int

    def to_episode(self) -> Episode:
        return Episode(
            observations=np.stack(self.observations[:-1]),
            actions=np.stack(self.actions),
            rewards=np.asarray(self.rewards),
            terminations=np.asarray(self.terminations),
            truncations=np.asarray(self.truncations),
            next_observations=np.stack(self.observations[1:]),
            seed=self.seed,
        )


def record_raw(
    env_id: str, n_episodes: int, seed: int, max_episode_steps: int | None = None
) -> list[RawEpisode]:
    """Random-policy episodes; episode i resets with seed + i."""
    kwargs = {} if max_episode_steps is None else {"max_episode_steps": max_episode_steps}
    env = gym.make(env_id, **kwargs)
    env.action_space.seed(seed)
    episodes = []
    for i in range(n_episodes):
        obs, _ = env.reset(seed=seed + i)
        raw = RawEpisode([obs], [], [], [], [], seed + i)
        done = False
        while not done:
            action = env.action_space.sample()
            obs, reward, terminated, truncated, _ = env.step(action)
            raw.observations.append(obs)
            raw.actions.append(np.asarray(action))
            raw.rewards.append(float(reward))
            raw.terminations.append(bool(terminated))
            raw.truncations.append(bool(truncated))
            done = terminated or truncated
        episodes.append(raw)
    env.close()
    return episodes
