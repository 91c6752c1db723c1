"""The recurrent mixers and fox through the user's commands: train_gtrxl.py, evaluate.py and train_dt.py run
with one of each family (matrix state, fused selective scan, elementwise complex scan, forgetting softmax),
save a checkpoint whose config names the mixer, and act from it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.algos.test_dt import cartpole_dataset

ROOT = Path(__file__).resolve().parents[2]
MIXER_FLAGS = ["--backbone.memory", "None", "--backbone.position", "none"]
PPO_TINY = [
    "--num-envs", "2", "--ppo.num-steps", "16", "--ppo.seq-len", "8", "--ppo.num-minibatches", "2",
    "--ppo.update-epochs", "1", "--backbone.d-model", "16", "--backbone.n-heads", "2", "--backbone.n-layers", "1",
    "--no-progress", "--seed", "3",
]  # fmt: skip
DT_TINY = [
    "--backbone.d-model", "16", "--backbone.n-layers", "1", "--backbone.n-heads", "2", "--context-len", "4",
    "--batch-size", "8", "--warmup-steps", "2", "--no-progress", "--eval-episodes", "1", "--eval-every", "4",
    "--target-returns", "40",
]  # fmt: skip


def run(script: str, *args: str) -> str:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / script), *args],
        capture_output=True, text=True, timeout=180, cwd=ROOT, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.parametrize("attention", ["gated_deltanet", "mamba", "lru", "fox"])
def test_ppo_trains_and_evaluates_a_mixer(attention: str, tmp_path: Path) -> None:
    run("train_gtrxl.py", "--env-id", "rlt/TMaze-v0", "--env-kwargs", '{"corridor_length": 3}',
        "--total-timesteps", "64", "--run-root", str(tmp_path), "--backbone.attention", attention,
        *MIXER_FLAGS, *PPO_TINY)  # fmt: skip
    run_dir = next((tmp_path / "ppo" / "rlt-TMaze-v0").iterdir())
    backbone = json.loads((run_dir / "config.json").read_text())["policy"]["backbone"]
    assert backbone["attention"] == attention and backbone["memory"] is None
    out = run("evaluate.py", str(run_dir), "--episodes", "2")
    assert "rlt/TMaze-v0: return" in out and "over 2 episodes" in out


@pytest.mark.parametrize("attention", ["gated_deltanet", "mamba"])
def test_dt_trains_and_evaluates_a_mixer(attention: str, tmp_path: Path) -> None:
    dataset = cartpole_dataset(tmp_path / "cartpole.hdf5", n_good=2, n_random=4, max_steps=30)
    out = run("train_dt.py", "--dataset", str(dataset), "--total-steps", "4", "--run-root", str(tmp_path / "runs"),
              "--backbone.attention", attention, *MIXER_FLAGS, *DT_TINY)  # fmt: skip
    summary = json.loads(out[out.index("{\n") :])
    run_dir = Path(summary["run_dir"])
    assert json.loads((run_dir / "config.json").read_text())["backbone"]["attention"] == attention
    rows = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval/return_mean@40" in r]
    assert evals and evals[-1]["eval/return_mean@40"] > 0  # the policy acted through whole episodes
