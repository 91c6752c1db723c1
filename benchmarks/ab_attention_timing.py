"""Time one attention kernel (or PPO with it) at an older commit and in the working tree, side by side.

    python benchmarks/ab_attention_timing.py --commit 0cd9d35 --attention lsh --length 16384
    python benchmarks/ab_attention_timing.py --commit HEAD~3 --attention routing --length 4096 --rounds 3
    python benchmarks/ab_attention_timing.py --commit 28096be --attention full --target ppo --compile --rounds 3

``--target ppo`` times whole PPO updates instead: the default GTrXL policy on the default env
(T-Maze) with ``--attention`` swapped in (``rope`` for attentions that refuse ``xl_relative``), 32 envs, one
thread, ``measure_throughput`` (``--warmup`` updates, then ``--updates`` timed ones: env steps per second of
rollout + training). With ``--compile`` each round also times today's tree with ``--compile`` (warm-up absorbs
the compilation). Run it on an idle machine; the ratios are today / commit.

Each round runs one fresh process per tree (the commit's package from a temporary ``git worktree`` first on
``PYTHONPATH``, then the working tree's), one torch thread each. A process builds a one-layer ``Backbone`` with
the attention (its default options, position ``none``, H heads of D = 64, causal), draws q = k and v
(B, H, L, D) from seed 0, and times ``attention.attend`` on the chunked path (``dense_chunks = 0`` where the
attention has it): the forward without gradients and forward + backward, ``--repeats`` timed calls after one
warm-up, median. The report gives every round's medians and the ratio today / commit of the medians over rounds.
Speed is only comparable within one invocation on an otherwise idle machine.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import tyro

from rl_transformers.backbone import available
from rl_transformers.bench.worktree import commit_tree
from rl_transformers.utils.errors import UserError, choice_hint, run_cli

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time, torch
torch.set_num_threads(1)
from rl_transformers.backbone import Backbone, BackboneConfig
from rl_transformers.backbone.context import ForwardContext
name, L, heads, batch, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
cfg = BackboneConfig(d_model=64 * heads, n_layers=1, n_heads=heads, position="none", causal=True, attention=name)
att = Backbone(cfg).eval().depth.blocks[0].attention
if hasattr(att, "dense_chunks"):
    att.dense_chunks = 0
g = torch.Generator().manual_seed(0)
q = torch.randn(batch, heads, L, 64, generator=g)
v = torch.randn(batch, heads, L, 64, generator=g)
pos = torch.arange(L).expand(batch, L)
valid = torch.ones(batch, L, dtype=torch.bool)
ctx = ForwardContext(pos=pos, valid=valid, causal=True)
def forward():
    with torch.no_grad():
        att.attend(q, q, v, pos, pos, valid, ctx)
def forward_backward():
    qq, vv = q.clone().requires_grad_(), v.clone().requires_grad_()
    att.attend(qq, qq, vv, pos, pos, valid, ctx).sum().backward()
out = {}
for key, fn in (("forward", forward), ("forward_backward", forward_backward)):
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter(); fn(); times.append(time.perf_counter() - t)
    out[key] = sorted(times)[len(times) // 2]
print(json.dumps(out))
"""

CHILD_PPO = r"""
import dataclasses, json, sys, warnings, torch
warnings.simplefilter("ignore")
from rl_transformers.algos.ppo_config import TrainConfig
from rl_transformers.algos.throughput import measure_throughput
from rl_transformers.backbone import registry
name, updates, warmup, compile_ = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
cfg = TrainConfig(threads=1, num_envs=32, eval_every=0, progress=False)
kinds = registry.get("attention", name).cls.position_kinds
position = cfg.policy.backbone.position if "scores" in kinds else "rope"
backbone = cfg.policy.backbone.replace(attention=name, position=position)
cfg = dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, backbone=backbone))
if compile_:
    cfg = dataclasses.replace(cfg, compile=True)
print(json.dumps(measure_throughput(cfg, updates, warmup)))
"""


