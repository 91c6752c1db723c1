"""Run directories: layout, collisions within one second, safe names."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from rl_transformers.runs.run_dirs import make_run_dir, sanitize_name

NOW = datetime(2024, 1, 2, 3, 4, 5)


def test_run_dir_layout(tmp_path: Path) -> None:
    run = make_run_dir(tmp_path / "runs", algo="ppo", name="popgym:RepeatPrevious/Easy", seed=3, now=NOW)
    assert run == tmp_path / "runs" / "ppo" / "popgym-RepeatPrevious-Easy" / "20240102-030405-s3"
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "eval"]
    assert all((run / d).is_dir() for d in ("checkpoints", "eval"))


def test_run_dirs_started_in_the_same_second_do_not_collide(tmp_path: Path) -> None:
    runs = [make_run_dir(tmp_path, algo="dt", name="hopper", seed=0, now=NOW) for _ in range(3)]
    assert [r.name for r in runs] == ["20240102-030405-s0", "20240102-030405-s0_1", "20240102-030405-s0_2"]
    assert len(set(runs)) == 3 and all(r.is_dir() for r in runs)


@pytest.mark.parametrize(
    ("raw", "clean"),
    [("mujoco/halfcheetah/medium-v0", "mujoco-halfcheetah-medium-v0"), ("a:b c", "a-b-c"), ("//", "unnamed")],
)
def test_sanitize_name(raw: str, clean: str) -> None:
    assert sanitize_name(raw) == clean
