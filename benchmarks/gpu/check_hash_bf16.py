"""Short GPU check of the bf16 gate of lsh and routing (hashing / clustering in float32 since 792bf6f): kernel at
L = 1K and 16K, layer at 1K, against full and SDPA. On a lent GPU: OUT=<dir> python benchmarks/gpu/check_hash_bf16.py
(gymnasium / tyro wheels first, as benchmarks/gpu/run.sh installs them); on the CPU it runs at L = 256."""

import json
import os
from pathlib import Path

import torch

from rl_transformers.bench import BenchConfig, run_benchmark

KEEP = ("variant", "target", "length", "status", "reason", "num_err", "time_ms", "ratio_sdpa")


def main() -> None:
    gpu = torch.cuda.is_available()
    out = Path(os.environ.get("OUT", "/tmp/gpucheck"))
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for target, lengths in (("kernel", (1024, 16384)), ("layer", (1024,))):
        cfg = BenchConfig(
            targets=(target,), modes=("forward",), lengths=lengths if gpu else (256,), d_heads=(64,),
            tokens=16384 if gpu else 512, width=2048 if gpu else 128, dtype="bfloat16",
            device="cuda" if gpu else "cpu", attentions=("lsh", "routing", "full"), check_max_len=1024,
            ref_max_len=1024, probe_len=96, warmup=2, repeats=7, measure_memory=gpu, plots=False,
            out=out / "harness", progress=True,
        )  # fmt: skip
        rows += [{k: r.get(k) for k in KEEP} for r in run_benchmark(cfg, write=False)["rows"]]
    result = {
        "device": torch.cuda.get_device_name(0) if gpu else "cpu",
        "torch": torch.__version__,
        "git_commit": os.environ.get("RLT_GIT_COMMIT"),
        "rows": rows,
    }
    (out / "lsh_routing_bf16.json").write_text(json.dumps(result, indent=1) + "\n")
    for r in rows:
        print(r)


if __name__ == "__main__":
    main()
