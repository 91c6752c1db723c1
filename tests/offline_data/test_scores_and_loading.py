"""Normalized scores on hand values, reference lookup, and `load_episodes` dispatch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from offline_data import (
    D4RL_REF_SCORES,
    env_family,
    load_episodes,
    normalized_score,
    reference_scores,
    write_d4rl_hdf5,
    write_minari_dataset,
)
from tests.offline_data.helpers import record_raw


def test_d4rl_table_matches_published_values() -> None:
    # d4rl/infos.py REF_MIN_SCORE / REF_MAX_SCORE, typed by hand
    assert D4RL_REF_SCORES["hopper"] == (-20.272305, 3234.3)
    assert D4RL_REF_SCORES["halfcheetah"] == (-280.178953, 12135.0)
    assert D4RL_REF_SCORES["walker2d"] == (1.629008, 4592.3)
    assert D4RL_REF_SCORES["ant"] == (-325.6, 3879.7)


def test_normalized_score_hand_values() -> None:
    assert normalized_score(15.0, 10.0, 20.0) == 50.0
    assert normalized_score(10.0, 10.0, 20.0) == 0.0
    assert normalized_score(30.0, 10.0, 20.0) == 200.0
    assert normalized_score(0.0, -10.0, 30.0) == 25.0
    hopper = D4RL_REF_SCORES["hopper"]
    # 100·(1607.013847 + 20.272305)/(3234.3 + 20.272305) = 50
    assert normalized_score(1607.0138475, *hopper) == pytest.approx(50.0, abs=1e-6)
    scores = normalized_score(np.array([[10.0, 20.0], [15.0, 12.5]]), 10.0, 20.0)
    assert isinstance(scores, np.ndarray)
    np.testing.assert_allclose(scores, [[0.0, 100.0], [50.0, 25.0]])
    assert isinstance(normalized_score(np.float32(15.0), 10.0, 20.0), float)
    for bad in ((20.0, 10.0), (5.0, 5.0), (np.nan, 1.0)):
        with pytest.raises(ValueError, match="need finite ref_min < ref_max"):
            normalized_score(1.0, *bad)


@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("Hopper-v5", "hopper"),
        ("rlt/hopper/medium-v0", "hopper"),
        ("/data/hopper-medium-replay-v2.hdf5", "hopper"),
        ("HalfCheetah-v5", "halfcheetah"),
        ("walker2d-expert-v2", "walker2d"),
        ("Ant-v5", "ant"),
        ("antmaze-umaze-v2", None),
        ("CartPole-v1", None),
    ],
)
def test_env_family(name: str, family: str | None) -> None:
    assert env_family(name) == family


def test_reference_scores_lookup_and_errors() -> None:
    assert reference_scores("Walker2d-v5") == D4RL_REF_SCORES["walker2d"]
    with pytest.raises(ValueError, match=r"no reference scores for 'hoper-v5'.*Did you mean 'hopper'"):
        reference_scores("hoper-v5")
    with pytest.raises(ValueError, match=r"'CartPole-v1'.*\['ant', 'halfcheetah', 'hopper', 'walker2d'\]"):
        reference_scores("CartPole-v1")


def test_load_episodes_dispatch_and_reference_fallback(tmp_path: Path, minari_root: Path) -> None:
    episodes = [
        raw.to_episode() for raw in record_raw("Pendulum-v1", n_episodes=2, seed=1, max_episode_steps=10)
    ]
    # a Minari dataset without references whose id names a D4RL family: the table fills them in
    path = write_minari_dataset("rlt/hopper/fake-v0", episodes, env="Pendulum-v1")
    by_id = load_episodes("rlt/hopper/fake-v0")
    by_dir = load_episodes(path)
    by_data_dir = load_episodes(path / "data")
    by_main_file = load_episodes(path / "data" / "main_data.hdf5")
    by_root = load_episodes("rlt/hopper/fake-v0", root=minari_root)
    for loaded in (by_id, by_dir, by_data_dir, by_main_file, by_root):
        assert loaded.info.format == "minari"
        assert loaded.info.ref_scores_source == "d4rl_table"
        assert reference_scores(loaded) == D4RL_REF_SCORES["hopper"]
        np.testing.assert_array_equal(loaded.episodes[1].actions, episodes[1].actions)
    # a Minari dataset whose stored references win over the table
    write_minari_dataset(
        "rlt/hopper/stored-v0", episodes, env="Pendulum-v1", ref_min_score=0.0, ref_max_score=1.0
    )
    loaded = load_episodes("rlt/hopper/stored-v0")
    assert reference_scores(loaded) == (0.0, 1.0) and loaded.info.ref_scores_source == "dataset"
    # no references anywhere
    write_minari_dataset("misc/pendulum-v0", episodes, env="Pendulum-v1")
    assert load_episodes("misc/pendulum-v0").info.ref_min_score is None
    # a D4RL file, with the env id given by the caller
    d4rl = write_d4rl_hdf5(tmp_path / "data.h5", episodes)
    loaded = load_episodes(d4rl, env_id="Pendulum-v1")
    assert loaded.info.format == "d4rl_hdf5" and loaded.info.env_id == "Pendulum-v1"
    assert [len(ep) for ep in loaded.episodes] == [10, 10]
    # a root elsewhere: the id is not found there
    with pytest.raises(FileNotFoundError, match="not found under"):
        load_episodes("rlt/hopper/fake-v0", root=tmp_path / "elsewhere")
    with pytest.raises(ValueError, match="is not a dataset: expected a Minari dataset directory"):
        load_episodes(tmp_path)
