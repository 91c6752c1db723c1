"""The smaller cases a hostile or clumsy user found after the last round of fixes, each reproduced first.

* a dataset whose env spec says ``max_episode_steps`` < 1 (the D4RL reader, the Minari reader and the DT data
  path through ``DatasetInfo.make_env``): an error naming the file, never gymnasium's ``TimeLimit`` traceback;
* a ``flock`` held on ``run.lock`` by another program (nothing written in it) is not reported as a run "starting";
* a checkpoint holding NaN weights is never called the "last good" one;
* the full-disk line advises ``--resume`` only for commands that have it (the dataset builders have not);
* a signing key planted by another user, or lying in a directory others may write, is refused (root included).
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from offline_data import load_episodes, read_d4rl_hdf5, read_minari, write_minari_dataset
from offline_data.errors import DatasetError
from rl_transformers.runs import checkpoint as checkpoint_module
from rl_transformers.runs.checkpoint import CheckpointManager, CheckpointWriteError
from rl_transformers.runs.lock import RunLockedError, acquire_run_lock
from rl_transformers.utils import errors as errors_module
from rl_transformers.utils.errors import run_cli
from rl_transformers.utils.trust import CheckpointKeyError, check_key
from tests.safety.runs import random_episodes

LIMIT = "max_episode_steps = -5"


# -- max_episode_steps < 1 in a dataset's env spec -------------------------------------------------------------
def _d4rl_file(path: Path, spec: dict) -> Path:
    episodes = random_episodes()
    with h5py.File(path, "w") as file:
        for key, field in (
            ("observations", "observations"),
            ("actions", "actions"),
            ("rewards", "rewards"),
            ("terminals", "terminations"),
            ("timeouts", "truncations"),
        ):
            file[key] = np.concatenate([getattr(ep, field) for ep in episodes])
        file.create_group("metadata").attrs["env_spec"] = json.dumps(spec)
    return path


@pytest.mark.parametrize("steps", [-5, 0])
def test_d4rl_spec_with_a_negative_time_limit_is_refused(tmp_path: Path, steps: int) -> None:
    path = _d4rl_file(tmp_path / "data.hdf5", {"id": "Pendulum-v1", "max_episode_steps": steps})
    for read in (lambda: read_d4rl_hdf5(path), lambda: load_episodes(path)):
        with pytest.raises(DatasetError, match=f"max_episode_steps = {steps}") as info:
            read()
        assert str(path) in str(info.value) and "positive number of steps" in str(info.value)


def test_minari_spec_with_a_negative_time_limit_is_refused(tmp_path: Path) -> None:
    path = write_minari_dataset("neg/data-v0", random_episodes(), env="Pendulum-v1", root=tmp_path)
    meta_path = path / "data" / "metadata.json"
    meta = json.loads(meta_path.read_text())
    spec = json.loads(meta["env_spec"]) if isinstance(meta["env_spec"], str) else meta["env_spec"]
    meta["env_spec"] = json.dumps({**spec, "max_episode_steps": -5})
    meta_path.write_text(json.dumps(meta))
    for read in (lambda: read_minari(path), lambda: load_episodes(path)):
        with pytest.raises(DatasetError, match=LIMIT) as info:
            read()
        assert str(meta_path) in str(info.value)


def test_hand_built_dataset_info_with_a_negative_limit_is_refused(tmp_path: Path) -> None:
    """The DT data path builds its evaluation env from ``DatasetInfo.make_env``: a spec put there by hand (or by
    a reader of another version) is checked again."""
    import dataclasses

    from gymnasium.envs.registration import EnvSpec

    path = _d4rl_file(tmp_path / "ok.hdf5", {"id": "Pendulum-v1", "max_episode_steps": 200})
    info = load_episodes(path).info
    assert info.env_spec is not None
    spec = EnvSpec(id="Pendulum-v1", entry_point=info.env_spec.entry_point, max_episode_steps=-5)
    with pytest.raises(DatasetError, match=LIMIT):
        dataclasses.replace(info, env_spec=spec, eval_env_spec=None).make_env()


def test_train_dt_on_a_negative_limit_is_one_error_line(tmp_path: Path) -> None:
    path = _d4rl_file(tmp_path / "data.hdf5", {"id": "Pendulum-v1", "max_episode_steps": -5})
    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [
            sys.executable,
            str(repo / "scripts" / "train_dt.py"),
            "--dataset",
            str(path),
            "--total-steps",
            "1",
            "--run-root",
            str(tmp_path / "runs"),
        ],
        capture_output=True,
        text=True,
        cwd=repo,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert out.stderr.startswith("error: ") and LIMIT in out.stderr


# -- a foreign flock -------------------------------------------------------------------------------------------
def test_a_foreign_flock_is_not_called_a_starting_run(tmp_path: Path) -> None:
    """``flock run.lock sleep 60`` by another program: nothing is written in the file, yet it is held."""
    fcntl = pytest.importorskip("fcntl")
    (tmp_path / "run.lock").touch()
    with open(tmp_path / "run.lock") as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(RunLockedError) as info:
            acquire_run_lock(tmp_path)
    message = str(info.value)
    assert "it is starting" not in message and "another program holding a flock" in message
    assert str(tmp_path / "run.lock") in message


# -- a NaN checkpoint is no good one ---------------------------------------------------------------------------
def _fail_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint_module, "atomic_save", full)


def test_a_nan_checkpoint_is_not_called_last_good(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    manager = CheckpointManager(tmp_path, keep_last=3)
    manager.save({"model": {"w": torch.zeros(3)}}, step=1)
    manager.save({"model": {"w": torch.full((3,), float("nan"))}}, step=2)
    assert manager.last_good() == manager.step_path(1)  # last.pt is the NaN one
    _fail_writes(monkeypatch)
    with pytest.raises(CheckpointWriteError) as info:
        manager.save({"model": {"w": torch.zeros(3)}}, step=3)
    message = str(info.value)
    assert f"the last good checkpoint is {manager.step_path(1)}" in message
    assert str(manager.last_path) not in message


def test_only_nan_checkpoints_leave_no_good_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    manager = CheckpointManager(tmp_path, keep_last=0)
    manager.save({"model": {"w": torch.tensor([1.0, float("inf")])}}, step=1)
    assert manager.last_good() is None
    _fail_writes(monkeypatch)
    with pytest.raises(CheckpointWriteError, match="no earlier good checkpoint exists") as info:
        manager.save({"model": {"w": torch.zeros(3)}}, step=2)
    assert "last good checkpoint is" not in str(info.value)


# -- the full-disk line ----------------------------------------------------------------------------------------
def _full() -> None:
    raise OSError(errno.ENOSPC, "No space left on device", "datasets/x/main_data.hdf5")


def test_full_disk_line_does_not_advise_a_missing_resume(capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(errors_module, "_resumable", False)
    with pytest.raises(SystemExit):
        run_cli(_full, argv=["make_dataset.py"])
    err = capsys.readouterr().err
    assert err.startswith("error: no space left on device") and "--resume" not in err
    errors_module.offer_resume()  # what the trainers' parse_cli does
    with pytest.raises(SystemExit):
        run_cli(_full, argv=["train_dt.py"])
    assert "--resume <run directory>" in capsys.readouterr().err


def test_dataset_builder_never_offers_resume(tmp_path: Path) -> None:
    """The builder's own flags: it has no --resume (so no message may tell the user to use one)."""
    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, str(repo / "scripts" / "make_dataset.py"), "--help"],
        capture_output=True,
        text=True,
        cwd=repo,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(repo)},
    )
    assert out.returncode == 0 and "--resume" not in out.stdout


# -- a planted signing key -------------------------------------------------------------------------------------
@pytest.mark.skipif(
    os.name != "posix" or os.geteuid() != 0, reason="planting a file as another user needs root"
)
def test_a_key_planted_by_another_user_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # world-writable with the sticky bit, like /tmp
    key = shared / "checkpoint.key"
    key.write_bytes(os.urandom(32))
    key.chmod(0o600)
    os.chown(key, 12345, 12345)  # another user's file
    monkeypatch.setenv("RLT_HOME", str(shared))
    with pytest.raises(CheckpointKeyError, match="owned by uid 12345, not by this user"):
        check_key()


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
def test_a_key_in_a_directory_others_may_write_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "open"
    shared.mkdir()
    (shared / "checkpoint.key").write_bytes(os.urandom(32))
    (shared / "checkpoint.key").chmod(0o600)
    shared.chmod(0o777)  # no sticky bit: anyone may rename another key over this one
    monkeypatch.setenv("RLT_HOME", str(shared))
    with pytest.raises(CheckpointKeyError, match="other users may write it"):
        check_key()
    shared.chmod(0o700)
    assert check_key() == shared / "checkpoint.key"
