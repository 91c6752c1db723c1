"""The episode form every offline-data reader returns, and the metadata that travels with it.

One `Episode` holds T aligned transitions: step t saw `observations[t]`, took `actions[t]`, received
`rewards[t]`, then reached `next_observations[t]` with flags `terminations[t]` / `truncations[t]`.
Minari stores T + 1 observations per episode (the reset observation and every following one); readers
turn them into `observations = obs[:-1]` and `next_observations = obs[1:]`, so the two never drift apart
(a misalignment after the first episode is a known bug of other loaders). Shapes:

    observations       (T, *obs_shape)   dtype as stored (float32 for most Box tasks, float64 for MuJoCo)
    next_observations  (T, *obs_shape)   same dtype; next_observations[-1] is the final observation
    actions            (T, act_dim)      floating, Box action spaces
                       (T,)              int64, Discrete action spaces (raw values, `start` not removed)
    rewards            (T,)              float64
    terminations       (T,)              bool, the MDP ended (e.g. the hopper fell)
    truncations        (T,)              bool, cut by a time limit or the end of the recording
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import EnvSpec
from numpy.typing import ArrayLike

from offline_data.errors import DatasetError
from offline_data.scores import normalized_score

__all__ = ["DatasetInfo", "Episode", "OfflineDataset", "check_episode_limit", "episode_returns"]


def check_episode_limit(spec: EnvSpec, where: str) -> None:
    """Refuse a spec whose ``max_episode_steps`` is not a positive count (gymnasium's ``TimeLimit`` would raise
    when the env is built, long after the file was read)."""
    steps = spec.max_episode_steps
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise DatasetError(
            f"{where}: env spec {spec.id!r} has max_episode_steps = {steps!r}, but a time limit must be a "
            "positive number of steps (or null for none); fix the file's env spec, or give the env with --env-id"
        )


@dataclass(frozen=True, eq=False)
class Episode:
    """T aligned transitions of one episode (see the module docstring for the shapes).

    Construction validates shapes, lengths and finiteness and raises `ValueError` naming the bad field;
    readers prefix the message with the file / dataset and the episode index.
    """

    observations: np.ndarray
    """(T, *obs_shape) observation seen before each action."""
    actions: np.ndarray
    """(T, act_dim) floating for Box actions, (T,) int64 for Discrete actions."""
    rewards: np.ndarray
    """(T,) float64 reward received after each action."""
    terminations: np.ndarray
    """(T,) bool, True where the MDP terminated."""
    truncations: np.ndarray
    """(T,) bool, True where the episode was cut (time limit / end of recording)."""
    next_observations: np.ndarray
    """(T, *obs_shape) observation reached after each action; the last row is the final observation."""
    seed: int | None = None
    """Reset seed of the episode when it is known (Minari stores it per episode)."""

    def __post_init__(self) -> None:
        obs = np.asarray(self.observations)
        nxt = np.asarray(self.next_observations)
        actions = np.asarray(self.actions)
        if obs.ndim < 1 or len(obs) == 0:
            raise ValueError(f"empty episode: observations has shape {obs.shape}, need at least one step")
        n = len(obs)
        if np.issubdtype(actions.dtype, np.integer) or actions.dtype == np.bool_:
            actions = actions.astype(np.int64)
        rewards = np.asarray(self.rewards, dtype=np.float64)
        if rewards.ndim == 2 and rewards.shape[1] == 1:
            rewards = rewards[:, 0]
        terminations = _as_flags(self.terminations, "terminations")
        truncations = _as_flags(self.truncations, "truncations")
        for name, arr in (
            ("actions", actions),
            ("rewards", rewards),
            ("terminations", terminations),
            ("truncations", truncations),
            ("next_observations", nxt),
        ):
            if arr.ndim < 1 or len(arr) != n:
                raise ValueError(
                    f"length mismatch: {name} has shape {arr.shape} but observations has {n} steps "
                    f"(shape {obs.shape})"
                )
        for name, arr in (("rewards", rewards), ("terminations", terminations), ("truncations", truncations)):
            if arr.ndim != 1:
                raise ValueError(f"{name} must be 1-D with {n} entries, got shape {arr.shape}")
        if nxt.shape != obs.shape:
            raise ValueError(f"next_observations has shape {nxt.shape}, observations has {obs.shape}")
        for name, arr in (
            ("observations", obs),
            ("next_observations", nxt),
            ("actions", actions),
            ("rewards", rewards),
        ):
            _check_finite(name, arr)
        object.__setattr__(self, "observations", obs)
        object.__setattr__(self, "next_observations", nxt)
        object.__setattr__(self, "actions", actions)
        object.__setattr__(self, "rewards", rewards)
        object.__setattr__(self, "terminations", terminations)
        object.__setattr__(self, "truncations", truncations)

    def __len__(self) -> int:
        return len(self.rewards)

    @property
    def final_observation(self) -> np.ndarray:
        """The observation after the last action, shape obs_shape."""
        return self.next_observations[-1]

    @property
    def total_return(self) -> float:
        """Undiscounted return (sum of rewards, in float64)."""
        return float(self.rewards.sum())

    @property
    def all_observations(self) -> np.ndarray:
        """Minari layout: (T + 1, *obs_shape), the T observations followed by the final one."""
        return np.concatenate([self.observations, self.next_observations[-1:]], axis=0)

    @classmethod
    def from_observation_sequence(
        cls,
        observations: ArrayLike,
        actions: ArrayLike,
        rewards: ArrayLike,
        terminations: ArrayLike,
        truncations: ArrayLike,
        seed: int | None = None,
    ) -> Episode:
        """Build from the Minari layout: `observations` has T + 1 rows, the other arrays T."""
        obs = np.asarray(observations)
        n_actions = len(np.asarray(rewards))
        if obs.ndim < 1 or len(obs) != n_actions + 1:
            raise ValueError(
                f"length mismatch: expected {n_actions + 1} observations (one more than the {n_actions} "
                f"rewards/actions), got shape {obs.shape}"
            )
        return cls(
            observations=obs[:-1],
            actions=np.asarray(actions),
            rewards=np.asarray(rewards),
            terminations=np.asarray(terminations),
            truncations=np.asarray(truncations),
            next_observations=obs[1:],
            seed=seed,
        )


def _as_flags(values: Any, name: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.dtype == np.bool_:
        return arr
    if arr.size and not np.isin(arr, (0, 1)).all():
        bad = arr[~np.isin(arr, (0, 1))].ravel()[0].item()
        raise ValueError(f"{name} must hold booleans or 0/1, found value {bad!r}")
    return arr.astype(np.bool_)


def _check_finite(name: str, arr: np.ndarray) -> None:
    if not np.issubdtype(arr.dtype, np.floating):
        return
    finite = np.isfinite(arr)
    if not finite.all():
        index = np.argwhere(~finite)[0]
        value = arr[tuple(index)].item()
        raise ValueError(
            f"{name} contains a non-finite value {value!r} at index {tuple(int(i) for i in index)}"
        )


def episode_returns(episodes: Sequence[Episode]) -> np.ndarray:
    """(E,) float64 undiscounted return of each episode."""
    return np.array([ep.total_return for ep in episodes], dtype=np.float64)


@dataclass(frozen=True)
class DatasetInfo:
    """What a reader knows about a dataset besides its episodes."""

    source: str
    """The id or path the data was loaded from."""
    format: str
    """"minari" or "d4rl_hdf5"."""
    observation_space: gym.spaces.Space
    """Observation space of the episodes (a Box; flattened when the stored space was a Dict of Boxes)."""
    action_space: gym.spaces.Space
    """Box or Discrete action space."""
    dataset_id: str | None = None
    """Minari dataset id (None for a D4RL file without one)."""
    env_spec: gym.envs.registration.EnvSpec | None = None
    """Spec of the environment the data was collected in."""
    eval_env_spec: gym.envs.registration.EnvSpec | None = None
    """Spec of the environment to evaluate policies in (falls back to `env_spec`)."""
    ref_min_score: float | None = None
    """Return of a random policy (normalized score 0)."""
    ref_max_score: float | None = None
    """Return of an expert policy (normalized score 100)."""
    ref_scores_source: str | None = None
    """Where the references came from: "dataset" (stored metadata) or "d4rl_table" (`D4RL_REF_SCORES`)."""
    observations_flattened: bool = False
    """True when Dict observations were flattened into one Box (keys in the Dict space's order)."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """The raw metadata of the dataset (Minari metadata.json, or the `metadata` group of a D4RL file)."""
    allow_env_modules: tuple[str, ...] = ()
    """Modules trusted beyond the defaults when building the env (`envs.resolve`, `--allow-env-modules`)."""

    @property
    def env_id(self) -> str | None:
        """Id of the evaluation environment (eval spec, else collection spec), or None if unknown."""
        spec = self.eval_env_spec or self.env_spec
        return None if spec is None else spec.id

    @property
    def discrete_actions(self) -> bool:
        """True for a Discrete action space."""
        return isinstance(self.action_space, gym.spaces.Discrete)

    def make_env(self, **kwargs: Any) -> gym.Env:
        """Build the evaluation environment (same max_episode_steps as the data) through `envs.resolve`.

        The spec is checked again against the allow-list, so a `DatasetInfo` built by hand from a file's
        spec cannot import code either."""
        from envs.resolve import make_env

        spec = self.eval_env_spec or self.env_spec
        if spec is None:
            raise ValueError(f"dataset {self.source!r} records no environment spec; cannot make its env")
        check_episode_limit(spec, f"dataset {self.source!r}")
        return make_env(
            spec, source=f"dataset {self.source!r}", allow_modules=self.allow_env_modules, **kwargs
        )

    def normalized_score(self, returns: float | np.ndarray) -> float | np.ndarray:
        """D4RL normalized score 100·(R − min)/(max − min) with this dataset's references."""
        if self.ref_min_score is None or self.ref_max_score is None:
            raise ValueError(
                f"dataset {self.source!r} has no reference scores; pass ref_min/ref_max to "
                "offline_data.normalized_score yourself"
            )
        return normalized_score(returns, self.ref_min_score, self.ref_max_score)


class OfflineDataset(NamedTuple):
    """What `load_episodes` returns: unpack as `episodes, info = load_episodes(source)`."""

    episodes: list[Episode]
    info: DatasetInfo
