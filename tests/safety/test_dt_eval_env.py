"""A DT run is evaluated on the task it trained on, or refused: never silently on the bare env id.

The run here trains on a T-Maze dataset whose env spec says corridor 50 (episodes of 51 steps); the registered
``rlt/TMaze-v0`` has corridor 10 (11 steps). Before, any refusal of the dataset's spec other than the module
allow-list (a size bound, a path-named keyword, unreadable JSON), or a moved dataset, made ``load(...).evaluate``
and ``scripts/evaluate.py`` score the run on corridor 10 with exit status 0. Now the checkpoint records the env
spec it evaluated on and evaluation rebuilds exactly that; a checkpoint without one whose dataset is gone, and a
recorded spec that is refused, end in an error naming the cause and the fix (``--env-id``, given knowingly).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from offline_data import Episode, write_d4rl_hdf5
from rl_transformers.agents import load
from rl_transformers.agents.evaluate import evaluate_agent
from rl_transformers.algos.dt_config import DTConfig
from rl_transformers.policies.decision_transformer import dt_backbone_config
from rl_transformers.utils.errors import UserError

REPO = Path(__file__).resolve().parents[2]
CORRIDOR = 50
SPEC = {"id": "rlt/TMaze-v0", "entry_point": "envs.tmaze:TMazeEnv", "kwargs": {"corridor_length": CORRIDOR}}


def tmaze_dataset(path: Path) -> Path:
    """Four corridor-50 episodes (51 steps: walk east, then turn), recorded with the corridor-50 spec."""
    n = CORRIDOR + 1
    episodes = []
    for goal in (1, -1, 1, -1):
        obs = np.zeros((n, 2), np.float32)
        obs[0, 0] = goal
        obs[CORRIDOR, 1] = 1.0
        actions = np.r_[np.zeros(CORRIDOR, np.int64), [2 if goal == 1 else 3]]
        rewards = np.r_[np.zeros(CORRIDOR), [1.0]]
        done = np.r_[np.zeros(CORRIDOR, bool), [True]]
        episodes.append(Episode(obs, actions, rewards, done, np.zeros(n, bool), np.roll(obs, -1, axis=0)))
    return write_d4rl_hdf5(path, episodes, metadata={"env_spec": json.dumps(SPEC)}, overwrite=True)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(run directory, dataset) of a tiny DT run on the corridor-50 dataset."""
    from rl_transformers.algos.dt import train

    root = tmp_path_factory.mktemp("dt_eval_env")
    dataset = tmaze_dataset(root / "tmaze50.hdf5")
    cfg = DTConfig(
        dataset=str(dataset),
        backbone=dt_backbone_config(d_model=16, n_layers=1, n_heads=2),
        context_len=4,
        total_steps=2,
        batch_size=4,
        warmup_steps=1,
        log_every=1,
        eval_every=2,
        eval_episodes=1,
        eval_envs=1,
        target_returns=(1.0,),
        run_root=root / "runs",
        progress=False,
        seed=0,
    )
    run_dir = train(cfg).run_dir
    assert run_dir is not None
    return run_dir, dataset


def _lengths(agent) -> list[int]:
    return evaluate_agent(agent, episodes=2, num_envs=1).results[0].lengths


def test_the_checkpoint_records_the_full_spec(run: tuple[Path, Path]) -> None:
    run_dir, _ = run
    recorded = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["dataset"]["env_spec"]
    assert recorded["id"] == "rlt/TMaze-v0" and recorded["kwargs"] == {"corridor_length": CORRIDOR}


def test_a_moved_dataset_still_evaluates_the_trained_task(run: tuple[Path, Path], tmp_path: Path) -> None:
    run_dir, dataset = run
    moved = tmp_path / "elsewhere.hdf5"
    dataset.rename(moved)
    try:
        assert _lengths(load(run_dir)) == [CORRIDOR + 1] * 2  # corridor 50, not the registered 10
    finally:
        moved.rename(dataset)


def _without_record(run_dir: Path, tmp_path: Path) -> Path:
    """A copy of the run's checkpoint as a checkpoint written before runs recorded their env spec."""
    ckpt = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    del ckpt["dataset"]["env_spec"]
    out = tmp_path / "run" / "checkpoints" / "last.pt"
    out.parent.mkdir(parents=True)
    torch.save(ckpt, out)
    return out


def test_an_old_checkpoint_whose_dataset_moved_is_refused(run: tuple[Path, Path], tmp_path: Path) -> None:
    run_dir, dataset = run
    old = _without_record(run_dir, tmp_path)
    assert _lengths(load(old)) == [CORRIDOR + 1] * 2  # the dataset is still there: its spec is used
    moved = tmp_path / "elsewhere.hdf5"
    dataset.rename(moved)
    try:
        with pytest.raises(UserError, match="records no env spec") as info:
            _lengths(load(old))
        assert "--env-id" in str(info.value) and str(dataset) in str(info.value)
        # restated knowingly: the user's env, as registered
        assert _lengths(load(old, env_id="rlt/TMaze-v0")) == [11, 11]
    finally:
        moved.rename(dataset)


@pytest.mark.parametrize(
    "change, cause",
    [
        (lambda s: s["kwargs"].update(corridor_length=10**12), "larger than"),  # a size bound
        (lambda s: s["kwargs"].update(corridor_length="/etc/passwd"), "path"),  # a path-named keyword
        (lambda s: s.update(entry_point="os:system"), "refused env spec"),  # code outside the allow-list
        (lambda s: s.update(max_episode_steps=-3), "max_episode_steps"),
        (lambda s: s.update(kwargs=[1, 2]), "kwargs"),  # malformed
    ],
)
def test_a_refused_recorded_spec_is_an_error_never_the_bare_id(
    run: tuple[Path, Path], tmp_path: Path, change, cause: str
) -> None:
    run_dir, _ = run
    ckpt = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    change(ckpt["dataset"]["env_spec"])
    out = tmp_path / "run" / "checkpoints" / "last.pt"
    out.parent.mkdir(parents=True)
    torch.save(ckpt, out)
    with pytest.raises(UserError, match=cause) as info:
        _lengths(load(out))
    assert "--env-id" in str(info.value)


def test_evaluate_script_refuses_with_one_error_line(run: tuple[Path, Path], tmp_path: Path) -> None:
    run_dir, dataset = run
    old = _without_record(run_dir, tmp_path)
    moved = tmp_path / "elsewhere.hdf5"
    dataset.rename(moved)
    try:
        out = subprocess.run(
            [
                sys.executable,
                str(REPO / "scripts" / "evaluate.py"),
                str(old),
                "--episodes",
                "1",
                "--output",
                str(tmp_path / "eval.json"),
            ],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=300,
            env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
        )
    finally:
        moved.rename(dataset)
    assert out.returncode == 2 and out.stderr.startswith("error: ") and "Traceback" not in out.stderr
    assert "--env-id" in out.stderr and not (tmp_path / "eval.json").exists()
