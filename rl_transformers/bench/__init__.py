"""Benchmarks: the attention harness (``rlt bench``, ``scripts/benchmark_backbones.py``); the encoder study (RL
runs per variant, ``scripts/encoder_study.py``) lives in :mod:`rl_transformers.study`.

- :mod:`~rl_transformers.bench.command` - the command: flags, summary line, exit status
- :mod:`~rl_transformers.bench.config` - :class:`BenchConfig` (CPU / GPU defaults)
- :mod:`~rl_transformers.bench.ops` - implementations (SDPA, registry entries, peers) and timed operations
- :mod:`~rl_transformers.bench.correctness` - the correctness gate (float64, softmax probe, dense reference)
- :mod:`~rl_transformers.bench.timing` - round-robin repeats, median / IQR, CPU and CUDA clocks
- :mod:`~rl_transformers.bench.memory` - peak memory (fresh process on CPU, CUDA statistics on GPU), estimates
- :mod:`~rl_transformers.bench.harness` - the run; :mod:`~rl_transformers.bench.report` - JSON, Markdown, plots
- :mod:`~rl_transformers.bench.gate` - the gate of each row; :mod:`~rl_transformers.bench.rows` - row fields, FLOPs
- :mod:`~rl_transformers.bench.meta` - git commit (of the package's checkout) and machine of a run
- :mod:`~rl_transformers.bench.peers` - optional third-party rows

Training-throughput tables (outside the attention harness):

- :mod:`~rl_transformers.bench.ppo_throughput` - PPO env steps/s per attention (``measure_throughput.py
  --all-attentions``)
- :mod:`~rl_transformers.bench.ppo_reference` - PPO vs cleanrl's ppo_trxl at an equal parameter count
- :mod:`~rl_transformers.bench.dt_models` / :mod:`~rl_transformers.bench.dt_timing` - Decision Transformer vs
  HF / d3rlpy (``bench_dt_throughput.py``)
"""

from __future__ import annotations

from rl_transformers.bench.config import BenchConfig
from rl_transformers.bench.harness import run_benchmark

__all__ = ["BenchConfig", "run_benchmark"]
