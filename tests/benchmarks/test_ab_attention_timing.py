"""benchmarks/ab_attention_timing.py: a real (tiny) side-by-side timing against a commit, and its user errors."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "benchmarks/ab_attention_timing.py", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)  # fmt: skip


def test_times_both_trees_and_reports_the_ratio() -> None:
    done = _run(
        "--commit", "HEAD", "--attention", "local", "--length", "128", "--repeats", "1", "--rounds", "2"
    )
    assert done.returncode == 0, done.stderr
    for key in ("forward", "forward_backward"):
        line = next(x for x in done.stdout.splitlines() if x.strip().startswith(f"{key}:"))
        times = [float(t) for t in re.findall(r"(\d+\.\d+)(?= )", line.split("today /")[0])]
        assert len(times) == 4 and all(t > 0 for t in times)  # 2 rounds x (commit, today)
        assert float(line.rsplit("=", 1)[1]) > 0


def test_bad_input_is_a_clear_error() -> None:
    done = _run("--commit", "HEAD", "--attention", "lsj")
    assert done.returncode == 2 and "unknown attention 'lsj'" in done.stderr and "lsh" in done.stderr
    assert "Traceback" not in done.stderr
    done = _run("--commit", "no-such-rev", "--attention", "lsh")
    assert done.returncode == 2 and "unknown commit 'no-such-rev'" in done.stderr
