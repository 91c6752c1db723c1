"""The shipped recipe learns: the default GTrXL on CartPoleNoVel with its ppo_recipes.yml entry, one fixed seed,
through the command line, evaluated greedily on 20 fresh episodes of the final policy (slow: ~1 min idle)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_default_gtrxl_solves_cartpole_novel_with_its_recipe(tmp_path: Path) -> None:
    args = ["--env-id", "rlt/CartPoleNoVel-v0", "--seed", "0", "--eval-every", "0", "--no-progress"]
    train = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "train_gtrxl.py"), *args, "--run-root", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    assert train.returncode == 0, train.stdout[-2000:] + train.stderr[-2000:]
    assert "recipe: ppo_recipes.yml:" in train.stderr and "rlt/CartPoleNoVel-v0/transformer" in train.stderr
    (run,) = [p.parent for p in tmp_path.rglob("config.json")]
    evaluate = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "evaluate.py"), str(run), "--episodes", "20"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert evaluate.returncode == 0, evaluate.stderr[-2000:]
    returns = json.loads((run / "eval" / "evaluate-last.json").read_text())["results"][0]["returns"]
    assert sum(returns) / len(returns) >= 475, returns
