"""Shared pieces of the safety tests: a tiny PPO run config and a hostile pickle payload."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import torch

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
    """Unpickling this runs ``touch <marker>`` (the attack of issue 11)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def evil_bytes(marker: Path) -> torch.Tensor:
    """The pickled :class:`Evil` as a uint8 tensor, the shape of a checkpoint's byte fields."""
    return torch.frombuffer(bytearray(pickle.dumps(Evil(marker))), dtype=torch.uint8)
