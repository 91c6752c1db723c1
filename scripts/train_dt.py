"""Train a Decision Transformer (or BC / %BC) on an offline dataset: Minari id, Minari directory or D4RL .hdf5.

    python scripts/train_dt.py --dataset rlt/hopper/medium-v0 --dataset-root datasets/minari
    python scripts/train_dt.py --dataset data/cartpole.hdf5 --target-returns 500 100 --total-steps 20000
    python scripts/train_dt.py --dataset ... --backbone.attention full --backbone.position rope
    python scripts/train_dt.py --dataset ... --algo bc --bc-top-fraction 0.1          # 10%BC
    python scripts/train_dt.py --resume runs/dt/<dataset>/<run>/                      # continue a run
    torchrun --nproc_per_node 2 scripts/train_dt.py --dataset ...                      # data-parallel (DDP)

Runs go to runs/<algo>/<dataset>/<YYYYmmdd-HHMMSS>-s<seed>/ (config.json, TensorBoard events,
progress.jsonl, checkpoints/{step_<n>,last,best}.pt, eval/step_<n>.json). Ctrl-C saves a checkpoint and stops.
Every option: ``--help``; the method and defaults: ``rl_transformers/algos/dt.py``.
"""

from __future__ import annotations

import json

from rl_transformers.algos.dt import DTConfig, cleanup_distributed, train
from rl_transformers.algos.dt_config import RESUME_PER_INVOCATION
from rl_transformers.utils.cli import cli_registry  # BackboneConfig flags, *_options as JSON
from rl_transformers.utils.errors import run_cli
from rl_transformers.utils.resume import parse_cli  # --resume: flags default to the saved config


def main(config: DTConfig) -> None:
    if not config.dataset and config.resume is None:
        raise SystemExit("error: --dataset is required (a Minari id, Minari directory or D4RL .hdf5 file)")
    try:
        result = train(config)
    finally:
        cleanup_distributed()
    if result.run_dir is not None:
        last = result.evaluations.get(result.step, {})
        summary = {"run_dir": str(result.run_dir), "step": result.step, "interrupted": result.interrupted}
        print(json.dumps(summary | {"final_eval": last}, indent=2))


if __name__ == "__main__":
    run_cli(
        lambda: main(
            parse_cli(
                DTConfig, per_invocation=RESUME_PER_INVOCATION, registry=cli_registry(), description=__doc__
            )
        )
    )
