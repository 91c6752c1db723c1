"""Datasets checked against their env: spaces from the env, float-coded actions, refusals."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from offline_data import Episode, load_episodes, write_d4rl_hdf5, write_minari_dataset
from offline_data.errors import DatasetError, DatasetNotFoundError
from rl_transformers.algos.dt_data import TrajectoryDataset
from tests.offline_data.helpers import record_raw


def _float_coded(env_id: str, n: int = 3, seed: int = 0) -> list[Episode]:
    """Random-policy episodes with the actions stored as float64, as D4RL files store them."""
    episodes = [raw.to_episode() for raw in record_raw(env_id, n, seed, max_episode_steps=20)]
    return [
        Episode(
            observations=ep.observations,
            actions=ep.actions.astype(np.float64).reshape(len(ep), -1),
            rewards=ep.rewards,
            terminations=ep.terminations,
            truncations=ep.truncations,
            next_observations=ep.next_observations,
        )
        for ep in episodes
    ]


def test_float_coded_discrete_actions_become_the_envs_discrete_space(tmp_path: Path) -> None:
    episodes = _float_coded("CartPole-v1")
    assert np.issubdtype(episodes[0].actions.dtype, np.floating)
    path = write_d4rl_hdf5(tmp_path / "cartpole.hdf5", episodes)
    # without the env the data looks continuous ...
    _, raw_info = load_episodes(path)
    assert isinstance(raw_info.action_space, gym.spaces.Box)
    # ... with it, the env's space wins and the actions are converted exactly
    loaded, info = load_episodes(path, env_id="CartPole-v1")
    assert info.action_space == gym.spaces.Discrete(2) and info.discrete_actions
    assert info.observation_space.shape == (4,) and info.metadata["spaces_from"] == "env CartPole-v1"
    for got, want in zip(loaded, episodes, strict=True):
        assert got.actions.dtype == np.int64 and got.actions.shape == (len(want),)
        np.testing.assert_array_equal(got.actions, want.actions[:, 0].astype(np.int64))
        np.testing.assert_array_equal(got.observations, want.observations)
    data = TrajectoryDataset(loaded, discrete_actions=info.discrete_actions)
    assert data.actions.dtype == np.int64


def test_non_integral_discrete_actions_are_refused_with_their_values(tmp_path: Path) -> None:
    episodes = _float_coded("CartPole-v1")
    bad = episodes[1].actions.copy()
    bad[3, 0] = 0.5
    episodes[1] = Episode(
        observations=episodes[1].observations,
        actions=bad,
        rewards=episodes[1].rewards,
        terminations=episodes[1].terminations,
        truncations=episodes[1].truncations,
        next_observations=episodes[1].next_observations,
    )
    path = write_d4rl_hdf5(tmp_path / "cartpole.hdf5", episodes)
    with pytest.raises(
        DatasetError, match=r"Discrete\(2\).*non-integral actions \(episode 1 step 3: \[0\.5\]\)"
    ):
        load_episodes(path, env_id="CartPole-v1")
    # out of range integers too
    episodes[1] = _float_coded("CartPole-v1")[1]
    wrong = episodes[1].actions.copy()
    wrong[0, 0] = 2.0
    episodes[1] = Episode(
        observations=episodes[1].observations,
        actions=wrong,
        rewards=episodes[1].rewards,
        terminations=episodes[1].terminations,
        truncations=episodes[1].truncations,
        next_observations=episodes[1].next_observations,
    )
    path = write_d4rl_hdf5(tmp_path / "range.hdf5", episodes)
    with pytest.raises(DatasetError, match=r"valid 0\.\.1\): episode 1 step 0: 2$"):
        load_episodes(path, env_id="CartPole-v1")
    # the batcher refuses silent truncation even without an env
    clean = _float_coded("CartPole-v1")
    half = clean[1].actions.copy()
    half[3, 0] = 0.5
    with pytest.raises(ValueError, match=r"episode 1 holds \(step, value\) \[\(3, \[0\.5\]\)\]"):
        TrajectoryDataset([clean[0], Episode(**_fields(clean[1], half))], discrete_actions=True)


def _fields(ep: Episode, actions: np.ndarray) -> dict:
    return {
        "observations": ep.observations,
        "actions": actions[: len(ep)],
        "rewards": ep.rewards,
        "terminations": ep.terminations,
        "truncations": ep.truncations,
        "next_observations": ep.next_observations,
    }


def test_box_bounds_come_from_the_env(tmp_path: Path, minari_root: Path) -> None:
    episodes = [raw.to_episode() for raw in record_raw("Pendulum-v1", 2, 0, max_episode_steps=15)]
    scaled = [Episode(**_fields(ep, np.clip(ep.actions, -1.999, 1.999))) for ep in episodes]
    path = write_d4rl_hdf5(tmp_path / "pendulum.hdf5", scaled)
    _, inferred = load_episodes(path)
    data_max = max(float(ep.actions.max()) for ep in scaled)
    assert (
        float(inferred.action_space.high[0]) == pytest.approx(data_max) and data_max < 2
    )  # the data's range
    _, info = load_episodes(path, env_id="Pendulum-v1")
    env = gym.make("Pendulum-v1")
    assert info.action_space == env.action_space  # [-2, 2] from the env, not the data
    np.testing.assert_array_equal(info.observation_space.high, env.observation_space.high)
    # a Minari dataset written without an env: its stored env-free spaces are replaced when an env is known
    write_minari_dataset("test/pend-v0", scaled, action_space=gym.spaces.Box(-1.999, 1.999, (1,), np.float32))
    _, minari_info = load_episodes("test/pend-v0", env_id="Pendulum-v1")
    assert minari_info.action_space == env.action_space
    # actions outside the env's bounds are refused with their values
    far = [Episode(**_fields(ep, ep.actions * 2.0)) for ep in episodes]
    far_path = write_d4rl_hdf5(tmp_path / "far.hdf5", far)
    with pytest.raises(DatasetError, match=r"outside the env's bounds.*episode 0 step \d+: \[-?[2-4]\."):
        load_episodes(far_path, env_id="Pendulum-v1")


def test_observation_shape_mismatch_is_refused(tmp_path: Path) -> None:
    episodes = [raw.to_episode() for raw in record_raw("Pendulum-v1", 1, 0, max_episode_steps=10)]
    path = write_d4rl_hdf5(tmp_path / "pendulum.hdf5", episodes)
    with pytest.raises(
        DatasetError, match=r"observations of shape \(3,\); the env's observation space .* \(4,\)"
    ):
        load_episodes(path, env_id="CartPole-v1")
    # check_env=False keeps the old behaviour (the data's own spaces)
    _, info = load_episodes(path, env_id="CartPole-v1", check_env=False)
    assert info.observation_space.shape == (3,)


def test_bad_dataset_paths_get_clear_errors(tmp_path: Path, minari_root: Path) -> None:
    text = tmp_path / "notes.hdf5"
    text.write_text("not hdf5 at all")
    with pytest.raises(DatasetError, match=r"notes\.hdf5' is not an HDF5 file"):
        load_episodes(text)
    other = tmp_path / "model.pt"
    other.write_bytes(b"\x00\x01garbage")
    with pytest.raises(DatasetError, match=r"model\.pt' is not a dataset: expected"):
        load_episodes(other)
    with pytest.raises(DatasetNotFoundError, match=r"dataset path .*missing\.hdf5' does not exist"):
        load_episodes(tmp_path / "missing.hdf5")
    with pytest.raises(DatasetNotFoundError, match=r"no file or directory 'nowhere', and it is not a Minari"):
        load_episodes("nowhere")
    with pytest.raises(DatasetNotFoundError, match=r"dataset path './gone/' does not exist"):
        load_episodes("./gone/")
    with pytest.raises(FileNotFoundError):  # still a FileNotFoundError for existing callers
        load_episodes(tmp_path / "missing.h5")
