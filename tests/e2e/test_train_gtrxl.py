"""The PPO command lines end to end: train_gtrxl.py (fresh and --resume), evaluate.py, measure_throughput.py;
and (marked slow) the memory test: GTrXL solves a short T-Maze, the memory-less MLP policy cannot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rl_transformers.algos.evaluation import evaluate_policy
from rl_transformers.algos.ppo import train
from rl_transformers.algos.ppo_checkpoint import load_policy
from rl_transformers.algos.ppo_config import PPOConfig, TrainConfig
from rl_transformers.policies import PolicyConfig

ROOT = Path(__file__).resolve().parents[2]
TINY = [
    "--num-envs",
    "2",
    "--ppo.num-steps",
    "16",
    "--ppo.seq-len",
    "8",
    "--ppo.num-minibatches",
    "2",
    "--ppo.update-epochs",
    "1",
    "--backbone.d-model",
    "16",
    "--backbone.n-heads",
    "2",
    "--backbone.n-layers",
    "1",
    "--no-progress",
    "--seed",
    "5",
]


def run(script: str, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / script), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_train_resume_evaluate_cli(tmp_path: Path) -> None:
    out = run(
        "train_gtrxl.py",
        "--env-id",
        "rlt/TMaze-v0",
        "--env-kwargs",
        '{"corridor_length": 3}',
        "--total-timesteps",
        "64",
        "--run-root",
        str(tmp_path),
        "--backbone.memory-options",
        '{"mem_len": 4}',
        *TINY,
    )
    run_dir = next((tmp_path / "ppo" / "rlt-TMaze-v0").iterdir())
    assert str(run_dir) in out
    config = json.loads((run_dir / "config.json").read_text())
    assert config["env_kwargs"] == {"corridor_length": 3}
    assert config["policy"]["backbone"]["memory_options"] == {"mem_len": 4}
    assert config["policy"]["backbone"]["d_model"] == 16
    assert (run_dir / "checkpoints" / "last.pt").exists()
    assert list(run_dir.glob("events.out.tfevents.*"))
    out = run("train_gtrxl.py", "--resume", str(run_dir), "--total-timesteps", "128", "--no-progress")
    assert json.loads(out[out.index("{\n") :])["step"] == 128
    assert len((run_dir / "progress.jsonl").read_text().splitlines()) == 4
    out = run("evaluate.py", str(run_dir), "--episodes", "3")
    assert "rlt/TMaze-v0: return" in out and "over 3 episodes" in out


def test_async_vectorization_logs_what_sync_logs(tmp_path: Path) -> None:
    """--vectorization async (env copies in worker processes) is the same experiment as sync: same seeds, same
    rollouts, same updates. Run as subprocesses, so the async workers fork the script, not the pytest worker."""
    logs = {}
    for mode in ("sync", "async"):
        root = tmp_path / mode
        run("train_gtrxl.py", "--env-id", "rlt/TMaze-v0", "--env-kwargs", '{"corridor_length": 3}',
            "--total-timesteps", "96", "--vectorization", mode, "--run-root", str(root), *TINY)  # fmt: skip
        rows = [
            json.loads(line) for line in next(root.glob("ppo/*/*/progress.jsonl")).read_text().splitlines()
        ]
        logs[mode] = [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]
    assert len(logs["sync"]) == 3 and logs["async"] == logs["sync"]


def test_cli_rejects_bad_backbone_names(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "train_gtrxl.py"),
            "--backbone.attention",
            "ful",
            "--run-root",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode != 0
    assert "Did you mean 'full'" in proc.stdout + proc.stderr


@pytest.mark.slow
def test_gtrxl_solves_short_tmaze_and_mlp_does_not(tmp_path: Path) -> None:
    """T-Maze with a 4-cell corridor: the cue must be kept for 4 steps. Success (return ~1) needs memory;
    a memory-less policy can at best reach the junction and guess (return ~0.5)."""
    results = {}
    for kind in ("transformer", "mlp"):
        cfg = TrainConfig(
            env_id="rlt/TMaze-v0",
            env_kwargs={"corridor_length": 4},
            total_timesteps=120_000,
            num_envs=16,
            seed=1,
            policy=PolicyConfig(kind=kind),  # type: ignore[arg-type]
            ppo=PPOConfig(num_steps=64, seq_len=16, num_minibatches=4),
            run_root=str(tmp_path),
            progress=False,
        )
        result = train(cfg)
        policy, _ = load_policy(result.run_dir)
        returns, _ = evaluate_policy(policy, cfg.env_id, cfg.env_kwargs, 100, seed=99, seq_len=16)
        results[kind] = float(np.mean(returns))
    print(f"T-Maze(4) greedy evaluation returns: {results}")
    assert results["transformer"] > 0.9
    assert results["mlp"] < 0.75