@dataclass(frozen=True)
class Args:
    commit: str
    """The commit to compare with (any git revision)."""
    attention: str
    """A registered attention name."""
    length: int = 4096
    """Sequence length L."""
    heads: int = 4
    """Heads H (head dim 64)."""
    batch: int = 2
    """Batch B."""
    repeats: int = 3
    """Timed calls per process (after one warm-up); the median is kept."""
    rounds: int = 2
    """Alternating rounds (commit, today) of fresh processes."""
    target: Literal["kernel", "ppo"] = "kernel"
    """kernel: ``attention.attend`` alone; ppo: whole PPO updates of the GTrXL policy with this attention."""
    compile: bool = False
    """ppo: also time today's tree with --compile in every round."""
    updates: int = 5
    """ppo: timed updates per process."""
    warmup: int = 2
    """ppo: untimed updates first (compilation happens here)."""


def _time(tree: Path, args: Args, compile_: bool = False) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-c", CHILD, args.attention, str(args.length), str(args.heads), str(args.batch),
            str(args.repeats)]  # fmt: skip
    if args.target == "ppo":
        argv = [sys.executable, "-c", CHILD_PPO, args.attention, str(args.updates), str(args.warmup),
                "1" if compile_ else "0"]  # fmt: skip
    done = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-4:])
        raise UserError(f"timing {args.attention!r} in {tree} failed:\n{tail}", source="--attention")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main_args(args: Args) -> int:
    names = available()["attention"]
    if args.attention not in names:
        raise UserError(f"unknown attention {args.attention!r}; {choice_hint(args.attention, names)}",
                        source="--attention")  # fmt: skip
    runs: dict[str, list[dict[str, float]]] = {"commit": [], "today": []}
    with commit_tree(ROOT, args.commit) as tree:
        for _ in range(args.rounds):
            runs["commit"].append(_time(tree, args))
            runs["today"].append(_time(ROOT, args))
            if args.target == "ppo" and args.compile:
                runs.setdefault("today_compiled", []).append(_time(ROOT, args, compile_=True))
    if args.target == "ppo":
        return _report_ppo(args, runs)
    print(f"{args.attention}, L = {args.length}, B = {args.batch}, H = {args.heads}, D = 64, 1 thread; "
          f"medians of {args.repeats} calls per round, {args.rounds} rounds (commit {args.commit} / today):")  # fmt: skip
    for key in ("forward", "forward_backward"):
        old = [r[key] for r in runs["commit"]]
        new = [r[key] for r in runs["today"]]
        ratio = statistics.median(new) / statistics.median(old)
        print(f"  {key}: {' '.join(f'{x * 1e3:.2f}' for x in old)} ms / {' '.join(f'{x * 1e3:.2f}' for x in new)} ms, "
              f"today / commit = {ratio:.2f}")  # fmt: skip
    return 0


def _report_ppo(args: Args, runs: dict[str, list[dict[str, float]]]) -> int:
    print(f"PPO, GTrXL with {args.attention}, 32 envs, 1 thread; env steps/s over {args.updates} updates after "
          f"{args.warmup} warm-up, {args.rounds} rounds (commit {args.commit} / today):")  # fmt: skip
    for key in ("steps_per_s", "rollout_steps_per_s", "train_steps_per_s"):
        base = statistics.median(r[key] for r in runs["commit"])
        line = f"  {key}: commit {' '.join(f'{r[key]:.0f}' for r in runs['commit'])}"
        for side in ("today", "today_compiled"):
            if side in runs:
                figure = statistics.median(r[key] for r in runs[side])
                line += f"; {side} {' '.join(f'{r[key]:.0f}' for r in runs[side])} ({figure / base:.2f}x)"
        print(line)
    return 0


def main() -> int:
    return run_cli(lambda: main_args(tyro.cli(Args, description=__doc__)))


if __name__ == "__main__":
    sys.exit(main())
