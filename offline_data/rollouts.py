"""Rollouts of the dataset builder: actors, episode collection, evaluation, and the training-episode recorder.

An *actor* maps one observation to one action (`random_actor`: uniform from a seeded copy of the action
space; `sb3_actor`: a Stable-Baselines3 model, sampled by default as D4RL's data collection did, Fu et al.
2020, arXiv 2004.07219). `collect_episodes` runs an actor for whole episodes, episode i reset with seed
`seed + i`; `EpisodeRecorder` keeps the complete episodes a training env produces (the medium-replay data).
Both assemble each `Episode` from its T + 1 observations with `_EpisodeSteps`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
from tqdm.auto import tqdm

from offline_data.episode import Episode, episode_returns

if TYPE_CHECKING:
    from offline_data.build_config import BuildConfig

__all__ = [
    "Actor",
    "EpisodeRecorder",
    "collect_episodes",
    "evaluate_returns",
    "make_build_env",
    "random_actor",
    "sb3_actor",
]

Actor = Callable[[np.ndarray], Any]


def random_actor(action_space: gym.spaces.Space, seed: int) -> Actor:
    """Uniform random actions from a seeded copy of `action_space`."""
    space = copy.deepcopy(action_space)
    space.seed(seed)
    return lambda _obs: space.sample()


def sb3_actor(model: Any, deterministic: bool = False) -> Actor:
    """An SB3 model as an actor; `deterministic=False` samples like D4RL's data collection."""
    return lambda obs: model.predict(obs, deterministic=deterministic)[0]


def make_build_env(config: BuildConfig) -> gym.Env:
    """The config's env (through `envs.resolve`, with its time-limit override)."""
    from envs.resolve import make_env

    kwargs = {} if config.max_episode_steps is None else {"max_episode_steps": config.max_episode_steps}
    return make_env(config.env_id, source="--env-id", allow_modules=config.allow_env_modules, **kwargs)


class _EpisodeSteps:
    """The steps of one episode as they come, from its reset observation to its last step."""

    def __init__(self, first_observation: Any) -> None:
        self.observations = [first_observation]
        self.actions: list[np.ndarray] = []
        self.rewards: list[float] = []
        self.terminations: list[bool] = []
        self.truncations: list[bool] = []

    def add(self, observation: Any, action: Any, reward: Any, terminated: Any, truncated: Any) -> None:
        self.observations.append(observation)
        self.actions.append(np.asarray(action))
        self.rewards.append(float(reward))
        self.terminations.append(bool(terminated))
        self.truncations.append(bool(truncated))

    def episode(self, seed: int | None = None) -> Episode:
        return Episode.from_observation_sequence(
            np.stack(self.observations),
            np.stack(self.actions),
            self.rewards,
            self.terminations,
            self.truncations,
            seed=seed,
        )


def collect_episodes(
    env: gym.Env,
    actor: Actor,
    *,
    seed: int,
    num_steps: int | None = None,
    num_episodes: int | None = None,
    progress: bool = False,
    desc: str = "collect",
) -> list[Episode]:
    """Run `actor` in `env` for `num_episodes` episodes, or whole episodes until >= `num_steps` steps.

    Episode i resets with seed `seed + i` (stored on the episode). Episodes end on termination or
    truncation (the env's time limit).
    """
    if (num_steps is None) == (num_episodes is None):
        raise ValueError(f"give exactly one of num_steps / num_episodes, got {num_steps!r}, {num_episodes!r}")
    episodes: list[Episode] = []
    total = 0
    bar = tqdm(
        total=num_episodes if num_episodes is not None else num_steps,
        desc=desc,
        unit="ep" if num_episodes is not None else "step",
        disable=not progress,
        leave=False,
    )
    with bar:
        while (num_episodes is not None and len(episodes) < num_episodes) or (
            num_steps is not None and total < num_steps
        ):
            ep_seed = seed + len(episodes)
            obs, _ = env.reset(seed=ep_seed)
            steps = _EpisodeSteps(obs)
            while True:
                action = actor(obs)
                obs, reward, terminated, truncated, _ = env.step(action)
                steps.add(obs, action, reward, terminated, truncated)
                if terminated or truncated:
                    break
            episodes.append(steps.episode(seed=ep_seed))
            total += len(steps.rewards)
            bar.update(1 if num_episodes is not None else len(steps.rewards))
    return episodes


def evaluate_returns(env: gym.Env, actor: Actor, n_episodes: int, seed: int) -> np.ndarray:
    """(n_episodes,) returns of `actor`, episode i reset with `seed + i`."""
    return episode_returns(collect_episodes(env, actor, seed=seed, num_episodes=n_episodes))


class EpisodeRecorder(gym.Wrapper):
    """Keeps every complete episode the training env produces while `active` (the medium-replay data)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.active = True
        self.episodes: list[Episode] = []
        self._current: _EpisodeSteps | None = None

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        self._current = _EpisodeSteps(obs) if self.active else None
        return obs, info

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self._current is not None:
            self._current.add(obs, action, reward, terminated, truncated)
            if terminated or truncated:
                self.episodes.append(self._current.episode())
                self._current = None
        return obs, reward, terminated, truncated, info
