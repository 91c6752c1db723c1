"""Measure PPO throughput (env steps / s): rollouts alone and whole updates (rollout + training).

    python scripts/measure_throughput.py                         # default GTrXL config, 1 thread
    python scripts/measure_throughput.py --threads 2 --num-envs 32
    python scripts/measure_throughput.py --policy lstm
Takes every training flag of train_gtrxl.py (--backbone.*, --ppo.*, --env-id ...). Prints one JSON line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated

import tyro

from rl_transformers.algos.ppo import TrainConfig, measure_throughput
from rl_transformers.utils.cli import cli_registry
from rl_transformers.utils.errors import run_cli


@dataclass(frozen=True)
class Args:
    config: Annotated[TrainConfig, tyro.conf.arg(name="")]
    """Training configuration to measure."""
    updates: int = 5
    """Measured PPO updates."""
    warmup: int = 1
    """Unmeasured updates first (memory warm-up, allocator)."""


def main() -> None:
    args = tyro.cli(
        Args, registry=cli_registry(), default=Args(TrainConfig(progress=False)), description=__doc__
    )
    result = measure_throughput(args.config, args.updates, args.warmup)
    print(json.dumps({"env_id": args.config.env_id, **{k: round(v, 1) for k, v in result.items()}}))


if __name__ == "__main__":
    run_cli(main)
