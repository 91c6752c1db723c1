"""Hostile and broken checkpoints, built here, through every public loading path: nothing they hold ever runs.

The payload is a pickle whose ``__reduce__`` calls ``os.system("touch <marker>")`` (a checkpoint that runs code when unpickled).
Each test asserts the marker file was NOT created and that the error or warning names the file.
"""

from __future__ import annotations

import dataclasses
import errno
import io
import os
import pickle
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from rl_transformers.algos import dt_checkpoint
from rl_transformers.algos.ppo import train
from rl_transformers.algos.ppo_checkpoint import RESUME_BLOB, load_policy
from rl_transformers.algos.ppo_config import RESUME_PER_INVOCATION, TrainConfig
from rl_transformers.runs.checkpoint import CheckpointManager, CheckpointWriteError
from rl_transformers.runs.checkpoint_load import (
    InvalidCheckpointError,
    latest_checkpoint,
    load_checkpoint,
    read_checkpoint,
)
from rl_transformers.runs.resume import parse_cli
from rl_transformers.utils.errors import UserError
from rl_transformers.utils.trust import sign_blob
from tests.safety.runs import BATCH, Evil, evil_bytes, rewrite_last, tiny

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ppo")
    result = train(tiny(root))
    assert result.run_dir is not None
    return result.run_dir


