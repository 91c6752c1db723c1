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
- :mod:`~rl_transformers.bench.kernels` - the kernel census (attention backends reached, real FLOPs)
- :mod:`~rl_transformers.bench.peers` - optional third-party rows
- :mod:`~rl_transformers.bench.worktree` - an older commit's tree beside the working tree (A/B checks)

The project's own benchmark studies (PPO and DT throughput tables, the GPU suite, profiles) are not part of the
package: they live beside it in the checkout's ``benchmarks/`` folder, with their results.
"""

from __future__ import annotations

from rl_transformers.bench.config import BenchConfig
from rl_transformers.bench.harness import run_benchmark

__all__ = ["BenchConfig", "run_benchmark"]
