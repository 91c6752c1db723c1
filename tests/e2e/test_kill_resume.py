"""SIGKILL a PPO run (scripts/train_gtrxl.py) at several moments: every checkpoint file left loads, and
``--resume`` finishes the run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rl_transformers.runs.checkpoint_load import read_checkpoint

ROOT = Path(__file__).resolve().parents[2]
BATCH = 2 * 16
FLAGS = [
    "--env-id", "rlt/TMazeShort-v0", "--num-envs", "2", "--ppo.num-steps", "16", "--ppo.seq-len", "8",
    "--ppo.num-minibatches", "2", "--ppo.update-epochs", "1", "--backbone.d-model", "16",
    "--backbone.n-layers", "1", "--backbone.n-heads", "2", "--save-every", str(BATCH), "--keep-checkpoints", "2",
    "--no-progress", "--threads", "1",
]  # fmt: skip


def start(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "scripts/train_gtrxl.py", *args],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )


def wait_for(predicate, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else "exited early"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def check_all_load(run: Path) -> int:
    """Every *.pt in the run loads (safe loader); returns the newest step."""
    files = sorted((run / "checkpoints").glob("*.pt"))
    assert files, "no checkpoint"
    steps = [int(read_checkpoint(f)["global_step"]) for f in files]
    return max(steps)


def newest_step(run: Path) -> int:
    """The step of last.pt while the trainer may be writing (a pruned file is simply not there)."""
    try:
        return int(read_checkpoint(run / "checkpoints" / "last.pt")["global_step"])
    except FileNotFoundError:
        return -1


@pytest.mark.slow
def test_sigkill_leaves_loadable_checkpoints_and_resume_works(tmp_path: Path) -> None:
    proc = start(*FLAGS, "--total-timesteps", str(400 * BATCH), "--run-root", str(tmp_path))
    try:
        wait_for(lambda: any(tmp_path.glob("ppo/*/*/checkpoints/last.pt")), proc)
        run = next(tmp_path.glob("ppo/*/*/checkpoints/last.pt")).parent.parent
        kills = 0
        for delay in (0.0, 0.37, 1.1):  # right after a save, and at arbitrary points in later updates
            time.sleep(delay)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            kills += 1
            step = check_all_load(run)
            assert step >= BATCH
            # resume (a few more updates each time), then kill again
            proc = start("--resume", str(run), "--total-timesteps", str(400 * BATCH))
            wait_for(lambda s=step: newest_step(run) > s, proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        final = check_all_load(run)
        out = subprocess.run(
            [sys.executable, "scripts/train_gtrxl.py", "--resume", str(run), "--total-timesteps",
             str(final + 2 * BATCH)],
            cwd=ROOT, capture_output=True, text=True, timeout=300, env=os.environ.copy(),
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert check_all_load(run) == final + 2 * BATCH and kills == 3
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
