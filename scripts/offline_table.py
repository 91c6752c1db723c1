"""Rebuild the results table of Decision Transformer / BC runs from their run directories.

    python scripts/offline_table.py runs/experiments/hopper                 # every DT / BC run below it
    python scripts/offline_table.py runs/dt/<dataset>/<run> runs/bc/<dataset>/<run> --step 1500
    python scripts/offline_table.py runs/experiments/hopper --json table.json --output table.md

Per (algorithm, dataset, target): each seed's mean return over the final evaluation's episodes
(eval/step_<n>.json), the mean over seeds ± a 95 % Student-t interval, the D4RL normalized score (the
dataset's references, read from the checkpoint), Spearman's rho when a run was evaluated at 3 or more
targets, and the commits and machines recorded in each run's system_info.json. This is how the tables of
docs/results/offline.md are made.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import tyro

from rl_transformers.agents.offline_runs import collect_runs
from rl_transformers.agents.offline_table import render_markdown, to_json
from rl_transformers.backbone.options import check_int
from rl_transformers.utils.atomic import atomic_write_json, atomic_write_text
from rl_transformers.utils.errors import run_cli


@dataclass(frozen=True)
class TableArgs:
    runs: tyro.conf.Positional[tuple[str, ...]]
    """Run directories, or folders searched for them (every DT / BC run below)."""
    step: int | None = None
    """Evaluation step to read (eval/step_<n>.json). Default: each run's newest."""
    output: str | None = None
    """Also write the Markdown table to this file (atomically)."""
    json: str | None = None
    """Also write rows, rho values and per-run provenance as JSON to this file (atomically)."""

    def __post_init__(self) -> None:
        check_int("step (--step)", self.step, 0, optional=True)


def main() -> None:
    args = tyro.cli(TableArgs, description=__doc__)
    runs = collect_runs(args.runs, args.step)
    command = shlex.join(["python", "scripts/offline_table.py", *sys.argv[1:]])
    text = render_markdown(runs, command)
    print(text, end="")
    if args.output:
        atomic_write_text(Path(args.output), text)
    if args.json:
        atomic_write_json(Path(args.json), to_json(runs))


if __name__ == "__main__":
    run_cli(main)
