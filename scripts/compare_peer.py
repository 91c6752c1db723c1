"""This library's policies side by side with sb3-contrib's RecurrentPPO under rl-zoo's published recipe: the same
task, seeds and evaluation protocol (the final policy, greedy, --episodes fresh episodes), in one command.

    pip install -e ".[peers]"                                  # sb3-contrib and rl_zoo3
    python scripts/compare_peer.py --arms peer lstm_zoo gtrxl --seeds 0 1 2 --out runs/peer
    python scripts/compare_peer.py --report-only --out runs/peer    # the table from the records

The published page: experiments/peer_cartpole_novel/README.md gives its command.

Each (arm, seed) is one record ``<out>/<arm>/s<seed>.json`` (written atomically): a second invocation skips the
finished ones, so an interrupted comparison resumes; with --save-every a run stopped midway resumes from its
last checkpoint. Arms (:data:`rl_transformers.study.peer_compare.ARMS`):
``peer`` is RecurrentPPO with the zoo's ``ppo_lstm.yml`` entry for the task; the others are
``scripts/train_gtrxl.py`` runs, each with the flags listed there, run in a subprocess (one torch thread).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import tyro

from rl_transformers.study.peer_compare import ARMS, run_arms
from rl_transformers.study.peer_report import load_records, render, replace_block, summarise, table
from rl_transformers.utils.atomic import atomic_write_text
from rl_transformers.utils.errors import run_cli


@dataclass
class CompareConfig:
    env_id: str = "rlt/CartPoleNoVel-v0"
    """Task (the peer needs an rl-zoo entry for it: rl_transformers.study.peer_ppo.ZOO_KEYS)."""
    arms: tuple[str, ...] = ("peer", "lstm_zoo", "gtrxl")
    """Which runs: peer, or arms of rl_transformers.study.peer_compare.ARMS."""
    seeds: tuple[int, ...] = (0, 1, 2)
    """Training seeds (the same for every arm)."""
    total_timesteps: int = 100_000
    """Env steps per run, the same for every arm; it overrides a task recipe's budget, so give the recipe's own
    (rl_transformers/algos/ppo_recipes.yml) to run a recipe as shipped."""
    episodes: int = 50
    """Greedy evaluation episodes of the final policy."""
    out: Path = Path("runs/peer")
    """Records directory (resumable)."""
    save_every: int = 0
    """Checkpoint each library run every N env steps, in <out>/.partial/, so that a run stopped midway (a killed
    job, a machine's end) resumes from its last checkpoint when the same command runs again; its record lists
    the steps it resumed from. 0: a run stopped midway starts again."""
    keep_runs: bool = False
    """Keep each library run's folder (config, progress log, evaluation, checkpoints) in <out>/runs/<arm>-s<seed>/,
    named by its record's run_dir, e.g. to train a later stage from its weights (train_gtrxl.py --init-from);
    without it a run that does not checkpoint works in a temporary folder."""
    report_only: bool = False
    """Only print the table of the records in --out."""
    extra: Annotated[tuple[str, ...], tyro.conf.UseAppendAction] = field(default_factory=tuple)
    """Extra train_gtrxl.py flag for every library arm, one per --extra, repeatable (e.g. --extra=--norm-obs
    --extra=--ppo.update-epochs=10)."""
    solved: float = 475.0
    """Return at which a seed counts as solved (CartPole's reward threshold)."""
    digits: int | None = None
    """Decimals of the per-seed returns in the table (the IQM gets one more); default 0 where a seed's mean
    return reaches 10 in size (CartPole), else 2 (POPGym's and T-Maze's scores in [-1, 1])."""
    reference: str = "peer"
    """Arm the others are tested against (exact permutation test, Holm-corrected)."""
    preamble: Path | None = None
    """With --page: the page's text above the table (task, commands, machine)."""
    page: Path | None = None
    """Write the results page (preamble + table) here."""
    readme: Path | None = None
    """Rewrite this file's <!-- learning:start --> ... <!-- learning:end --> block with the table."""


def main(cfg: CompareConfig) -> None:
    if not cfg.report_only:
        unknown = [a for a in cfg.arms if a != "peer" and a not in ARMS]
        if unknown:
            print(f"error: unknown arm(s) {unknown}; valid: ['peer', *{sorted(ARMS)}]", file=sys.stderr)
            raise SystemExit(2)
        run_arms(
            cfg.env_id,
            cfg.arms,
            cfg.seeds,
            cfg.total_timesteps,
            cfg.episodes,
            cfg.out,
            cfg.extra,
            cfg.save_every,
            cfg.keep_runs,
        )
    summaries = summarise(load_records(cfg.out))
    print("\n".join(table(summaries, cfg.solved, cfg.reference, digits=cfg.digits)))
    if cfg.page is not None:
        preamble = cfg.preamble.read_text(encoding="utf-8") if cfg.preamble is not None else "# Results\n"
        atomic_write_text(cfg.page, render(cfg.out, cfg.solved, cfg.reference, preamble, cfg.digits))
    if cfg.readme is not None:
        text = cfg.readme.read_text(encoding="utf-8")
        compact = table(summaries, cfg.solved, cfg.reference, compact=True, digits=cfg.digits)
        atomic_write_text(cfg.readme, replace_block(text, "learning", "\n".join(compact)))


if __name__ == "__main__":
    run_cli(lambda: main(tyro.cli(CompareConfig, description=__doc__)))
