"""Shared pieces of the safety tests: a tiny PPO run config, a hostile pickle payload, a checkpoint rewriter and
small random episodes."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import torch

from offline_data.episode import Episode
from rl_transformers.algos.ppo_config import PPOConfig, TrainConfig
from rl_transformers.policies import PolicyConfig, gtrxl_backbone

BATCH = 2 * 16
"""Env steps of one update of :func:`tiny` (2 envs x 16 steps)."""


def tiny(root: Path, updates: int = 2, **kw) -> TrainConfig:
    """A PPO run of ``updates`` updates on the short T-Maze with a one-layer GTrXL (seconds)."""
    return TrainConfig(
        env_id="rlt/TMazeShort-v0",
        total_timesteps=updates * BATCH,
        num_envs=2,
        seed=3,
        policy=PolicyConfig(backbone=gtrxl_backbone(16, 1, 2, mem_len=8)),
        ppo=PPOConfig(num_steps=16, seq_len=8, num_minibatches=2, update_epochs=1),
        run_root=str(root),
        progress=False,
        **kw,
    )


class Evil:
    """Unpickling this runs ``touch <marker>`` (a checkpoint that runs code when unpickled)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def evil_bytes(marker: Path) -> torch.Tensor:
    """The pickled :class:`Evil` as a uint8 tensor, the shape of a checkpoint's byte fields."""
    return torch.frombuffer(bytearray(pickle.dumps(Evil(marker))), dtype=torch.uint8)


def rewrite_last(run: Path, change) -> Path:
    """Replace ``<run>/checkpoints/last.pt`` by a new file (not through a hard link) holding ``change(ckpt)``."""
    path = run / "checkpoints" / "last.pt"
    ckpt = torch.load(path, weights_only=True)
    change(ckpt)
    path.unlink()
    torch.save(ckpt, path)
    return path


def random_episodes(n: int = 2, steps: int = 5) -> list[Episode]:
    """``n`` Pendulum-shaped episodes of ``steps`` random steps (obs 3, action 1), truncated at the end."""
    rng = np.random.default_rng(0)
    return [
        Episode(
            observations=rng.normal(size=(steps, 3)).astype(np.float32),
            actions=rng.uniform(-2, 2, size=(steps, 1)).astype(np.float32),
            rewards=rng.normal(size=steps),
            terminations=np.zeros(steps, bool),
            truncations=np.r_[np.zeros(steps - 1, bool), True],
            next_observations=rng.normal(size=(steps, 3)).astype(np.float32),
        )
        for _ in range(n)
    ]
