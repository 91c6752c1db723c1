"""The two trainers behind one interface, so every lifecycle test runs against PPO and DT alike."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.algos.test_dt import cartpole_dataset

PPO_BATCH = 2 * 16  # num_envs * num_steps: env steps per PPO iteration


@dataclass
class Family:
    """A trainer family: tiny configs, its train function, and where its checkpoint keeps the weights."""

    name: str
    unit: int
    """Steps (the logged x axis) per iteration: env steps per PPO update, 1 per DT update."""
    make: Callable[..., Any]
    """make(root, iterations, **overrides) -> config; ``save_every`` / ``eval_every`` given in iterations."""
    train: Callable[..., Any]
    weights_key: str
    loss_tag: str
    script: str

    @property
    def eval_prefix(self) -> str:
        """The summary's evaluation tag (DT: named with its target, ``eval/return_mean@<target>``)."""
        return "eval/mean_reward" if self.name == "ppo" else "eval/return_mean@"

    @property
    def best_tag(self) -> str:
        """The logged tag that selects best.pt."""
        return "eval/mean_reward" if self.name == "ppo" else "eval/return_mean"

    def iteration(self, trainer: Any) -> int:
        return trainer.update if self.name == "ppo" else trainer.step

    def model(self, trainer: Any) -> torch.nn.Module:
        return trainer.policy if self.name == "ppo" else trainer.model


def _ppo_config(root: Path, iterations: int, **kw: Any) -> Any:
    from rl_transformers.algos.ppo_config import PPOConfig, TrainConfig
    from rl_transformers.policies import PolicyConfig, gtrxl_backbone

    for key in ("save_every", "eval_every"):
        if key in kw:
            kw[key] *= PPO_BATCH
    kw.setdefault("eval_every", 0)
    return TrainConfig(
        env_id="rlt/TMazeShort-v0",
        total_timesteps=iterations * PPO_BATCH,
        num_envs=2,
        seed=3,
        policy=PolicyConfig(backbone=gtrxl_backbone(16, 1, 2, mem_len=8)),
        ppo=PPOConfig(num_steps=16, seq_len=8, num_minibatches=2, update_epochs=2, info_every=1),
        run_root=root,
        progress=False,
        **kw,
    )


def _dt_config(dataset: Path) -> Callable[..., Any]:
    def make(root: Path, iterations: int, **kw: Any) -> Any:
        from rl_transformers.algos.dt_config import DTConfig
        from rl_transformers.policies.decision_transformer import dt_backbone_config

        base = dict(
            dataset=str(dataset),
            backbone=dt_backbone_config(d_model=16, n_layers=1, n_heads=2),
            context_len=4,
            total_steps=iterations,
            batch_size=8,
            warmup_steps=2,
            learning_rate=1e-3,
            log_every=1,
            eval_every=0,
            eval_episodes=0,
            eval_envs=1,
            save_every=100,
            keep_checkpoints=10,
            run_root=root,
            progress=False,
            seed=3,
        )
        if kw.get("eval_every"):
            base["eval_episodes"] = 1
        return DTConfig(**(base | kw))

    return make


@pytest.fixture(scope="session")
def lifecycle_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cartpole_dataset(
        tmp_path_factory.mktemp("lifecycle") / "cartpole.hdf5", n_good=2, n_random=6, max_steps=40
    )


@pytest.fixture(params=["ppo", "dt"])
def family(request: pytest.FixtureRequest, lifecycle_dataset: Path) -> Family:
    if request.param == "ppo":
        from rl_transformers.algos.ppo import train

        return Family("ppo", PPO_BATCH, _ppo_config, train, "policy", "train/loss", "train_gtrxl.py")
    from rl_transformers.algos.dt import train

    return Family("dt", 1, _dt_config(lifecycle_dataset), train, "model", "train/loss", "train_dt.py")


def progress(run_dir: Path) -> list[dict]:
    """Logged rows without the wall-clock tags."""
    rows = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def replace(config: Any, **changes: Any) -> Any:
    return dataclasses.replace(config, **changes)
