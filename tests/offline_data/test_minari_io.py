"""Minari round trips: what we record is what we read, aligned on every episode, with references stored."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import minari
import numpy as np
import pytest

from offline_data import Episode, load_episodes, minari_write, read_minari, write_minari_dataset
from rl_transformers.utils.errors import UserError
from tests.offline_data.helpers import record_raw

PENDULUM_REFS = (-1500.0, -150.0)


def _pendulum_reward_and_thdot(obs: np.ndarray, action: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pendulum-v1 physics from (observation, action) alone: the reward of the step and the next θ̇."""
    g, m, length, dt = 10.0, 1.0, 1.0, 0.05
    theta = np.arctan2(obs[:, 1].astype(np.float64), obs[:, 0].astype(np.float64))
    thdot = obs[:, 2].astype(np.float64)
    u = np.clip(action[:, 0].astype(np.float64), -2.0, 2.0)
    reward = -(theta**2 + 0.1 * thdot**2 + 0.001 * u**2)
    next_thdot = np.clip(
        thdot + (3 * g / (2 * length) * np.sin(theta) + 3.0 / (m * length**2) * u) * dt, -8, 8
    )
    return reward, next_thdot


def _metadata_json(path: Path) -> dict:
    return json.loads((path / "data" / "metadata.json").read_text())


@pytest.fixture
def pendulum_raw():
    # 25-step limit: every episode is truncated; 4 episodes so misalignment after episode 0 would show
    return record_raw("Pendulum-v1", n_episodes=4, seed=7, max_episode_steps=25)


