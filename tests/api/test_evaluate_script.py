"""scripts/evaluate.py on a PPO run and on a DT run: defaults reproduce the trainer's logged evaluation; the
per-episode JSON; several DT targets; clear errors for video without moviepy and misplaced flags."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import rl_transformers as rlt
from rl_transformers.agents.evaluate import evaluate_agent
from rl_transformers.utils.errors import UserError
from tests.api.test_dt_agent import logged_episodes
from tests.api.test_ppo_agent import logged_eval

ROOT = Path(__file__).resolve().parents[2]


def evaluate(*args: str, ok: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "evaluate.py"), *args],
        capture_output=True, text=True, timeout=300, env=env, cwd=ROOT,
    )  # fmt: skip
    if ok:
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


def test_evaluate_ppo_run_reproduces_the_logged_evaluation(ppo_run, tmp_path: Path) -> None:
    out = evaluate(str(ppo_run.run_dir), "--output", str(tmp_path / "ppo.json"))
    data = json.loads((tmp_path / "ppo.json").read_text())
    (result,) = data["results"]
    assert data["algo"] == "ppo" and data["step"] == ppo_run.step and result["target"] is None
    assert result["mean"] == pytest.approx(logged_eval(ppo_run.run_dir)[ppo_run.step], abs=1e-9)
    assert result["mean"] == pytest.approx(np.mean(result["returns"])) and len(result["returns"]) == 4
    assert f"return {result['mean']:.3f} ± {result['std']:.3f} over 4 episodes" in out.stdout
    # default output: inside the run, atomically written (no temp files left)
    evaluate(str(ppo_run.run_dir), "--episodes", "2", "--seed", "1", "--stochastic")
    written = ppo_run.run_dir / "eval" / "evaluate-last.json"
    assert json.loads(written.read_text())["deterministic"] is False
    assert not [p for p in written.parent.iterdir() if p.name.endswith(".tmp")]


def test_evaluate_dt_run_with_several_targets(dt_run, tmp_path: Path) -> None:
    out = evaluate(str(dt_run.run_dir), "--output", str(tmp_path / "dt.json"))
    data = json.loads((tmp_path / "dt.json").read_text())
    logged = logged_episodes(dt_run.run_dir)
    assert [r["target"] for r in data["results"]] == [40.0, 10.0]
    for r in data["results"]:
        assert r["returns"] == pytest.approx(logged[r["target"]]["returns"])
        assert f"at target {r['target']:g}: return {r['mean']:.3f} ± {r['std']:.3f}" in out.stdout
    out = evaluate(str(dt_run.run_dir), "--target-return", "30", "20", "--episodes", "2",
                   "--output", str(tmp_path / "dt2.json"))  # fmt: skip
    data = json.loads((tmp_path / "dt2.json").read_text())
    assert [r["target"] for r in data["results"]] == [30.0, 20.0]
    assert all(len(r["returns"]) == 2 for r in data["results"])


def test_evaluate_refuses_misplaced_flags_clearly(ppo_run, dt_run) -> None:
    with pytest.raises(UserError, match="--target-return applies to DT runs"):
        evaluate_agent(rlt.load(ppo_run.run_dir), targets=[1.0])
    with pytest.raises(UserError, match="--stochastic applies to PPO runs"):
        evaluate_agent(rlt.load(dt_run.run_dir), deterministic=False)


@pytest.mark.skipif(importlib.util.find_spec("moviepy") is not None, reason="moviepy is installed")
def test_video_without_moviepy_is_a_clear_error(ppo_run, tmp_path: Path) -> None:
    proc = evaluate(str(ppo_run.run_dir), "--video", str(tmp_path / "v"), ok=False)
    assert proc.returncode == 2 and "pip install moviepy" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.skipif(importlib.util.find_spec("moviepy") is None, reason="needs moviepy")
def test_video_records_every_episode(ppo_run, dt_run, tmp_path: Path) -> None:
    evaluate(str(ppo_run.run_dir), "--episodes", "2", "--video", str(tmp_path / "ppo"))
    assert len(list((tmp_path / "ppo").glob("*.mp4"))) == 2
    evaluate(str(dt_run.run_dir), "--episodes", "2", "--target-return", "40", "--video", str(tmp_path / "dt"))
    assert len(list((tmp_path / "dt").glob("target40*.mp4"))) == 2
