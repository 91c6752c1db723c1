"""The GPU benchmark suite in one time-boxed command (benchmarks/studies/gpu_suite.py).

    python benchmarks/bench_gpu.py --out benchmarks/results/gpu-h100        # on a CUDA machine, ~7 minutes
    python benchmarks/bench_gpu.py --dry-run --out /tmp/gpu-dry              # toy sizes on the CPU (seconds)
    bash benchmarks/gpu/run.sh OUT                                          # the same on a lent GPU, wheels first

Device record, measured matmul / copy ceilings, every attention against SDPA (flash and memory-efficient
backends too) in bf16 and fp32, PPO env steps/s with 32, 256 and 1,024 envs, and the DT against Hugging Face's.
Writes results.json, results.md and attention.png to --out.
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
from pathlib import Path

import tyro

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a file: benchmarks/ (not installed) imports from the checkout's root
    sys.path.insert(0, str(ROOT))

from benchmarks.studies.gpu_suite import GpuSuiteConfig, run_suite  # noqa: E402
from rl_transformers.utils.errors import run_cli  # noqa: E402


def main(cfg: GpuSuiteConfig) -> int:
    command = cfg.command or shlex.join(["python", "benchmarks/bench_gpu.py", *sys.argv[1:]])
    results = run_suite(dataclasses.replace(cfg, command=command))
    status = {name: rec["status"] for name, rec in results["stages"].items()}
    print(f"stages: {status} -> {cfg.out}/results.json, results.md, attention.png")
    return 1 if "error" in status.values() else 0


if __name__ == "__main__":
    sys.exit(run_cli(lambda: main(tyro.cli(GpuSuiteConfig, description=__doc__))))
