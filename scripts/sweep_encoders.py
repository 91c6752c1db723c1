"""Sweep backbone variants x seeds through GTrXL-PPO and Decision Transformer training (rl_transformers.bench.sweep).

    python scripts/sweep_encoders.py --variants full local "attention=linear;position=rope;memory=None"
    python scripts/sweep_encoders.py --seeds 0 1 2 --ppo-total-timesteps 100000 --ppo-args="--num-envs 8"
    python scripts/sweep_encoders.py --algos ppo dt --dt-dataset data/cartpole.hdf5 --dt-args="--env-id CartPole-v1"
    python scripts/sweep_encoders.py ... --dry-run          # print the commands of the unfinished runs

Runs in parallel (one torch thread each, --workers defaults to the cores), resumable (a run directory with
result.json is skipped), and writes <out>/summary.md, summary.json, curves-<algo>.png, tensorboard/<algo>/<variant>.
"""

from __future__ import annotations

import tyro

from rl_transformers.bench.sweep import SweepConfig, run_sweep, summary_markdown
from rl_transformers.utils.errors import run_cli


def main(config: SweepConfig) -> None:
    summary = run_sweep(config)
    if "rows" in summary:
        print(summary_markdown(summary))


if __name__ == "__main__":
    run_cli(lambda: main(tyro.cli(SweepConfig, description=__doc__)))
