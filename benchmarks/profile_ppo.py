"""Profile one PPO rollout and one training pass (torch.profiler, self CPU time per operator; method:
benchmarks/studies/ppo_profile.py). Run it on an idle machine.

    python benchmarks/profile_ppo.py                                     # the default GTrXL on T-Maze, 1 thread
    python benchmarks/profile_ppo.py --out benchmarks/results/ppo_fast/profile
    python benchmarks/profile_ppo.py --backbone.attention gaussian_prior --top 20
    python benchmarks/profile_ppo.py --shapes-of aten::copy_ aten::cat    # which tensors the copies move

Takes every training flag of train_gtrxl.py. Writes <out>/profile.json and profile.md (with the command, git
commit and machine) when --out is given; prints the tables.
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

from benchmarks.studies.ppo_profile import profile_ppo, render  # noqa: E402
from rl_transformers.algos.ppo_config import TrainConfig  # noqa: E402
from rl_transformers.backbone.cli import cli_registry  # noqa: E402
from rl_transformers.backbone.options import check_int  # noqa: E402
from rl_transformers.runs.provenance import finish_machine_info, machine_info  # noqa: E402
from rl_transformers.utils.atomic import atomic_write_text  # noqa: E402
from rl_transformers.utils.errors import run_cli  # noqa: E402


@dataclass(frozen=True)
class Args:
    config: Annotated[TrainConfig, tyro.conf.arg(name="")]
    """Training configuration to profile."""
    warmup: int = 2
    """Whole updates before the profiled rollout and training pass."""
    top: int = 12
    """Operators listed per phase (the rest summed in one row)."""
    out: Path | None = None
    """Directory for profile.json and profile.md (default: print only)."""
    shapes_of: tuple[str, ...] = ()
    """Operators whose time is also split by input shape (e.g. aten::copy_ aten::cat): which tensors they move."""

    def __post_init__(self) -> None:
        check_int("warmup (--warmup)", self.warmup, 1)
        check_int("top (--top)", self.top, 1)


def main(args: Args) -> None:
    cfg = args.config
    machine = machine_info("cpu", cfg.threads or 1)
    result = profile_ppo(cfg, args.warmup, args.top, args.shapes_of)
    command = shlex.join(["python", "benchmarks/profile_ppo.py", *sys.argv[1:]])
    info = finish_machine_info(machine)
    header = [
        "# PPO profile: self CPU time per operator",
        "",
        f"Command: `{command}`",
        "",
        f"- config: env {cfg.env_id}, {cfg.num_envs} envs, {result['parameters']:,} parameters, "
        f"{result['threads']} thread(s), {args.warmup} warm-up updates",
        f"- machine: {info.get('device_name', '?')} · {info.get('cores', '?')} cores · torch {info.get('torch_version', '?')} · "
        f"git {info.get('git_sha', '?')} · load at start {info.get('loadavg_start', '?')}, at end "
        f"{info.get('loadavg_end', '?')} ({info.get('timestamp', '?')})",
    ]
    text = render(result, header)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        report = {"command": command, "machine": info, **result}
        atomic_write_text(args.out / "profile.json", json.dumps(report, indent=1, sort_keys=True) + "\n")
        atomic_write_text(args.out / "profile.md", text)


if __name__ == "__main__":
    run_cli(lambda: main(tyro.cli(Args, description=__doc__, registry=cli_registry())))
