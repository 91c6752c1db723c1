"""A run directory that does not exist: the error lists the runs that do, closest name first, then newest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import rl_transformers as rlt
from rl_transformers.agents.load import CheckpointNotFoundError
from rl_transformers.agents.offline_runs import collect_runs
from rl_transformers.agents.run_listing import missing_run_message
from rl_transformers.utils.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
NAMES = ["20260101-000000-s1", "20260102-000000-s1", "20260102-000000-s2"]


def make_runs(root: Path, names: list[str], env: str = "rlt-TMaze-v0") -> list[Path]:
    runs = []
    for name in names:
        run = root / "ppo" / env / name
        (run / "checkpoints").mkdir(parents=True)
        (run / "config.json").write_text(json.dumps({"env_id": env}))
        runs.append(run)
    return runs


def listed(message: str) -> list[str]:
    assert "closest first: " in message, message
    text = message.split("closest first: ", 1)[1].split(" (", 1)[0]
    return text.split(", ")


def test_placeholder_lists_the_runs_newest_first(tmp_path: Path) -> None:
    runs = make_runs(tmp_path / "runs", NAMES)
    make_runs(tmp_path / "runs", ["20260103-000000-s1"], env="rlt-CartPoleNoVel-v0")  # another env's run
    missing = tmp_path / "runs" / "ppo" / "rlt-TMaze-v0" / "<run>"
    with pytest.raises(CheckpointNotFoundError) as info:
        rlt.load(missing)
    message = str(info.value)
    assert message.startswith(
        f"{missing}: no such run directory or checkpoint file; runs under {missing.parent}"
    )
    assert listed(message) == [str(r) for r in reversed(runs)] and "\n" not in message


def test_a_typo_lists_the_closest_name_first(tmp_path: Path) -> None:
    oldest, *_ = make_runs(tmp_path / "runs", NAMES)
    message = missing_run_message(oldest.parent / "20260101-000000-s9")  # one character from the oldest run
    assert listed(message)[0] == str(oldest)


def test_the_list_is_cut_and_counted(tmp_path: Path) -> None:
    make_runs(tmp_path / "runs", [f"20260101-00000{i}-s1" for i in range(7)])
    message = missing_run_message(tmp_path / "runs" / "ppo" / "nope" / "x")  # root: runs/ppo, two levels up
    assert len(listed(message)) == 5 and message.endswith("(7 in all)")
    assert f"runs under {tmp_path / 'runs' / 'ppo'}," in message


def test_no_runs_at_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "runs" / "ppo").mkdir(parents=True)
    assert missing_run_message(tmp_path / "runs" / "ppo" / "x").endswith(
        f"{tmp_path / 'runs' / 'ppo'} holds no run (no config.json below it)"
    )
    monkeypatch.chdir(tmp_path / "runs")  # a fresh checkout: no runs/ in the working directory
    message = missing_run_message("runs/ppo/rlt-TMaze-v0/<run>")
    assert "(runs does not exist: train a run first, e.g. make train)" in message


def test_offline_table_lists_the_runs_too(tmp_path: Path) -> None:
    (run,) = make_runs(tmp_path / "runs", ["20260101-000000-s1"], env="ds")
    with pytest.raises(UserError, match="no such run directory; runs under .*closest first: " + str(run)):
        collect_runs([run.parent / "<run>"])


def test_evaluate_prints_one_error_line_with_the_runs(tmp_path: Path) -> None:
    (run,) = make_runs(tmp_path / "runs", ["20260101-000000-s1"])
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "evaluate.py"), "runs/ppo/rlt-TMaze-v0/<run>"],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    first = proc.stderr.splitlines()[0]
    assert first == (
        "error: runs/ppo/rlt-TMaze-v0/<run>: no such run directory or checkpoint file; runs under "
        f"runs/ppo/rlt-TMaze-v0, closest first: {run.relative_to(tmp_path)}"
    )
