"""Tiny PPO and DT runs (a few seconds each), made once per test session in one runs root."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from rl_transformers import train_dt, train_ppo
from rl_transformers.algos.ppo_config import PPOConfig, TrainConfig
from rl_transformers.policies.gtrxl import PolicyConfig, gtrxl_backbone
from rl_transformers.runs.checkpoint import atomic_save
from rl_transformers.utils.atomic import atomic_write_json

PPO_ENV = "rlt/CartPoleNoVel-v0"


@pytest.fixture(scope="session")
def runs_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("api") / "runs"


@pytest.fixture(scope="session")
def ppo_run(runs_root: Path):
    cfg = TrainConfig(
        env_id=PPO_ENV,
        total_timesteps=4 * 32,
        num_envs=2,
        seed=5,
        policy=PolicyConfig(backbone=gtrxl_backbone(16, 1, 2, mem_len=8), norm_obs=True),
        ppo=PPOConfig(num_steps=16, seq_len=8, num_minibatches=2, update_epochs=2),
        eval_every=64,
        eval_episodes=4,
        run_root=str(runs_root),
        progress=False,
        verbose=False,
        threads=1,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return train_ppo(cfg)


@pytest.fixture(scope="session")
def dt_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.algos.test_dt import cartpole_dataset

    return cartpole_dataset(
        tmp_path_factory.mktemp("data") / "cartpole.hdf5", n_good=2, n_random=6, max_steps=40
    )


@pytest.fixture(scope="session")
def dt_run(runs_root: Path, dt_dataset: Path):
    from rl_transformers.algos.dt_config import DTConfig
    from rl_transformers.policies.decision_transformer import dt_backbone_config

    cfg = DTConfig(
        dataset=str(dt_dataset),
        backbone=dt_backbone_config(d_model=16, n_layers=1, n_heads=2),
        context_len=4,
        total_steps=6,
        batch_size=8,
        warmup_steps=2,
        learning_rate=1e-3,
        log_every=2,
        eval_every=6,
        eval_episodes=3,
        eval_envs=2,
        target_returns=(40.0, 10.0),
        run_root=runs_root,
        progress=False,
    )
    return train_dt(cfg)


def make_offline_run(
    root: Path, algo: str, seed: int, returns: dict, *, refs=(0.0, 200.0), step=100, name=None, **config
) -> Path:
    """A DT / BC run directory as the trainer writes it: ``config.json`` (algo, dataset, seed, ``config``),
    ``eval/step_<step>.json`` with ``returns`` ({target: [episode returns]}), a checkpoint holding the
    dataset's reference scores ``refs`` (None: no checkpoint)."""
    run = root / algo / "ds" / (name or f"r-s{seed}")
    atomic_write_json(
        run / "config.json", {"algo": algo, "dataset": "rlt/toy/medium-v0", "seed": seed, **config}
    )
    episodes = [{"target": t, "returns": list(r), "lengths": [10] * len(r)} for t, r in returns.items()]
    atomic_write_json(run / "eval" / f"step_{step}.json", {"step": step, "episodes": episodes})
    if refs is not None:
        dataset = {"source": "toy", "env_id": None, "ref_min_score": refs[0], "ref_max_score": refs[1]}
        (run / "checkpoints").mkdir(parents=True, exist_ok=True)
        atomic_save({"dataset": dataset}, run / "checkpoints" / "last.pt")
    return run
