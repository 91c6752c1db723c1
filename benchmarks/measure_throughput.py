"""Measure PPO throughput (env steps / s): rollouts alone and whole updates (rollout + training).

    python benchmarks/measure_throughput.py                         # default GTrXL config, 1 thread
    python benchmarks/measure_throughput.py --threads 2 --num-envs 32
    python benchmarks/measure_throughput.py --policy lstm
    python benchmarks/measure_throughput.py --all-attentions --backbone.memory None --backbone.position rope

Takes every training flag of train_gtrxl.py (--backbone.*, --ppo.*, --env-id ...). Prints one JSON line with the
policy's parameter count.

``--all-attentions`` (or ``--attentions a b ...``) measures every registered attention with the same flags
(only the attention changes; one fresh process each, one at a time; benchmarks/studies/ppo_throughput.py) and
writes <out>/results.json and results.md: env steps/s, ratio to ``full``, parameters, command, git SHA, machine.
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import tyro

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a file: benchmarks/ (not installed) imports from the checkout's root
    sys.path.insert(0, str(ROOT))

from rl_transformers.algos.ppo_config import TrainConfig  # noqa: E402
from rl_transformers.algos.ppo_sizing import match_run_config  # noqa: E402
from rl_transformers.algos.throughput import measure_throughput  # noqa: E402
from rl_transformers.backbone.cli import cli_registry  # noqa: E402
from rl_transformers.utils.errors import UserError, closest  # noqa: E402

DEFAULT_OUT = Path("benchmarks/results/ppo_throughput")


@dataclass(frozen=True)
class Args:
    config: Annotated[TrainConfig, tyro.conf.arg(name="")]
    """Training configuration to measure."""
    updates: int = 5
    """Measured PPO updates."""
    warmup: int = 1
    """Unmeasured updates first (memory warm-up, allocator)."""
    all_attentions: bool = False
    """Measure every registered attention (same flags otherwise) and write the table to --out."""
    attentions: tuple[str, ...] = ()
    """Measure only these attentions (implies the table; ``full`` is always measured for the ratio)."""
    rounds: int = 1
    """With a table: measure the whole list this many times (rotated order) and keep medians."""
    out: Path = DEFAULT_OUT
    """Directory of the table (results.json, results.md)."""


def table(args: Args) -> None:
    from benchmarks.studies import ppo_throughput
    from rl_transformers.backbone import available
    from rl_transformers.runs.provenance import machine_info

    registered = list(available()["attention"])
    names = list(args.attentions) or registered
    for name in names:
        if name not in registered:
            hint = closest(name, registered)
            raise UserError(
                f"unknown attention {name!r}{f' (did you mean {hint!r}?)' if hint else ''}; "
                f"registered: {registered}",
                source="--attentions",
            )
    if args.config.policy.kind != "transformer":
        raise UserError(f"--all-attentions needs --policy transformer, got {args.config.policy.kind!r}")
    cfg = args.config
    machine = machine_info("cpu" if cfg.device in ("auto", "cpu") else cfg.device, cfg.threads)
    result = ppo_throughput.run(cfg, names, args.updates, args.warmup, args.rounds)
    command = shlex.join(["python", "benchmarks/measure_throughput.py", *sys.argv[1:]])
    report = ppo_throughput.build_report(
        result, cfg, command, args.updates, args.warmup, args.rounds, machine=machine
    )
    ppo_throughput.write(report, args.out)
    print(f"{len(report['rows'])} attentions -> {args.out}/results.json, results.md")


def main() -> None:
    args = tyro.cli(
        Args, registry=cli_registry(), default=Args(TrainConfig(progress=False)), description=__doc__
    )
    if args.all_attentions or args.attentions:
        table(args)
        return
    config = match_run_config(args.config)  # --policy lstm|gru|mlp: the width a training run would get
    result = measure_throughput(config, args.updates, args.warmup)
    print(json.dumps({"env_id": args.config.env_id, **{k: round(v, 1) for k, v in result.items()}}))


if __name__ == "__main__":
    main()
