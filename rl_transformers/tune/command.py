"""Tune PPO hyper-parameters of any encoder on any task with Optuna: TPE sampler, median pruner, a resumable
SQLite study (method: rl_transformers/tune/tuner.py).

    python scripts/tune.py --encoder gtrxl --env-id rlt/popgym-RepeatPreviousEasy-v0 --n-trials 8
    python scripts/tune.py --encoder gru --space.learning-rate 1e-4 1e-2 --space.seq-len 16 32
    python scripts/tune.py --encoder 'attention=local;position=rope;memory=None' --space.knob 8 128
    python scripts/tune.py --encoder gtrxl --n-trials 12      # the same study again: adds 4 trials

Searches the learning rate, the entropy coefficient, the training window (--ppo.seq-len) and the encoder's
context knob (mem_len / max_cache / window ...; hidden size for GRU / LSTM). Trials train on tuning seeds,
disjoint from the test seeds (rl_transformers/tune/seeds.py). Writes <out>/<study>.db and <out>/<study>/
(trial runs; trials.json with every trial; best.json with the best parameters and the command that trains
them).
"""

from __future__ import annotations

import torch

from rl_transformers.backbone.cli import cli_registry
from rl_transformers.tune.tuner import TuneConfig, best_trial, rebuilt, run_tuning
from rl_transformers.utils.errors import run_cli
from rl_transformers.utils.extras import need


def main(cfg: TuneConfig) -> None:
    """Run (or extend) the tuning study of ``cfg``; print the best trial and the command that trains it."""
    need("optuna", "tuning (rl_transformers/tune/tuner.py)")
    torch.set_num_threads(cfg.threads)
    study = run_tuning(cfg)
    top = best_trial(study)  # every trial was checked against the search space and the task when read
    if top is not None:
        print(f"best: trial {top.number}, value {top.value:.4g}, {top.params}")
        print(f"train it: {rebuilt(cfg, top)[1]}")  # rebuilt from the parameters, never read from the file


INTERRUPTED = (
    "finished trials are kept in the study's SQLite file; the interrupted trial failed, and the same command runs "
    "a new trial in its place"
)
"""What a Ctrl-C leaves (printed as ``interrupted: ...``, exit status 130)."""


def command() -> int:
    """``rlt tune`` / ``scripts/tune.py``: the flags of :class:`TuneConfig` on ``sys.argv``, then :func:`main`;
    user errors as one line."""
    import tyro

    run_cli(
        lambda: main(tyro.cli(TuneConfig, description=__doc__, registry=cli_registry())),
        on_interrupt=INTERRUPTED,
    )
    return 0
