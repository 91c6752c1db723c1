"""Atomic dataset writes: a failed or interrupted write never shows, --overwrite keeps the old data until done."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import minari
import numpy as np
import pytest

from offline_data import load_episodes, read_d4rl_hdf5, write_d4rl_hdf5, write_minari_dataset
from offline_data.errors import DatasetError
from rl_transformers.utils.atomic import TEMP_PREFIX, clean_stale
from tests.offline_data.helpers import record_raw


def _episodes(n: int, seed: int = 0) -> list:
    return [raw.to_episode() for raw in record_raw("Pendulum-v1", n, seed, max_episode_steps=8)]


def test_failed_overwrite_keeps_the_old_dataset(minari_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = write_minari_dataset("test/p/medium-v0", _episodes(3), env="Pendulum-v1")

    def crash(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt  # as if the process stopped mid-write

    with monkeypatch.context() as patch, pytest.raises(KeyboardInterrupt):
        patch.setattr(minari, "create_dataset_from_buffers", crash)
        write_minari_dataset("test/p/medium-v0", _episodes(5, 1), env="Pendulum-v1", overwrite=True)
    assert len(load_episodes("test/p/medium-v0").episodes) == 3 and old.is_dir()
    assert not list(minari_root.glob(f"{TEMP_PREFIX}*"))
    # a successful overwrite swaps in the new data
    write_minari_dataset("test/p/medium-v0", _episodes(5, 1), env="Pendulum-v1", overwrite=True)
    assert len(load_episodes("test/p/medium-v0").episodes) == 5


def test_leftovers_of_killed_builds_are_invisible_and_cleaned(minari_root: Path) -> None:
    write_minari_dataset("test/p/random-v0", _episodes(2), env="Pendulum-v1")
    # what a build killed mid-write leaves: a hidden directory holding a half dataset, from a dead pid
    dead_pid = 2**22 + 12345
    leftover = minari_root / f"{TEMP_PREFIX}{dead_pid}-abcd"
    (leftover / "test" / "p" / "expert-v0" / "data").mkdir(parents=True)
    (leftover / "test" / "p" / "expert-v0" / "data" / "metadata.json").write_text('{"total_episodes": 0}')
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert list(minari.list_local_datasets()) == ["test/p/random-v0"]
    with pytest.raises(DatasetError, match="temporary directory of a dataset build"):
        load_episodes(leftover / "test" / "p" / "expert-v0")
    assert clean_stale(minari_root) == [leftover] and not leftover.exists()
    # a live process's build directory is left alone
    live = minari_root / f"{TEMP_PREFIX}{os.getpid()}-beef"
    live.mkdir()
    assert clean_stale(minari_root) == [] and live.exists()


def test_d4rl_writes_are_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_d4rl_hdf5(tmp_path / "data.hdf5", _episodes(2))
    import h5py

    real = h5py.File.create_dataset

    def crash_on_actions(self: h5py.File, name: str, *args: object, **kwargs: object) -> object:
        if name == "actions":
            raise KeyboardInterrupt
        return real(self, name, *args, **kwargs)

    with monkeypatch.context() as patch, pytest.raises(KeyboardInterrupt):
        patch.setattr(h5py.File, "create_dataset", crash_on_actions)
        write_d4rl_hdf5(path, _episodes(4, 1), overwrite=True)
    episodes, _ = read_d4rl_hdf5(path)
    assert len(episodes) == 2 and sorted(p.name for p in tmp_path.iterdir()) == ["data.hdf5"]
    np.testing.assert_array_equal(episodes[0].actions, _episodes(2)[0].actions)
