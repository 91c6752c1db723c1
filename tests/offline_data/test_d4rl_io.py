"""D4RL-format HDF5: splitting on terminals | timeouts, the trailing episode, errors, writer and converter."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import h5py
import numpy as np
import pytest

from offline_data import (
    D4RL_REF_SCORES,
    d4rl_io,
    d4rl_to_minari,
    load_episodes,
    read_d4rl_hdf5,
    write_d4rl_hdf5,
)
from rl_transformers.utils.errors import UserError
from tests.offline_data.helpers import record_raw

# 10 transitions written by hand: episode 0 = rows 0-2 (terminal at 2), episode 1 = rows 3-6 (timeout at 6,
# in the middle of the file), episode 2 = rows 7-9 (no flag: unfinished, kept as truncated)
N = 10
TERMINALS = np.array([0, 0, 1, 0, 0, 0, 0, 0, 0, 0], dtype=bool)
TIMEOUTS = np.array([0, 0, 0, 0, 0, 0, 1, 0, 0, 0], dtype=bool)


def _hand_file(path: Path, next_observations: bool = True, **overrides: np.ndarray | None) -> Path:
    data = {
        "observations": np.arange(N * 3, dtype=np.float32).reshape(N, 3),
        "actions": np.linspace(-1, 1, N * 2, dtype=np.float32).reshape(N, 2),
        "rewards": np.arange(N, dtype=np.float32) * 0.5,
        "terminals": TERMINALS,
        "timeouts": TIMEOUTS,
    }
    if next_observations:
        data["next_observations"] = 1000 + np.arange(N * 3, dtype=np.float32).reshape(N, 3)
    data.update(overrides)
    with h5py.File(path, "w") as file:
        for key, value in data.items():
            if value is not None:
                file.create_dataset(key, data=value)
    return path


def test_split_on_terminals_and_timeouts(tmp_path: Path) -> None:
    episodes, info = read_d4rl_hdf5(_hand_file(tmp_path / "hopper-medium-v2.hdf5"))
    assert [len(ep) for ep in episodes] == [3, 4, 3]
    obs = np.arange(N * 3, dtype=np.float32).reshape(N, 3)
    for ep, (start, stop) in zip(episodes, [(0, 3), (3, 7), (7, 10)], strict=True):
        np.testing.assert_array_equal(ep.observations, obs[start:stop])
        np.testing.assert_array_equal(ep.next_observations, 1000 + obs[start:stop])
        np.testing.assert_array_equal(ep.rewards, np.arange(start, stop) * 0.5)
        assert ep.actions.shape == (stop - start, 2)
    assert episodes[0].terminations.tolist() == [False, False, True]
    assert not episodes[0].truncations.any()
    assert episodes[1].truncations.tolist() == [False, False, False, True]
    assert not episodes[1].terminations.any()
    # trailing unfinished episode: kept, truncated at its last step only
    assert episodes[2].truncations.tolist() == [False, False, True]
    assert not episodes[2].terminations.any()
    # references from the D4RL table (file name names the hopper family); inferred [-1, 1] action box
    assert info.ref_scores_source == "d4rl_table"
    assert (info.ref_min_score, info.ref_max_score) == tuple(D4RL_REF_SCORES["hopper"])
    assert info.action_space == gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    assert info.metadata["next_observations"] == "file"


def test_without_next_observations_or_timeouts(tmp_path: Path) -> None:
    episodes, info = read_d4rl_hdf5(_hand_file(tmp_path / "x.hdf5", next_observations=False, timeouts=None))
    assert [len(ep) for ep in episodes] == [3, 7]  # no timeouts: only the terminal splits
    obs = np.arange(N * 3, dtype=np.float32).reshape(N, 3)
    np.testing.assert_array_equal(episodes[0].next_observations, obs[[1, 2, 2]])  # last step repeated
    np.testing.assert_array_equal(episodes[1].next_observations[:-1], obs[4:10])
    assert episodes[1].truncations.tolist() == [False] * 6 + [True]
    assert info.metadata["next_observations"].startswith("shifted")
    assert info.ref_min_score is None and info.ref_scores_source is None


@pytest.mark.parametrize(
    ("overrides", "pattern"),
    [
        ({"rewards": None}, r"lacks required key\(s\) \['rewards'\]"),
        ({"terminals": None, "actions": None}, r"lacks required key\(s\) \['actions', 'terminals'\]"),
        (
            {"actions": np.zeros((N - 1, 2), np.float32)},
            r"length mismatch, 'actions' has shape \(9, 2\).* 10 rows",
        ),
        ({"timeouts": np.zeros(N + 2, bool)}, r"length mismatch, 'timeouts' has shape \(12,\)"),
        (
            {"rewards": np.where(np.arange(N) == 4, np.nan, 0.0)},
            r"'rewards' holds a non-finite value nan at index \(4,\)",
        ),
        (
            {"observations": np.full((N, 3), np.inf, np.float32)},
            r"'observations' holds a non-finite value inf",
        ),
        ({"terminals": np.full(N, 3)}, r"'terminals' must hold 0/1 or booleans, found 3"),
        ({"rewards": np.zeros((N, 2))}, r"'rewards' must be 1-D, got shape \(10, 2\)"),
    ],
    ids=[
        "missing-key",
        "missing-keys",
        "short-actions",
        "long-timeouts",
        "nan",
        "inf",
        "bad-flag",
        "2d-rewards",
    ],
)
def test_bad_files_name_file_and_key(tmp_path: Path, overrides: dict, pattern: str) -> None:
    path = _hand_file(tmp_path / "bad.hdf5", **overrides)
    with pytest.raises(ValueError, match=pattern) as err:
        read_d4rl_hdf5(path)
    assert str(path) in str(err.value)


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.hdf5"
    with h5py.File(path, "w") as file:
        for key, shape in (
            ("observations", (0, 3)),
            ("actions", (0, 2)),
            ("rewards", (0,)),
            ("terminals", (0,)),
        ):
            file.create_dataset(key, shape=shape, dtype=np.float32)
    with pytest.raises(ValueError, match=r"empty.hdf5' is empty: 'observations' has 0 rows"):
        read_d4rl_hdf5(path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_episodes(tmp_path / "missing.hdf5")


def test_validation_pass_flattens_flag_columns_and_leaves_its_input_alone() -> None:
    """(N, 1) rewards / flags become 1-D (a copy: the caller's dict keeps its columns); an (N, 1) observation
    column stays 2-D; a mis-shaped `next_observations` and a 0-d array are refused naming ``where``."""
    data: dict[str, np.ndarray] = {
        "observations": np.zeros((4, 1), np.float32),
        "actions": np.zeros((4, 2), np.float32),
        "rewards": np.arange(4, dtype=np.float32)[:, None],
        "terminals": np.array([[0], [0], [0], [1]], np.uint8),
    }
    checked = d4rl_io._checked_arrays(data, "here")
    assert checked["rewards"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert checked["terminals"].tolist() == [0, 0, 0, 1]
    assert checked["observations"].shape == (4, 1) and data["rewards"].shape == (4, 1)
    with pytest.raises(
        ValueError, match=r"^here: 'next_observations' has shape \(4, 2\), 'observations' has"
    ):
        d4rl_io._checked_arrays({**data, "next_observations": np.zeros((4, 2), np.float32)}, "here")
    with pytest.raises(ValueError, match=r"^here: length mismatch, 'rewards' has shape \(\)"):
        d4rl_io._checked_arrays({**data, "rewards": np.array(1.0, np.float32)}, "here")


def test_reference_scores_prefer_the_file_then_the_d4rl_table() -> None:
    hopper = tuple(D4RL_REF_SCORES["hopper"])
    both = {"ref_min_score": -3, "ref_max_score": 7}
    assert d4rl_io._ref_scores(both, "Hopper-v4", "hopper.hdf5") == (-3, 7, "dataset")
    # one bound alone is not a reference: the table, found from the env id, else the file name
    assert d4rl_io._ref_scores({"ref_min_score": -3}, "Hopper-v4", "x.hdf5") == (*hopper, "d4rl_table")
    assert d4rl_io._ref_scores({}, None, "hopper-medium-v2.hdf5") == (*hopper, "d4rl_table")
    assert d4rl_io._ref_scores({}, "Pendulum-v1", "pendulum.hdf5") == (None, None, None)


def test_writer_round_trip_and_metadata(tmp_path: Path) -> None:
    raws = record_raw("Pendulum-v1", n_episodes=3, seed=11, max_episode_steps=20)
    episodes = [raw.to_episode() for raw in raws]
    space = gym.make("Pendulum-v1").action_space
    path = write_d4rl_hdf5(
        tmp_path / "pend.hdf5",
        episodes,
        metadata={
            "env_id": "Pendulum-v1",
            "action_space": space,
            "ref_min_score": -1.0,
            "ref_max_score": 2.0,
        },
    )
    with h5py.File(path, "r") as file:  # the flat D4RL layout, read independently
        assert file["observations"].shape == (60, 3) and file["timeouts"][()].sum() == 3
        np.testing.assert_array_equal(file["observations"][20], raws[1].observations[0])
    back, info = read_d4rl_hdf5(path)
    for ep, raw in zip(back, raws, strict=True):
        np.testing.assert_array_equal(ep.observations, np.stack(raw.observations[:-1]))
        np.testing.assert_array_equal(ep.next_observations, np.stack(raw.observations[1:]))
        np.testing.assert_array_equal(ep.actions, np.stack(raw.actions))
        np.testing.assert_array_equal(ep.rewards, raw.rewards)
    assert info.action_space == space and info.env_id == "Pendulum-v1"
    assert (info.ref_min_score, info.ref_max_score, info.ref_scores_source) == (-1.0, 2.0, "dataset")
    with pytest.raises(FileExistsError, match="overwrite=True") as err:
        write_d4rl_hdf5(path, episodes)
    assert isinstance(err.value, UserError)  # the CLIs print it as one error: line, no traceback


def test_writer_rejects_episodes_a_reader_would_split_differently(tmp_path: Path) -> None:
    episodes = [raw.to_episode() for raw in record_raw("CartPole-v1", n_episodes=2, seed=0)]
    open_ended = type(episodes[0])(
        observations=episodes[0].observations,
        actions=episodes[0].actions,
        rewards=episodes[0].rewards,
        terminations=np.zeros(len(episodes[0]), bool),
        truncations=np.zeros(len(episodes[0]), bool),
        next_observations=episodes[0].next_observations,
    )
    with pytest.raises(ValueError, match="episode 0 ends with neither a termination nor a truncation"):
        write_d4rl_hdf5(tmp_path / "a.hdf5", [open_ended, episodes[1]])
    write_d4rl_hdf5(tmp_path / "b.hdf5", [episodes[1], open_ended])  # allowed last: read back as truncated
    back, _ = read_d4rl_hdf5(tmp_path / "b.hdf5")
    assert back[1].truncations[-1] and len(back) == 2


def test_converter_round_trip(tmp_path: Path, minari_root: Path) -> None:
    raws = record_raw("Pendulum-v1", n_episodes=3, seed=5, max_episode_steps=15)
    src = write_d4rl_hdf5(tmp_path / "pendulum-random.hdf5", [raw.to_episode() for raw in raws])
    path = d4rl_to_minari(
        src, "conv/pendulum/random-v0", env_id="Pendulum-v1", ref_min_score=-1200.0, ref_max_score=-100.0
    )
    meta = json.loads((path / "data" / "metadata.json").read_text())
    assert (meta["ref_min_score"], meta["ref_max_score"]) == (-1200.0, -100.0)
    assert json.loads(meta["env_spec"])["id"] == "Pendulum-v1"
    episodes, info = load_episodes("conv/pendulum/random-v0")
    assert info.format == "minari" and info.action_space == gym.make("Pendulum-v1").action_space
    for ep, raw in zip(episodes, raws, strict=True):
        np.testing.assert_array_equal(ep.observations, np.stack(raw.observations[:-1]))
        np.testing.assert_array_equal(ep.final_observation, raw.observations[-1])
        np.testing.assert_array_equal(ep.actions, np.stack(raw.actions))
        np.testing.assert_array_equal(ep.rewards, raw.rewards)
        assert ep.truncations.tolist() == raw.truncations
    with pytest.raises(FileExistsError):
        d4rl_to_minari(src, "conv/pendulum/random-v0")


def test_converter_uses_d4rl_table_for_hopper_files(tmp_path: Path, minari_root: Path) -> None:
    src = _hand_file(tmp_path / "hopper-medium-v2.hdf5")
    path = d4rl_to_minari(src, "conv/hopper/medium-v0")
    meta = json.loads((path / "data" / "metadata.json").read_text())
    assert (meta["ref_min_score"], meta["ref_max_score"]) == tuple(D4RL_REF_SCORES["hopper"])
    episodes, _ = load_episodes("conv/hopper/medium-v0")
    assert [len(ep) for ep in episodes] == [3, 4, 3] and episodes[2].truncations[-1]
    np.testing.assert_array_equal(episodes[1].final_observation, 1000 + np.arange(18, 21))
