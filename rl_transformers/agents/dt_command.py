"""Train a Decision Transformer (or BC / %BC) on an offline dataset: Minari id, Minari directory or D4RL .hdf5.

    python scripts/train_dt.py --dataset rlt/hopper/medium-v0 --dataset-root datasets/minari
    python scripts/train_dt.py --dataset data/cartpole.hdf5 --target-returns 500 100 --total-steps 20000
    python scripts/train_dt.py --dataset ... --backbone.attention full --backbone.position rope
    python scripts/train_dt.py --dataset ... --algo bc --bc-top-fraction 0.1          # 10%BC
    python scripts/train_dt.py --resume runs/dt/<dataset>/<run>/                      # continue a run
    torchrun --nproc_per_node 2 scripts/train_dt.py --dataset ...                      # data-parallel (DDP)

Runs go to runs/<algo>/<dataset>/<YYYYmmdd-HHMMSS>-s<seed>/ (config.json, TensorBoard events,
progress.jsonl, checkpoints/{step_<n>,last,best}.pt, eval/step_<n>.json). Prints the parameter count at the
start and a JSON summary at the end (the last logged eval/return_mean, eval/normalized_score, train/loss).
Ctrl-C saves a checkpoint and stops; a non-finite loss stops the run and keeps the last good checkpoint. The run
flags (--run-root, --seed, --threads, --device, --resume, --verbose, --progress, --allow-env-modules) are the
same as train_gtrxl.py's. Every option: ``--help``; the method and defaults: ``rl_transformers/algos/dt.py``.
"""

from __future__ import annotations

from rl_transformers.algos.dt import train
from rl_transformers.algos.dt_config import RESUME_PER_INVOCATION, DTConfig
from rl_transformers.backbone.cli import cli_registry  # BackboneConfig flags, *_options as JSON
from rl_transformers.runs.lifecycle import summary_text
from rl_transformers.runs.resume import parse_cli  # --resume: flags default to the saved config
from rl_transformers.utils.errors import UserError, run_cli
from rl_transformers.utils.training import NonFiniteError


def main() -> int:
    """Parse ``sys.argv``, train, print the JSON summary; the exit status: 0, or 1 when a non-finite loss stopped
    the run."""
    config = parse_cli(
        DTConfig, per_invocation=RESUME_PER_INVOCATION, registry=cli_registry(), description=__doc__
    )
    if not config.dataset and config.resume is None:
        raise UserError("--dataset is required (a Minari id, Minari directory or D4RL .hdf5 file)")
    try:
        result = train(config)
    except NonFiniteError:
        return 1
    if result.run_dir is not None:
        print(summary_text(result))
    return 0


def command() -> int:
    """``rlt train-dt`` / ``scripts/train_dt.py``: :func:`main` on ``sys.argv``, user errors as one line."""
    return run_cli(main)
