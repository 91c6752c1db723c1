"""A stand-in for scripts/train_gtrxl.py used by the sweep tests (not a test module).

Accepts the flags the sweep passes (--seed, --run-root, --threads, --no-progress, --backbone.<field> <value>),
appends one line per invocation to $FAKE_TRAINER_LOG, and writes runs/fake/env/<stamp>-s<seed>/progress.jsonl
with a return curve whose last value is len(attention) + seed, plus a config.json holding a backbone config.
An attention named "broken" exits with code 3 after writing nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, required=True)
parser.add_argument("--run-root", required=True)
parser.add_argument("--threads", type=int)
parser.add_argument("--no-progress", action="store_true")
parser.add_argument("--backbone.attention", dest="attention", default="full")
parser.add_argument("--backbone.position", dest="position", default="rope")
args, _ = parser.parse_known_args()

with open(os.environ["FAKE_TRAINER_LOG"], "a") as f:
    f.write(f"{args.attention} {args.seed} threads={args.threads} omp={os.environ.get('OMP_NUM_THREADS')}\n")
if args.attention == "broken":
    print("diverged", file=sys.stderr)
    sys.exit(3)
run = Path(args.run_root) / "fake" / "env" / f"20240101-000000-s{args.seed}"
run.mkdir(parents=True)
final = len(args.attention) + args.seed
with open(run / "progress.jsonl", "w") as f:
    for i in range(5):
        f.write(json.dumps({"step": 100 * (i + 1), "rollout/ep_rew_mean": final * (i + 1) / 5}) + "\n")
backbone = {
    "d_model": 16,
    "n_layers": 1,
    "n_heads": 2,
    "attention": args.attention,
    "position": args.position,
}
(run / "config.json").write_text(json.dumps({"policy": {"backbone": backbone}}))
