"""Keys and run directories: a bad signing key stops a run at start with the fix; writes never leave
the run directory through a symbolic link; one process per run (a live holder is named, a dead one's lock is
taken over)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from rl_transformers.agents.evaluate import default_output
from rl_transformers.algos.ppo import train
from rl_transformers.algos.ppo_config import TrainConfig
from rl_transformers.runs.checkpoint import CheckpointManager
from rl_transformers.runs.lock import LOCK_FILE, RunLockedError, acquire_run_lock, lock_holder
from rl_transformers.runs.paths import RunDirError
from rl_transformers.utils.errors import UserError
from rl_transformers.utils.trust import CheckpointKeyError, check_key, sign_blob
from tests.safety.runs import BATCH, tiny

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    result = train(tiny(tmp_path_factory.mktemp("ppo")))
    assert result.run_dir is not None
    return result.run_dir


@pytest.fixture
def run_copy(ppo_run: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(ppo_run, dst)
    return dst


def resume(ppo_run: Path, run: Path, updates: int = 3) -> TrainConfig:
    """The original run's config (root ``<root>/ppo/<env>/<run>``) resuming ``run``."""
    return dataclasses.replace(tiny(ppo_run.parents[2], updates=updates), resume=str(run))


def snapshot(directory: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(directory.iterdir())}


# -- the signing key ------------------------------------------------------------------------------------------
def _bad_homes(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """RLT_HOME set-ups that cannot give a key, with the words the error must contain."""
    homes = {}
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "checkpoint.key").write_bytes(b"")
    homes["empty"] = (empty, "damaged (0 bytes")
    short = tmp_path / "short"
    short.mkdir()
    (short / "checkpoint.key").write_bytes(b"0123456789")
    homes["short"] = (short, "damaged (10 bytes")
    directory = tmp_path / "dir"
    (directory / "checkpoint.key").mkdir(parents=True)
    homes["directory"] = (directory, "is a directory")
    (tmp_path / "a_file").write_text("not a directory")
    homes["home-is-a-file"] = (tmp_path / "a_file" / "sub", "is not a directory")
    linked = tmp_path / "linked"
    linked.mkdir()
    target = tmp_path / "world_readable"
    target.write_bytes(os.urandom(64))
    target.chmod(0o644)
    (linked / "checkpoint.key").symlink_to(target)
    homes["symlink"] = (linked, "symbolic link")
    return homes


def test_bad_keys_stop_the_run_at_start_with_the_fix(tmp_path: Path, monkeypatch) -> None:
    for name, (home, expected) in _bad_homes(tmp_path).items():
        monkeypatch.setenv("RLT_HOME", str(home))
        root = tmp_path / f"runs_{name}"
        with pytest.raises(CheckpointKeyError) as info:
            train(tiny(root))
        message = str(info.value)
        assert expected in message and str(home / "checkpoint.key") in message and "Fix:" in message, name
        assert not list(root.rglob("progress.jsonl")), name  # nothing trained, nothing written
        with pytest.raises(CheckpointKeyError):  # the signing path gives the same error, never a traceback
            sign_blob([1], "x")


def test_symlinked_key_is_refused_and_no_chmod_is_suggested_through_it(tmp_path: Path, monkeypatch) -> None:
    home, _ = _bad_homes(tmp_path)["symlink"]
    monkeypatch.setenv("RLT_HOME", str(home))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(CheckpointKeyError, match="symbolic link") as info:
            check_key()
    assert "chmod" not in str(info.value) and not [w for w in caught if "chmod" in str(w.message)]
    assert (tmp_path / "world_readable").stat().st_mode & 0o777 == 0o644  # the target is left alone


def test_unreadable_key_names_the_fix(tmp_path: Path, monkeypatch) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "checkpoint.key").write_bytes(os.urandom(32))
    monkeypatch.setenv("RLT_HOME", str(home))
    real_open = os.open

    def deny(path, flags, *a, **k):
        if str(path).endswith("checkpoint.key"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *a, **k)

    monkeypatch.setattr(os, "open", deny)
    with pytest.raises(CheckpointKeyError, match="permission denied") as info:
        check_key()
    assert "Fix:" in str(info.value)


def test_missing_key_is_made_at_start_and_a_loose_one_gets_a_safe_hint(tmp_path: Path, monkeypatch) -> None:
    home = tmp_path / "new" / "home"
    monkeypatch.setenv("RLT_HOME", str(home))
    path = check_key()
    assert path == home / "checkpoint.key" and len(path.read_bytes()) == 32
    assert path.stat().st_mode & 0o777 == 0o600 and home.stat().st_mode & 0o777 == 0o700
    path.chmod(0o644)
    with pytest.warns(UserWarning, match=f"chmod 600 {path}"):
        check_key()


