"""scripts/train_dt.py end to end: run layout, TensorBoard tags, resume, Ctrl-C, torchrun, return conditioning."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.algos.test_dt import cartpole_dataset, collect, good_policy, random_policy

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "train_dt.py"
TINY = [
    "--backbone.d-model", "16", "--backbone.n-layers", "1", "--backbone.n-heads", "2",
    "--context-len", "4", "--batch-size", "8", "--warmup-steps", "2", "--no-progress",
]  # fmt: skip


def run_script(*args: str, timeout: float = 120, cmd: list[str] | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [*(cmd or [sys.executable, str(SCRIPT)]), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def summary(proc: subprocess.CompletedProcess) -> dict:
    return json.loads(proc.stdout[proc.stdout.index("{\n") :])


def scalar_tags(run_dir: Path) -> dict[str, list[int]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [e.step for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cartpole_dataset(
        tmp_path_factory.mktemp("e2e") / "cartpole.hdf5", n_good=2, n_random=6, max_steps=40
    )


def test_cli_run_layout_tags_and_resume(dataset: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    common = ["--log-every", "2", "--eval-every", "3", "--eval-episodes", "1", "--target-returns", "40", "10"]
    proc = run_script("--dataset", str(dataset), "--total-steps", "6", "--run-root", str(runs), *TINY, *common,
                      "--backbone.position", "rope", "--backbone.attention-options", '{"max_cache": 6}')  # fmt: skip
    run_dir = Path(summary(proc)["run_dir"])
    assert run_dir.parent == runs / "dt" / "cartpole" and run_dir.name.endswith("-s1")  # seed default 1
    config = json.loads((run_dir / "config.json").read_text())
    assert (
        config["backbone"]["position"] == "rope" and config["backbone"]["attention_options"]["max_cache"] == 6
    )
    assert {p.name for p in (run_dir / "checkpoints").iterdir()} >= {"last.pt", "best.pt", "index.json"}
    tags = scalar_tags(run_dir)
    for tag in ("train/loss", "train/learning_rate", "train/grad_norm", "time/samples_per_second"):
        assert tags[tag] == [2, 4, 6], tag
    for tag in ("eval/return_mean@40", "eval/return_mean@10", "eval/normalized_score@40", "eval/return_mean"):
        assert tags[tag] == [3, 6], tag
    assert any(t.startswith("backbone/") for t in tags)
    assert any(p.name.startswith("events.out") for p in run_dir.iterdir())

    # resume to 9 updates: the curve continues in the same run directory
    proc = run_script("--resume", str(run_dir), "--total-steps", "9", "--no-progress")
    assert summary(proc)["run_dir"] == str(run_dir) and summary(proc)["step"] == 9
    steps = [json.loads(line)["step"] for line in (run_dir / "progress.jsonl").read_text().splitlines()]
    assert steps == [2, 3, 4, 6, 8, 9]
    index = json.loads((run_dir / "checkpoints" / "index.json").read_text())
    assert index["last"]["step"] == 9


def test_ctrl_c_saves_a_checkpoint(dataset: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    args = ["--dataset", str(dataset), "--total-steps", "1000000", "--run-root", str(runs), "--log-every", "5",
            "--eval-episodes", "0", *TINY]  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        deadline = time.time() + 90

        def started() -> bool:  # a first log row: the loop (and its Ctrl-C handler) is running
            return any(p.stat().st_size > 0 for p in runs.glob("dt/*/*/progress.jsonl"))

        while time.time() < deadline and not started():
            time.sleep(0.2)
        assert started(), "training did not start"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-2000:]
    result = json.loads(out[out.index("{\n") :])
    assert result["interrupted"] and 0 < result["step"] < 1_000_000
    index = json.loads((Path(result["run_dir"]) / "checkpoints" / "index.json").read_text())
    assert index["last"]["step"] == result["step"]


@pytest.mark.slow
def test_torchrun_two_ranks(dataset: Path, tmp_path: Path) -> None:
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    if torchrun is None:
        pytest.skip("torchrun not installed")
    cmd = [torchrun, "--nproc_per_node", "2", "--master_port", "29561", str(SCRIPT)]
    proc = run_script("--dataset", str(dataset), "--total-steps", "4", "--run-root", str(tmp_path), "--eval-episodes", "1",
                      "--eval-every", "0", "--device", "cpu", *TINY, cmd=cmd, timeout=300)  # fmt: skip
    assert summary(proc)["step"] == 4
    runs = list((tmp_path / "dt" / "cartpole").iterdir())
    assert len(runs) == 1  # only rank 0 made a run directory


@pytest.mark.slow
def test_return_conditioning_on_cartpole(tmp_path: Path) -> None:
    """A DT on good + random CartPole data reaches a clearly higher return when asked for a high target."""
    from offline_data import write_d4rl_hdf5
    from rl_transformers.algos.dt import DTConfig, train
    from rl_transformers.policies.decision_transformer import dt_backbone_config

    rng = np.random.default_rng(0)

    def noisy(eps: float):
        return lambda obs, r: random_policy(obs, r) if r.random() < eps else good_policy(obs, r)

    episodes = collect(good_policy, 20, 0, max_steps=200)
    for i, eps in enumerate(rng.uniform(0.2, 1.0, size=80)):
        episodes += collect(noisy(float(eps)), 1, 10_000 + i, max_steps=200)
    path = write_d4rl_hdf5(tmp_path / "cartpole-mixed.hdf5", episodes, metadata={"env_id": "CartPole-v1"})
    returns = [ep.total_return for ep in episodes]
    config = DTConfig(
        dataset=str(path),
        env_id=None,
        backbone=dt_backbone_config(d_model=64, n_layers=2, n_heads=2),
        total_steps=3000,
        warmup_steps=300,
        learning_rate=3e-4,
        batch_size=32,
        context_len=10,
        target_returns=(200.0, 20.0),
        eval_every=0,
        eval_episodes=10,
        log_every=500,
        run_root=tmp_path / "runs",
        progress=False,
    )
    result = train(config)
    final = result.evaluations[3000]
    high, low = final["eval/return_mean@200"], final["eval/return_mean@20"]
    print(f"dataset returns: min {min(returns):.0f} median {np.median(returns):.0f} max {max(returns):.0f}")
    print(f"DT return at target 200: {high:.1f}, at target 20: {low:.1f}")
    assert high > 1.5 * low and high - low > 40, final
