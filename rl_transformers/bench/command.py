"""Benchmark every registered attention against SDPA: time, memory, error, crossover (rl_transformers.bench).

    python scripts/benchmark_backbones.py                      # full default sweep (CPU: fp32, L 256..16K)
    python scripts/benchmark_backbones.py --quick              # smoke run: kernel target, L 256 and 1K
    python scripts/benchmark_backbones.py --attentions full local linear --modes forward --lengths 1024 4096
    python scripts/benchmark_backbones.py --peers --compile --profile --out benchmarks/results/mine

Writes <out>/results.json, results.md and plots/ (default out: benchmarks/results/<cpu|gpu>). The method
(gate, timing, memory, FLOP formula) is described in benchmarks/README.md and rl_transformers/bench/*.py.
"""

from __future__ import annotations

import tyro

from rl_transformers.bench.config import BenchConfig
from rl_transformers.bench.harness import main_exit_code, run_benchmark
from rl_transformers.utils.errors import run_cli
from rl_transformers.utils.extras import need


def main(config: BenchConfig) -> int:
    """Run the benchmark of ``config``, print one summary line; the exit status of
    :func:`~rl_transformers.bench.harness.main_exit_code`."""
    if config.plots:  # checked before the sweep, not after it
        need("matplotlib", "--plots (on by default)", alternative="or leave plots out with --no-plots")
    results = run_benchmark(config)
    out = config.resolve().out
    counts: dict[str, int] = {}
    for row in results["rows"]:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    print(f"{len(results['rows'])} rows {counts} -> {out}/results.json, results.md, plots/")
    return main_exit_code(results)


def command() -> int:
    """``rlt bench`` / ``scripts/benchmark_backbones.py``: the flags of :class:`BenchConfig` on ``sys.argv``,
    then :func:`main` (its exit status); user errors as one line."""
    return run_cli(lambda: main(tyro.cli(BenchConfig, description=__doc__)))
