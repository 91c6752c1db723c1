"""The GPU benchmark suite in one time-boxed command (rl_transformers/bench/gpu_suite.py).

    python scripts/bench_gpu.py --out benchmarks/results/gpu-h100        # on a CUDA machine, ~7 minutes
    python scripts/bench_gpu.py --dry-run --out /tmp/gpu-dry              # toy sizes on the CPU (seconds)
    bash benchmarks/gpu/run.sh OUT                                          # the same on a lent GPU, wheels first

Device record, measured matmul / copy ceilings, every attention against SDPA (flash and memory-efficient
backends too) in bf16 and fp32, PPO env steps/s with 32, 256 and 1,024 envs, and the DT against Hugging Face's.
Writes results.json, results.md and attention.png to --out.
"""

from __future__ import annotations

import dataclasses
import shlex
import sys

import tyro

from rl_transformers.bench.gpu_suite import GpuSuiteConfig, run_suite
from rl_transformers.utils.errors import run_cli


def main(cfg: GpuSuiteConfig) -> int:
    command = cfg.command or shlex.join(["python", "scripts/bench_gpu.py", *sys.argv[1:]])
    results = run_suite(dataclasses.replace(cfg, command=command))
    status = {name: rec["status"] for name, rec in results["stages"].items()}
    print(f"stages: {status} -> {cfg.out}/results.json, results.md, attention.png")
    return 1 if "error" in status.values() else 0


if __name__ == "__main__":
    sys.exit(run_cli(lambda: main(tyro.cli(GpuSuiteConfig, description=__doc__))))