@pytest.fixture
def run_copy(ppo_run: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(ppo_run, dst)
    return dst


def resume_cfg(ppo_run: Path, run: Path, **kw) -> TrainConfig:
    """The original run's config (root: ``<root>/ppo/<env>/<run>``) resuming ``run`` to 3 updates."""
    return dataclasses.replace(tiny(ppo_run.parents[2], updates=3), resume=str(run), **kw)


def byte_fields(obj, prefix=""):
    """Paths of every uint8 tensor (a field that can hold pickled bytes) in a checkpoint."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from byte_fields(v, f"{prefix}/{k}")
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            yield from byte_fields(v, f"{prefix}/{i}")
    elif isinstance(obj, torch.Tensor) and obj.dtype == torch.uint8:
        yield prefix


def set_path(obj, path: str, value) -> None:
    keys = path.strip("/").split("/")
    for k in keys[:-1]:
        obj = obj[int(k)] if isinstance(obj, list | tuple) else obj[k]
    last = keys[-1]
    if isinstance(obj, list):
        obj[int(last)] = value
    else:
        obj[last] = value


# -- hostile bytes in the fields that can hold them ---------------------------------------------------------
def test_every_byte_field_is_inert_on_resume(ppo_run: Path, tmp_path: Path) -> None:
    """Malicious pickle bytes in each uint8 field of a real checkpoint: resume never unpickles them."""
    fields = sorted(set(byte_fields(read_checkpoint(ppo_run / "checkpoints" / "last.pt"))))
    assert f"/{RESUME_BLOB}/data" in fields and f"/{RESUME_BLOB}/hmac" in fields and "/rng/torch" in fields
    for i, field in enumerate(fields):
        run = tmp_path / f"run{i}"
        shutil.copytree(ppo_run, run)
        marker = tmp_path / f"marker{i}"
        path = rewrite_last(run, lambda c, f=field, m=marker: set_path(c, f, evil_bytes(m)))
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                train(resume_cfg(ppo_run, run))
            messages = " ".join(str(w.message) for w in caught)
            if field.startswith(f"/{RESUME_BLOB}"):
                assert str(path) in messages and "not unpickled" in messages, field
        except UserError as err:  # e.g. garbage RNG state with a valid blob: a clear error naming the file
            assert str(path) in str(err), (field, err)
        assert not marker.exists(), field


def test_forged_and_foreign_signatures_are_refused(
    ppo_run: Path, run_copy: Path, tmp_path: Path, monkeypatch
) -> None:
    """A blob signed with an attacker's own key (another RLT_HOME) and a copied tag both fail to verify."""
    marker = tmp_path / "marker"
    with monkeypatch.context() as m:
        m.setenv("RLT_HOME", str(tmp_path / "attacker"))
        forged = sign_blob(Evil(marker), RESUME_BLOB)  # valid under the attacker's key
    path = rewrite_last(run_copy, lambda c: c.__setitem__(RESUME_BLOB, forged))
    with pytest.warns(UserWarning, match="does not match this user's key") as caught:
        train(resume_cfg(ppo_run, run_copy))
    assert str(path) in str(caught[0].message) and "--trust-checkpoint" in str(caught[0].message)
    assert not marker.exists()


def test_legacy_unsigned_pickles_are_not_loaded(ppo_run: Path, run_copy: Path, tmp_path: Path) -> None:
    """The pre-signature layout (raw ``envs`` / ``loop`` pickles) is never unpickled without the opt-in."""
    marker = tmp_path / "marker"

    def legacy(c: dict) -> None:
        del c[RESUME_BLOB]
        c["envs"], c["loop"] = evil_bytes(marker), evil_bytes(marker)

    path = rewrite_last(run_copy, legacy)
    with pytest.warns(UserWarning, match="older version") as caught:
        train(resume_cfg(ppo_run, run_copy))
    assert str(path) in str(caught[0].message)
    assert not marker.exists()


def test_trust_flag_is_never_read_from_the_checkpoint(run_copy: Path, tmp_path: Path) -> None:
    """A crafted config asking for trust_checkpoint=True is ignored (per-invocation fields)."""
    marker = tmp_path / "marker"

    def crafted(c: dict) -> None:
        c["config"]["trust_checkpoint"] = True
        c[RESUME_BLOB]["data"] = evil_bytes(marker)

    rewrite_last(run_copy, crafted)
    cfg = parse_cli(TrainConfig, per_invocation=RESUME_PER_INVOCATION, argv=["--resume", str(run_copy)])
    assert cfg.trust_checkpoint is False
    with pytest.warns(UserWarning, match="not unpickled"):
        train(cfg)
    assert not marker.exists()


# -- hostile objects: refused by the loader itself, on every path -------------------------------------------
def evil_checkpoints(tmp_path: Path, marker: Path, run: Path) -> list[Path]:
    ckpt = read_checkpoint(run / "checkpoints" / "last.pt")
    files = []
    for key in ("policy", "config", "optimizer"):
        path = tmp_path / f"evil_{key}" / "checkpoints" / "last.pt"
        path.parent.mkdir(parents=True)
        torch.save({**ckpt, key: Evil(marker)}, path)
        files.append(path)
    plain = tmp_path / "plain_pickle.pt"
    plain.write_bytes(pickle.dumps({"config": Evil(marker)}))
    return [*files, plain]


# the hostile files are written with pickle protocol 4; torch warns about it before refusing them
@pytest.mark.filterwarnings("ignore:Detected pickle protocol:UserWarning")
def test_hostile_objects_through_library_loaders(ppo_run: Path, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    for path in evil_checkpoints(tmp_path, marker, ppo_run):
        run = path.parent.parent if path.parent.name == "checkpoints" else path
        loaders = [
            lambda p=path: load_checkpoint(p),
            lambda p=path: read_checkpoint(p),
            lambda p=path: load_policy(p),
            lambda p=path: dt_checkpoint.load_policy(p),
            lambda p=path: train(resume_cfg(ppo_run, p)),
        ]
        if path.parent.name == "checkpoints":
            loaders.append(lambda r=run: CheckpointManager(r).load("last"))
        for load in loaders:
            with pytest.raises(InvalidCheckpointError) as info:
                load()
            assert str(path) in str(info.value) and "not a valid checkpoint" in str(info.value)
            assert "weights_only` set to `False`" not in str(info.value)  # torch's unsafe advice is dropped
    assert not marker.exists()


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300, env=os.environ.copy()
    )


def test_hostile_checkpoints_through_the_scripts(run_copy: Path, ppo_run: Path, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    evil_policy = evil_checkpoints(tmp_path, marker, ppo_run)[0]
    out = run_script("scripts/evaluate.py", str(evil_policy), "--episodes", "1")
    assert out.returncode != 0 and str(evil_policy) in out.stderr and "not a valid checkpoint" in out.stderr
    assert "Traceback" not in out.stderr
    # train_gtrxl.py --resume with a malicious env blob: resumes with fresh episodes, names the file
    path = rewrite_last(run_copy, lambda c: c[RESUME_BLOB].__setitem__("data", evil_bytes(marker)))
    out = run_script("scripts/train_gtrxl.py", "--resume", str(run_copy), "--total-timesteps", str(3 * BATCH))
    assert out.returncode == 0, out.stderr
    assert str(path) in out.stderr and "not unpickled" in out.stderr
    assert not marker.exists()


# -- broken files ---------------------------------------------------------------------------------------------
def test_truncated_and_garbage_files(run_copy: Path) -> None:
    last = run_copy / "checkpoints" / "last.pt"
    data = last.read_bytes()
    for name, content in (
        ("truncated.pt", data[: len(data) // 2]),
        ("garbage.pt", b"not a checkpoint\n" * 9),
    ):
        path = run_copy / name
        path.write_bytes(content)
        for load in (read_checkpoint, load_checkpoint, load_policy):
            with pytest.raises(
                InvalidCheckpointError, match="truncated or not written by rl_transformers"
            ) as e:
                load(path)
            assert str(path) in str(e.value)
    # in a run directory a torn last.pt is skipped (with a warning) for the newest step file that loads
    last.unlink()
    last.write_bytes(data[: len(data) // 3])
    step = max((run_copy / "checkpoints").glob("step_*.pt"))
    with pytest.warns(UserWarning, match="skipping"):
        assert latest_checkpoint(run_copy) == step
    with pytest.warns(UserWarning, match=re.escape(f"skipping checkpoint {last}")):
        assert load_checkpoint(run_copy)["global_step"] == 2 * BATCH


@pytest.mark.parametrize(
    "change,expected",
    [
        (lambda c: c["config"]["ppo"].__setitem__("learning_rate", "abc"), "TrainConfig.ppo.learning_rate"),
        (lambda c: c["config"].__setitem__("num_envs", 2.5), "TrainConfig.num_envs"),
        (lambda c: c["config"].__setitem__("progress", "yes"), "TrainConfig.progress"),
        (lambda c: c["config"].pop("ppo"), "section 'ppo' is missing"),
        (lambda c: c["config"]["policy"].pop("backbone"), "section 'backbone' is missing"),
        (lambda c: c.pop("config"), "has no 'config' section"),
        (lambda c: c["config"].__setitem__("vectorization", "threads"), "TrainConfig.vectorization"),
    ],
    ids=["str-for-float", "float-for-int", "str-for-bool", "no-ppo", "no-backbone", "no-config", "literal"],
)
def test_bad_checkpoint_config_is_a_clear_error(ppo_run: Path, run_copy: Path, change, expected: str) -> None:
    path = rewrite_last(run_copy, change)
    for load in (lambda: load_policy(path), lambda: train(resume_cfg(ppo_run, path))):
        with pytest.raises(UserError) as info:
            load()
        assert str(path) in str(info.value) and expected in str(info.value)


def test_other_observation_space_is_a_clear_error(run_copy: Path) -> None:
    path = rewrite_last(run_copy, lambda c: c["config"].__setitem__("env_id", "CartPole-v1"))
    with pytest.raises(UserError, match="was trained on observation space") as info:
        load_policy(path)
    assert str(path) in str(info.value) and "'CartPole-v1' has observation space Box" in str(info.value)
    # a checkpoint written before the spaces were recorded: same message from the weight shapes
    path = rewrite_last(run_copy, lambda c: c.pop("spaces"))
    with pytest.raises(UserError, match="the weight shapes differ"):
        load_policy(path)


# -- full disk ------------------------------------------------------------------------------------------------
def test_full_disk_keeps_the_last_good_checkpoint(tmp_path: Path, monkeypatch) -> None:
    from rl_transformers.runs import checkpoint as module

    real_save = torch.save
    calls = {"n": 0}

    def save(obj, f, *a, **k):
        if isinstance(f, io.BytesIO):  # pickling tensors (the env blob) also goes through torch.save
            return real_save(obj, f, *a, **k)
        calls["n"] += 1
        if calls["n"] >= 3:
            f.write(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, f, *a, **k)

    monkeypatch.setattr(module.torch, "save", save)
    with pytest.raises(CheckpointWriteError) as info:
        train(tiny(tmp_path, updates=4, save_every=BATCH))
    message = str(info.value)
    last = next(tmp_path.glob("ppo/*/*/checkpoints/last.pt"))
    assert "no space left on device" in message and f"the last good checkpoint is {last}" in message
    assert info.value.errno == errno.ENOSPC
    monkeypatch.setattr(module.torch, "save", real_save)
    assert read_checkpoint(last)["global_step"] == 2 * BATCH  # the save of step 3 left nothing behind
    assert not list(last.parent.glob(".*.tmp"))