def test_bad_key_through_the_script_is_one_error_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "checkpoint.key").mkdir(parents=True)
    out = subprocess.run(
        [
            *(
                sys.executable,
                "scripts/train_gtrxl.py",
                "--env-id",
                "rlt/TMazeShort-v0",
                "--total-timesteps",
                "64",
            ),
            *("--num-envs", "2", "--ppo.num-steps", "16", "--ppo.seq-len", "8", "--no-progress"),
            *("--run-root", str(tmp_path / "runs")),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "RLT_HOME": str(home)},
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert f"error: checkpoint signing key {home / 'checkpoint.key'}: is a directory" in out.stderr


# -- symbolic links out of the run ----------------------------------------------------------------------------
def _link_out(run: Path, name: str, tmp_path: Path) -> Path:
    """Move ``run/name`` elsewhere and leave a symbolic link to it (plus a bystander step file there)."""
    outside = tmp_path / f"outside_{name}"
    shutil.move(str(run / name), outside)
    (outside / "step_1.pt").write_bytes(b"someone else's file")
    (run / name).symlink_to(outside, target_is_directory=True)
    return outside


def test_resume_refuses_a_symlinked_checkpoints_dir(ppo_run: Path, run_copy: Path, tmp_path: Path) -> None:
    outside = _link_out(run_copy, "checkpoints", tmp_path)
    before = snapshot(outside)
    with pytest.raises(RunDirError, match="symbolic link") as info:
        train(resume(ppo_run, run_copy))
    assert str(run_copy / "checkpoints") in str(info.value)
    assert snapshot(outside) == before  # nothing pruned, replaced or added there
    with pytest.raises(RunDirError):
        CheckpointManager(run_copy)


def test_resume_refuses_a_symlinked_eval_dir_and_progress_file(
    ppo_run: Path, run_copy: Path, tmp_path: Path
) -> None:
    outside = _link_out(run_copy, "eval", tmp_path)
    before = snapshot(outside)
    with pytest.raises(RunDirError, match="symbolic link"):
        train(resume(ppo_run, run_copy))
    assert snapshot(outside) == before
    (run_copy / "eval").unlink()
    (run_copy / "eval").mkdir()
    log = run_copy / "progress.jsonl"
    target = tmp_path / "outside_progress.jsonl"
    shutil.move(str(log), target)
    log.symlink_to(target)
    size = target.stat().st_size
    with pytest.raises(RunDirError, match=r"progress\.jsonl"):
        train(resume(ppo_run, run_copy))
    assert target.stat().st_size == size


def test_evaluate_refuses_a_symlinked_eval_dir(run_copy: Path, tmp_path: Path) -> None:
    last = run_copy / "checkpoints" / "last.pt"
    assert default_output(last) == run_copy / "eval" / "evaluate-last.json"
    outside = _link_out(run_copy, "eval", tmp_path)
    before = snapshot(outside)
    with pytest.raises(RunDirError, match="symbolic link"):
        default_output(last)
    out = subprocess.run(
        [sys.executable, "scripts/evaluate.py", str(run_copy), "--episodes", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr and "symbolic link" in out.stderr, out.stderr
    assert snapshot(outside) == before


# -- one process per run --------------------------------------------------------------------------------------
HOLD = (
    "import sys, time; from rl_transformers.runs.lock import acquire_run_lock; "
    "lock = acquire_run_lock(sys.argv[1]); print('held', flush=True); time.sleep(120)"
)


def _holder(run: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_process_on_a_run_is_refused_naming_the_holder(ppo_run: Path, run_copy: Path) -> None:
    proc = _holder(run_copy)
    try:
        before = snapshot(run_copy / "checkpoints")
        with pytest.raises(RunLockedError) as info:
            train(resume(ppo_run, run_copy))
        message = str(info.value)
        assert f"process {proc.pid} on host {socket.gethostname()!r}" in message
        assert str(run_copy / LOCK_FILE) in message
        assert snapshot(run_copy / "checkpoints") == before
    finally:
        proc.kill()
        proc.wait()


def test_a_dead_holders_lock_is_taken_over(ppo_run: Path, run_copy: Path) -> None:
    proc = _holder(run_copy)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert lock_holder(run_copy)["pid"] == proc.pid  # the killed holder left its lock file behind
    seen = {}

    def during(trainer) -> None:
        seen.update(lock_holder(run_copy) or {})

    result = train(resume(ppo_run, run_copy), callback=during)
    assert result.step == 3 * BATCH and seen["pid"] == os.getpid()
    assert not (run_copy / LOCK_FILE).exists()  # released at the end


def test_lock_is_exclusive_within_a_process_and_released(tmp_path: Path) -> None:
    lock = acquire_run_lock(tmp_path)
    with pytest.raises(RunLockedError, match=f"process {os.getpid()}"):
        acquire_run_lock(tmp_path)
    lock.release()
    with acquire_run_lock(tmp_path):
        assert lock_holder(tmp_path)["pid"] == os.getpid()
    assert not (tmp_path / LOCK_FILE).exists()
    (tmp_path / LOCK_FILE).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UserError, match="symbolic link"):
        acquire_run_lock(tmp_path)
    assert not (tmp_path / "elsewhere").exists()
