"""Evaluate a PPO checkpoint: mean ± std return over N episodes, optionally recording videos.

python scripts/evaluate.py runs/ppo/rlt-TMaze-v0/<run>/            # last.pt of a run
python scripts/evaluate.py runs/ppo/.../checkpoints/best.pt --episodes 100 --stochastic
python scripts/evaluate.py <run> --video-dir videos/               # needs rgb_array rendering + moviepy
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tyro

from rl_transformers.algos.ppo import load_policy
from rl_transformers.algos.rollout import evaluate_policy, video_unavailable
from rl_transformers.backbone.options import check_int
from rl_transformers.utils import set_threads
from rl_transformers.utils.checks import check_device, check_device_available
from rl_transformers.utils.errors import run_cli


@dataclass(frozen=True)
class EvalArgs:
    checkpoint: tyro.conf.Positional[str]
    """Checkpoint file, or a run directory (its checkpoints/last.pt)."""
    episodes: int = 20
    """Number of evaluation episodes."""
    stochastic: bool = False
    """Sample actions instead of taking the most likely one."""
    seed: int = 12345
    """Seed of the evaluation envs."""
    num_envs: int = 8
    """Parallel evaluation envs (1 when recording video)."""
    device: str = "cpu"
    """torch device."""
    threads: int | None = 1
    """torch CPU threads (1 is fastest for small policies; None = all cores)."""
    video_dir: str | None = None
    """Record every episode to this folder (gymnasium RecordVideo)."""

    def __post_init__(self) -> None:
        check_int("episodes (--episodes)", self.episodes, 1)
        check_int("num_envs (--num-envs)", self.num_envs, 1)
        check_int("threads (--threads)", self.threads, 1, optional=True)
        check_device(self.device)
        if self.device != "auto":
            check_device_available(self.device)


def main() -> None:
    args = tyro.cli(EvalArgs, description=__doc__)
    set_threads(args.threads)
    policy, cfg = load_policy(args.checkpoint, args.device)
    video_dir = args.video_dir
    if video_dir is not None and (reason := video_unavailable(cfg.env_id, cfg.env_kwargs)) is not None:
        print(f"not recording video: {reason}")
        video_dir = None
    returns, lengths = evaluate_policy(
        policy,
        cfg.env_id,
        cfg.env_kwargs,
        args.episodes,
        seed=args.seed,
        seq_len=cfg.ppo.seq_len,
        deterministic=not args.stochastic,
        device=args.device,
        num_envs=min(args.num_envs, args.episodes),
        video_dir=video_dir,
    )
    print(
        f"{cfg.env_id}: return {returns.mean():.3f} ± {returns.std():.3f} over {len(returns)} episodes "
        f"(length {np.mean(lengths):.1f}; {'stochastic' if args.stochastic else 'greedy'} actions)"
    )
    if video_dir is not None:
        print(f"videos in {video_dir}")


if __name__ == "__main__":
    run_cli(main)
