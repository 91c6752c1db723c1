"""Updates/s and memory of the Decision Transformer at long context, per row of the offline memory table.

For each T-Maze corridor L and each row (every causal attention with K = L + 1, the memories xl / compressive /
knn with K_s = ceil((L + 1) / 3) and 3 segments, the floor) the table's real trainer is built and its update
timed in interleaved rounds beside the other rows of the same L (CPU time and wall clock, one thread), with the
ratio to full attention from the same rounds; memory: the bytes autograd saves for one update's backward and
the peak RSS increase of one update in a fresh process (method: benchmarks/studies/dt_long.py).

    python benchmarks/bench_dt_long_context.py --dry-run                      # the rows, K and a rough duration
    python benchmarks/bench_dt_long_context.py                                # every row at L = 10, 25, 50, 200
    python benchmarks/bench_dt_long_context.py --lengths 10 50 --rows full local xl floor --rounds 3
    python benchmarks/bench_dt_long_context.py --no-rss --out /tmp/dt_long    # skip the fresh-process RSS

Needs the datasets of scripts/make_memory_dataset.py under --dataset-root; writes results.json and results.md
under --out. Run it on an idle machine: the numbers are meant to be published.
"""

from __future__ import annotations

import sys
from pathlib import Path

import tyro

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a file: benchmarks/ (not installed) imports from the checkout's root
    sys.path.insert(0, str(ROOT))

from benchmarks.studies.dt_long import DTLongConfig, run_bench  # noqa: E402
from rl_transformers.utils.errors import run_cli  # noqa: E402


def main() -> dict:
    cfg = tyro.cli(DTLongConfig, description=__doc__)
    return run_bench(cfg, " ".join(["python", "benchmarks/bench_dt_long_context.py", *sys.argv[1:]]))


if __name__ == "__main__":
    run_cli(main)
