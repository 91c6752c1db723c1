"""Supervised memory probe: can each study encoder, trained through its policy's own acting and training path,
output the symbol it saw k steps ago? (method: experiments/memory_probe/probe.py)

    python -m experiments.memory_probe.run --dry-run                                # cell count and estimated time
    python -m experiments.memory_probe.run --encoders gtrxl gru --ks 1 4 16 --seeds 0
    python -m experiments.memory_probe.run --docs docs/results                      # the whole grid, resumable
    python -m experiments.memory_probe.run --report-only --docs docs/results        # rebuild the documents

Each finished cell is a file under --out; a second invocation skips them, so an interrupted grid resumes. The
committed cells (docs/results/memory_probe.json, same settings only) are restored into --out first, so a fresh
checkout never re-measures them; --no-restore measures everything afresh.
"""

from __future__ import annotations

import shlex
import sys

import torch
import tyro

from experiments.memory_probe.grid import ProbeConfig, estimate, plan_rows, run_grid
from experiments.memory_probe.restore import check_nothing_lost, committed_json, restorable, restore_cells
from rl_transformers.study import launch
from rl_transformers.study.encoders import ppo_encoders, select
from rl_transformers.utils.errors import run_cli


def main(cfg: ProbeConfig) -> None:
    torch.set_num_threads(cfg.threads)
    encoders, _excluded = ppo_encoders(match=True)
    rows = plan_rows(select(encoders, cfg.encoders), cfg.bounds)
    peers = plan_rows(
        encoders, cfg.bounds
    )  # repeated cells and rates are looked for among every encoder's rows
    committed = committed_json(cfg)
    start_by = launch.start_limit(cfg.flags.stop_starting_after_h)
    if cfg.flags.dry_run:  # the committed cells a run would restore count as finished; nothing is written
        print(estimate(cfg, rows, peers, restorable(cfg, peers, committed) if committed else None))
        return
    if committed is not None:  # a fresh checkout starts from the committed cells, never below them: every
        restored = restore_cells(
            cfg, peers, committed
        )  # encoder's, as a cell may repeat another's (repeat_of)
        if restored:
            print(f"restored {restored} finished cells from {committed} into {cfg.out}")
    if not cfg.flags.report_only:
        run_grid(cfg, rows, peers=peers, start_by=start_by)
    if cfg.flags.docs is not None:
        from experiments.memory_probe import report

        # the command that runs (or resumes) the grid and writes these documents
        args = [a for a in sys.argv[1:] if a != "--report-only"]
        command = shlex.join(["python", "-m", "experiments.memory_probe.run", *args])
        built = report.build(cfg, rows, command, peers)
        check_nothing_lost(built, committed)
        for path in report.write(built, cfg.flags.docs):
            print(f"wrote {path}")


if __name__ == "__main__":
    run_cli(
        lambda: main(tyro.cli(ProbeConfig, description=__doc__)),
        on_interrupt="finished cells are kept; rerun the same command to resume",
    )
