"""SIGKILL a dataset build at several moments: nothing corrupt is visible, and the same command resumes.

Each test starts ``scripts/make_dataset.py`` (CartPole, PPO, a few hundred steps) in a subprocess, kills it
with SIGKILL when a file system event shows it is at the moment under test (a training checkpoint was
written; a dataset is being built in its hidden temporary directory), then checks what Minari's own
``list_local_datasets`` and our loaders see, and that rerunning the same command -- without ``--overwrite``
-- completes, resuming the behaviour-policy training.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

from offline_data import load_episodes

REPO = Path(__file__).resolve().parents[2]
KINDS = ("random", "medium", "medium-replay", "expert")
N_EPISODES = 3


def _command(tmp_path: Path) -> list[str]:
    return [
        sys.executable,
        str(REPO / "scripts" / "make_dataset.py"),
        "--env-id", "CartPole-v1",
        "--kinds", *KINDS,
        "--medium-return", "0",
        "--total-timesteps", "1024",
        "--eval-freq", "256",
        "--checkpoint-freq", "256",
        "--n-eval-episodes", "2",
        "--num-episodes", str(N_EPISODES),
        "--ppo-n-steps", "256",
        "--ppo-batch-size", "64",
        "--ref-min-score", "10", "--ref-max-score", "500",
        "--root", str(tmp_path / "minari"),
        "--policy-dir", str(tmp_path / "policies"),
        "--no-progress",
    ]  # fmt: skip


def _run_until(cmd: list[str], cwd: Path, event: Callable[[], bool], timeout: float = 120.0) -> int:
    """Start ``cmd``; SIGKILL it as soon as ``event()`` holds. Returns the exit status (-9 when killed)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + timeout
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if event():
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.002)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.stderr is not None
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.returncode in (0, -signal.SIGKILL), err
    return proc.returncode


def _visible(root: Path) -> dict[str, int]:
    """Every dataset Minari lists under ``root`` must load completely (ours and Minari's loader)."""
    import minari

    os.environ["MINARI_DATASETS_PATH"] = str(root)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter(
                "error"
            )  # "Misconfigured dataset" warnings mean something corrupt is visible
            listed = list(minari.list_local_datasets())
        counts = {}
        for dataset_id in listed:
            assert minari.load_dataset(dataset_id).total_episodes == N_EPISODES or dataset_id.endswith(
                "replay-v0"
            )
            counts[dataset_id] = len(load_episodes(dataset_id, root=root).episodes)
    finally:
        os.environ.pop("MINARI_DATASETS_PATH", None)
    # nothing that is not listed may look like a dataset to our loader either
    for data in root.rglob("data"):
        if not any(part.startswith(".") for part in data.relative_to(root).parts):
            assert data.parent.relative_to(root).as_posix() in counts
    return counts


def _temp_dirs(root: Path) -> list[Path]:
    return [p for p in root.glob(".rlt-build-*")] if root.exists() else []


def test_kill_during_training_resumes(tmp_path: Path) -> None:
    cmd, root, policies = _command(tmp_path), tmp_path / "minari", tmp_path / "policies"
    state = policies / "train_state.pt"
    status = _run_until(cmd, tmp_path, state.exists)
    assert status == -signal.SIGKILL and state.is_file()
    assert _visible(root) == {}
    assert not (policies / "training.json").exists()
    # the same command, no --overwrite: training resumes from the checkpoint and the build completes
    assert _run_until(cmd, tmp_path, lambda: False) == 0
    training = json.loads((policies / "training.json").read_text())
    assert training["complete"] and training["resumed_from_step"] >= 256
    assert not state.exists() and not _temp_dirs(root)
    counts = _visible(root)
    assert set(counts) == {f"rlt/cartpole/{kind}-v0" for kind in KINDS}
    assert all(counts[f"rlt/cartpole/{kind}-v0"] == N_EPISODES for kind in ("random", "medium", "expert"))


@pytest.mark.slow
def test_kill_while_writing_datasets_leaves_nothing_visible(tmp_path: Path) -> None:
    cmd, root = _command(tmp_path), tmp_path / "minari"
    killed_in_write = 0
    for attempt in range(3):  # kill at the first, then later temporary directories
        seen: set[str] = set()

        def writing(attempt: int = attempt, seen: set[str] = seen) -> bool:
            seen.update(p.name for p in _temp_dirs(root))
            return len(seen) > attempt

        status = _run_until(cmd, tmp_path, writing)
        if status == -signal.SIGKILL:
            killed_in_write += 1
        counts = _visible(root)  # whatever is listed is complete
        assert all(n == N_EPISODES for k, n in counts.items() if not k.endswith("replay-v0"))
        if status == 0:
            break
    assert killed_in_write >= 1
    if status != 0:
        assert _run_until(cmd, tmp_path, lambda: False) == 0
    assert not _temp_dirs(root)  # leftovers of the killed runs were cleaned
    assert set(_visible(root)) == {f"rlt/cartpole/{kind}-v0" for kind in KINDS}
    # a finished build is not silently rebuilt: the same command now asks for --overwrite
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "--overwrite" in proc.stderr