def test_pendulum_round_trip_every_episode(minari_root: Path, pendulum_raw) -> None:
    env = gym.make("Pendulum-v1", max_episode_steps=25)
    path = write_minari_dataset(
        "test/pendulum/random-v0",
        [raw.to_episode() for raw in pendulum_raw],
        env=env.spec,
        ref_min_score=PENDULUM_REFS[0],
        ref_max_score=PENDULUM_REFS[1],
        algorithm_name="random",
        description="test data",
    )
    assert path == minari_root / "test" / "pendulum" / "random-v0"
    # Minari's own reader sees T + 1 observations per episode
    ds = minari.load_dataset("test/pendulum/random-v0")
    assert [len(ep.observations) for ep in ds.iterate_episodes()] == [26] * 4

    episodes, info = read_minari("test/pendulum/random-v0")
    assert len(episodes) == len(pendulum_raw) == 4
    for ep, raw in zip(episodes, pendulum_raw, strict=True):
        obs = np.stack(raw.observations)
        np.testing.assert_array_equal(ep.observations, obs[:-1])
        np.testing.assert_array_equal(ep.next_observations, obs[1:])
        np.testing.assert_array_equal(ep.final_observation, obs[-1])
        np.testing.assert_array_equal(ep.actions, np.stack(raw.actions))
        np.testing.assert_array_equal(ep.rewards, np.asarray(raw.rewards))
        assert ep.truncations.tolist() == raw.truncations and ep.truncations[-1]
        assert ep.terminations.tolist() == raw.terminations
        assert ep.seed == raw.seed
        # independent of our recorder: the physics ties each reward / next observation to its own (s, a)
        reward, next_thdot = _pendulum_reward_and_thdot(ep.observations, ep.actions)
        np.testing.assert_allclose(ep.rewards, reward, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(ep.next_observations[:, 2], next_thdot, rtol=1e-4, atol=1e-4)

    assert (info.ref_min_score, info.ref_max_score) == PENDULUM_REFS
    assert info.ref_scores_source == "dataset"
    meta = _metadata_json(path)
    assert (meta["ref_min_score"], meta["ref_max_score"]) == PENDULUM_REFS
    assert info.env_id == "Pendulum-v1" and info.eval_env_spec.max_episode_steps == 25
    assert isinstance(info.action_space, gym.spaces.Box) and not info.discrete_actions
    assert info.normalized_score(-150.0) == pytest.approx(100.0)
    assert info.make_env().spec.max_episode_steps == 25


def test_cartpole_discrete_round_trip_matches_dynamics(minari_root: Path) -> None:
    raws = record_raw("CartPole-v1", n_episodes=5, seed=3)
    write_minari_dataset(
        "test/cartpole/random-v0",
        [raw.to_episode() for raw in raws],
        env="CartPole-v1",
        ref_min_score=9.0,
        ref_max_score=500.0,
    )
    episodes, info = load_episodes(minari_root / "test" / "cartpole" / "random-v0")  # by directory
    assert info.discrete_actions and info.action_space == gym.spaces.Discrete(2)
    sim = gym.make("CartPole-v1").unwrapped
    sim.reset(seed=0)
    for ep, raw in zip(episodes, raws, strict=True):
        assert ep.actions.dtype == np.int64 and ep.actions.shape == (len(raw.actions),)
        np.testing.assert_array_equal(ep.actions, np.asarray(raw.actions))
        assert ep.terminations[-1] and not ep.terminations[:-1].any()
        for t in range(len(ep)):  # re-simulate every step from the stored observation and action
            sim.state = ep.observations[t].astype(np.float64)
            sim.steps_beyond_terminated = None
            nxt, _, terminated, _, _ = sim.step(int(ep.actions[t]))
            np.testing.assert_allclose(ep.next_observations[t], nxt, atol=1e-5)
            assert terminated == ep.terminations[t]


def test_references_kept_without_env_and_for_unmakeable_env(minari_root: Path, pendulum_raw) -> None:
    episodes = [raw.to_episode() for raw in pendulum_raw]
    env = gym.make("Pendulum-v1")
    # env=None: Minari itself would silently drop the references
    path = write_minari_dataset(
        "test/noenv-v0",
        episodes,
        observation_space=env.observation_space,
        action_space=env.action_space,
        ref_min_score=-1.0,
        ref_max_score=1.0,
    )
    meta = _metadata_json(path)
    assert (meta["ref_min_score"], meta["ref_max_score"]) == (-1.0, 1.0)
    assert "env_spec" not in meta
    # an env id that may not be makeable here (MuJoCo without `mujoco`): spec and references still land
    path = write_minari_dataset(
        "test/hopper-like-v0",
        episodes,
        env="Hopper-v5",
        observation_space=env.observation_space,
        action_space=env.action_space,
        ref_min_score=-20.272305,
        ref_max_score=3234.3,
    )
    meta = _metadata_json(path)
    assert meta["ref_min_score"] == -20.272305 and meta["ref_max_score"] == 3234.3
    assert json.loads(meta["env_spec"])["id"] == "Hopper-v5"
    assert json.loads(meta["eval_env_spec"])["id"] == "Hopper-v5"


def test_stored_spaces_are_the_given_ones_else_the_envs_else_inferred(pendulum_raw) -> None:
    """Each space on its own: a given one wins, else the makeable env's (true bounds), else the data's."""
    episodes = [raw.to_episode() for raw in pendulum_raw]
    spec = gym.spec("Pendulum-v1")
    given_obs = gym.spaces.Box(-5.0, 5.0, (3,), np.float32)
    obs, act = minari_write._dataset_spaces(spec, episodes, given_obs, None)
    assert obs == given_obs and act == gym.spaces.Box(-2.0, 2.0, (1,), np.float32)  # Pendulum's torque
    obs, act = minari_write._dataset_spaces(None, episodes, None, None)
    assert obs == gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    actions = np.concatenate([ep.actions for ep in episodes])  # the data's range (outside [-1, 1])
    assert act == gym.spaces.Box(actions.min(axis=0), actions.max(axis=0), dtype=np.float32)


def test_overwrite_protection(minari_root: Path, pendulum_raw) -> None:
    episodes = [raw.to_episode() for raw in pendulum_raw]
    write_minari_dataset("test/pendulum/medium-v0", episodes, env="Pendulum-v1")
    with pytest.raises(
        FileExistsError, match=r"already exists.*--overwrite.*'test/pendulum/medium-v1'"
    ) as err:
        write_minari_dataset("test/pendulum/medium-v0", episodes[:1], env="Pendulum-v1")
    assert isinstance(err.value, UserError)  # the CLIs print it as one error: line, no traceback
    assert len(read_minari("test/pendulum/medium-v0").episodes) == 4  # untouched
    write_minari_dataset("test/pendulum/medium-v0", episodes[:1], env="Pendulum-v1", overwrite=True)
    assert len(read_minari("test/pendulum/medium-v0").episodes) == 1


def test_failed_write_leaves_nothing(minari_root: Path, pendulum_raw) -> None:
    with pytest.raises(ValueError, match="dataset_id"):  # a key Minari refuses to update
        write_minari_dataset(
            "test/broken-v0",
            [raw.to_episode() for raw in pendulum_raw],
            env="Pendulum-v1",
            extra_metadata={"dataset_id": "other"},
        )
    assert not (minari_root / "test" / "broken-v0").exists()


def test_bad_ids_and_missing_dataset(minari_root: Path, pendulum_raw) -> None:
    episodes = [raw.to_episode() for raw in pendulum_raw]
    with pytest.raises(ValueError, match="malformed Minari dataset id 'no version'"):
        write_minari_dataset("no version", episodes, env="Pendulum-v1")
    with pytest.raises(ValueError, match="malformed"):
        read_minari("test/pendulum")  # no -vN
    write_minari_dataset("test/pendulum/expert-v0", episodes, env="Pendulum-v1")
    with pytest.raises(
        FileNotFoundError, match=r"test/pendulum/expret-v0.*Did you mean.*test/pendulum/expert-v0"
    ):
        read_minari("test/pendulum/expret-v0")
    with pytest.raises(ValueError, match="both reference scores or neither"):
        write_minari_dataset("test/x-v0", episodes, env="Pendulum-v1", ref_max_score=1.0)
    with pytest.raises(ValueError, match="no episodes"):
        write_minari_dataset("test/x-v0", [], env="Pendulum-v1")


def _write_raw_minari(dataset_id: str, obs_space, act_space, observations, actions) -> None:
    from minari.data_collector.episode_buffer import EpisodeBuffer

    buffer = EpisodeBuffer(
        observations=observations,
        actions=actions,
        rewards=np.zeros(3),
        terminations=np.array([False, False, True]),
        truncations=np.zeros(3, dtype=bool),
    )
    minari.create_dataset_from_buffers(
        dataset_id, [buffer], observation_space=obs_space, action_space=act_space, algorithm_name="test"
    )


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_dict_observations_flattened_other_spaces_rejected(minari_root: Path) -> None:
    obs_space = gym.spaces.Dict(
        {"a": gym.spaces.Box(-1, 1, (2,), np.float32), "b": gym.spaces.Box(-1, 1, (1,), np.float32)}
    )
    a = np.arange(8, dtype=np.float32).reshape(4, 2)
    b = -np.arange(4, dtype=np.float32).reshape(4, 1)
    act_space = gym.spaces.Discrete(3)
    _write_raw_minari("test/dict-v0", obs_space, act_space, {"a": a, "b": b}, np.array([0, 2, 1]))
    (ep,), info = read_minari("test/dict-v0")
    assert info.observations_flattened and info.observation_space.shape == (3,)
    np.testing.assert_array_equal(ep.observations, np.concatenate([a, b], axis=1)[:-1])
    np.testing.assert_array_equal(ep.final_observation, [6.0, 7.0, -3.0])

    _write_raw_minari(
        "test/multi-v0",
        gym.spaces.Box(-1, 1, (2,), np.float32),
        gym.spaces.MultiDiscrete([2, 2]),
        np.zeros((4, 2), np.float32),
        np.zeros((3, 2), np.int64),
    )
    with pytest.raises(ValueError, match=r"test/multi-v0.*unsupported action space MultiDiscrete"):
        read_minari("test/multi-v0")
    _write_raw_minari(
        "test/discobs-v0", gym.spaces.Discrete(5), act_space, np.array([0, 1, 2, 3]), np.array([0, 1, 2])
    )
    with pytest.raises(ValueError, match=r"unsupported observation space Discrete"):
        read_minari("test/discobs-v0")


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_misaligned_stored_episode_is_named(minari_root: Path) -> None:
    # a dataset with T observations instead of T + 1 (Minari#199-style corruption) and one with NaN
    box = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    _write_raw_minari(
        "test/short-v0", box, gym.spaces.Discrete(2), np.zeros((3, 2), np.float32), np.zeros(3, int)
    )
    with pytest.raises(
        ValueError, match=r"'test/short-v0' episode 0: length mismatch.*expected 4 observations"
    ):
        read_minari("test/short-v0")
    obs = np.zeros((4, 2), np.float32)
    obs[2, 1] = np.nan
    _write_raw_minari("test/nan-v0", box, gym.spaces.Discrete(2), obs, np.zeros(3, int))
    with pytest.raises(
        ValueError, match=r"'test/nan-v0' episode 0: .*non-finite value nan at index \(2, 1\)"
    ):
        read_minari("test/nan-v0")


def test_episode_validation_messages() -> None:
    good = {
        "observations": np.zeros((3, 2)),
        "actions": np.zeros((3, 1)),
        "rewards": np.zeros(3),
        "terminations": np.zeros(3, bool),
        "truncations": np.zeros(3, bool),
        "next_observations": np.zeros((3, 2)),
    }
    assert len(Episode(**good)) == 3
    with pytest.raises(ValueError, match="empty episode"):
        Episode(**{**good, **{k: v[:0] for k, v in good.items()}})
    with pytest.raises(ValueError, match=r"length mismatch: actions has shape \(2, 1\)"):
        Episode(**{**good, "actions": np.zeros((2, 1))})
    with pytest.raises(ValueError, match=r"rewards contains a non-finite value inf at index \(1,\)"):
        Episode(**{**good, "rewards": np.array([0.0, np.inf, 0.0])})
    with pytest.raises(ValueError, match="terminations must hold booleans or 0/1, found value 2"):
        Episode(**{**good, "terminations": np.array([0, 2, 0])})
    with pytest.raises(ValueError, match="expected 4 observations"):
        Episode.from_observation_sequence(
            np.zeros((3, 2)), np.zeros((3, 1)), np.zeros(3), [0, 0, 1], [0, 0, 0]
        )
