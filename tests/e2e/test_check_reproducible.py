"""scripts/check_reproducible.py: the log comparison, and a real check of a committed tree against itself."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.script_module import load_script

ROOT = Path(__file__).resolve().parents[2]
mod = load_script("check_reproducible")


def test_logs_that_differ_only_in_timings_agree() -> None:
    old = [{"step": 2048, "train/loss": 0.5, "time/fps": 1000.0, "time/elapsed_s": 3.0, "rollout/sps": 9.0}]
    new = [{"step": 2048, "train/loss": 0.5, "time/fps": 1200.0, "time/elapsed_s": 2.0, "rollout/sps": 7.0}]
    assert mod.first_difference(old, new) is None


def test_the_first_difference_is_named() -> None:
    old = [{"step": 1, "a": 1.0}, {"step": 2, "a": 2.0, "b": 0.25}]
    new = [{"step": 1, "a": 1.0}, {"step": 2, "a": 2.0, "b": 0.2500001}]
    assert mod.first_difference(old, new) == "row 1 (step 2): b = 0.25 at the commit, 0.2500001 now"
    assert "only in one log" in mod.first_difference(old, [new[0], {"step": 2, "a": 2.0}])
    assert mod.first_difference(old, new[:1]) == "2 logged rows at the commit, 1 in the working tree"


def _check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "scripts/check_reproducible.py", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)  # fmt: skip


def test_a_commit_reproduces_itself_and_bad_input_is_a_clear_error() -> None:
    """The last commit touching the PPO code, checked out beside the working tree, logs the same values (in a
    clean checkout the two trees hold the same code, so this passes exactly when training is deterministic)."""
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "rl_transformers", "envs", "scripts"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()  # fmt: skip
    cmd = "python scripts/train_gtrxl.py --total-timesteps 1024 --num-envs 4 --ppo.num-steps 128 --seed 3"
    done = _check("--commit", "HEAD", "--command", cmd)
    if dirty:  # uncommitted changes to the code may legitimately change the values
        assert done.returncode in (0, 1), done.stderr
    else:
        assert done.returncode == 0, done.stdout + done.stderr
        assert "identical: 2 logged rows" in done.stdout
    bad = _check("--commit", "no-such-commit", "--command", cmd)
    assert (
        bad.returncode == 2
        and "unknown commit 'no-such-commit'" in bad.stderr
        and "Traceback" not in bad.stderr
    )
    flagged = _check("--commit", "HEAD", "--command", cmd, "--now-flags=--ppo.learning-rate 1e-3")
    # a changed hyper-parameter on one side only: a difference, named (uncommitted changes can only add some)
    assert flagged.returncode == 1 and "differs: row 0 (step 512): train/" in flagged.stdout, flagged.stderr
    bad = _check("--commit", "HEAD", "--command", "python -c 1")
    assert bad.returncode == 2 and "must run a script under scripts/" in bad.stderr
