"""Evaluate a finished PPO or DT run: mean ± std return over N episodes, per-episode JSON, optional video.

    python scripts/evaluate.py runs/ppo/rlt-TMaze-v0/<run>/             # last.pt; the trainer's eval seeds
    python scripts/evaluate.py runs/ppo/.../<run> --checkpoint best --episodes 100 --stochastic
    python scripts/evaluate.py runs/dt/<dataset>/<run> --target-return 3600 1800
    python scripts/evaluate.py <run> --video videos/                    # needs rgb_array frames + moviepy
    python scripts/evaluate.py <run> --allow-env-modules my_envs        # a run whose env comes from my_envs

Defaults repeat the trainer's own evaluation of that checkpoint (same seeds, episodes, envs, targets), so the
result matches what the run logged. Per-episode returns go to <run>/eval/evaluate-<checkpoint>.json
(--output to choose), written atomically.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import tyro

from rl_transformers.agents.evaluate import default_output, evaluate_agent
from rl_transformers.agents.load import load
from rl_transformers.backbone.options import check_int
from rl_transformers.runs.config import check_module_names
from rl_transformers.utils.atomic import atomic_write_json
from rl_transformers.utils.checks import check_device, check_device_available
from rl_transformers.utils.errors import run_cli
from rl_transformers.utils.training import set_threads


@dataclass(frozen=True)
class EvalArgs:
    run: tyro.conf.Positional[str]
    """Run directory (its checkpoints/last.pt, or best.pt with --checkpoint best) or a checkpoint file."""
    checkpoint: Literal["last", "best"] = "last"
    """Which checkpoint of a run directory."""
    episodes: int | None = None
    """Episodes (per target for DT). Default: the run's --eval-episodes."""
    seed: int | None = None
    """Seed of episode 0. Default: the trainer's evaluation seed for this checkpoint."""
    num_envs: int | None = None
    """Envs stepped together. Default: the trainer's (PPO min(episodes, 8), DT --eval-envs)."""
    stochastic: bool = False
    """PPO: sample actions instead of taking the most likely one."""
    target_return: tuple[float, ...] = ()
    """DT: target returns (several allowed). Default: the run's targets."""
    env_id: str | None = None
    """DT: evaluate on this env (as registered here) instead of the one the run recorded: restates the task
    knowingly. Without it a DT run is evaluated on exactly the env spec it recorded, or refused."""
    allow_env_modules: tuple[str, ...] = ()
    """Modules whose environments the run (env id, dataset env spec) may name beyond gymnasium, envs, popgym,
    minigrid (envs/resolve.py); allowing a module trusts its code. Never read from the run's files."""
    max_memory_gib: float | None = None
    """Largest memory estimate accepted for the model a checkpoint's config describes (default 4 GiB; sizes read
    from a file are bounded before anything is built): raise it knowingly for a model that really is large."""
    video: Annotated[str | None, tyro.conf.arg(aliases=("--video-dir",))] = None
    """Record every episode into this folder (gymnasium RecordVideo; rgb_array env + moviepy)."""
    output: str | None = None
    """Per-episode JSON. Default: <run>/eval/evaluate-<checkpoint>.json."""
    device: str = "cpu"
    """torch device."""
    threads: int | None = 1
    """torch CPU threads (1 is fastest for small policies; None = all cores)."""

    def __post_init__(self) -> None:
        check_int("episodes (--episodes)", self.episodes, 1, optional=True)
        check_int("num_envs (--num-envs)", self.num_envs, 1, optional=True)
        check_int("threads (--threads)", self.threads, 1, optional=True)
        check_device(self.device)
        check_module_names(self.allow_env_modules)
        if self.device != "auto":
            check_device_available(self.device)


def main() -> None:
    """Parse ``sys.argv`` into :class:`EvalArgs`, load the run, evaluate it, print and write the report."""
    args = tyro.cli(EvalArgs, description=__doc__)
    set_threads(args.threads)
    agent = load(
        args.run,
        args.device,
        checkpoint=args.checkpoint,
        env_id=args.env_id,
        allow_env_modules=args.allow_env_modules,
        max_memory_gib=args.max_memory_gib,
    )
    path = (
        Path(args.output) if args.output else default_output(agent.checkpoint)
    )  # refused links: before the work
    report = evaluate_agent(
        agent,
        episodes=args.episodes,
        seed=args.seed,
        num_envs=args.num_envs,
        deterministic=not args.stochastic,
        targets=args.target_return,
        video_dir=args.video,
    )
    for line in report.lines():
        print(line)
    print(f"episodes written to {atomic_write_json(path, report.to_json())}")
    if args.video is not None:
        print(f"videos in {args.video}")


def command() -> int:
    """``rlt evaluate`` / ``scripts/evaluate.py``: :func:`main` on ``sys.argv``, user errors as one line."""
    run_cli(main)
    return 0
