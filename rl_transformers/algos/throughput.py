"""PPO throughput: environment steps per second of rollouts alone and of whole updates (rollout + training).

Used by ``scripts/measure_throughput.py`` and the benchmark package (:mod:`rl_transformers.bench`); it times
the trainer's own :func:`~rl_transformers.algos.rollout.collect_rollout` and
:meth:`~rl_transformers.algos.ppo.PPOTrainer.train_epochs` after warm-up updates, without a run directory.
"""

from __future__ import annotations

import time

import torch

from rl_transformers.algos.ppo import PPOTrainer
from rl_transformers.algos.ppo_config import TrainConfig
from rl_transformers.algos.rollout import collect_rollout
from rl_transformers.runs.distributed import DistContext, resolve_device
from rl_transformers.utils.training import available_cores, set_threads

__all__ = ["measure_throughput"]


def measure_throughput(cfg: TrainConfig, updates: int = 5, warmup: int = 1) -> dict[str, float]:
    """Env steps per second of rollouts alone and of whole PPO updates (rollout + training), after warm-up.

    ``steps_per_cpu_s`` divides by the process's CPU time (all its threads) over the timed updates instead of
    wall time: with one thread on an idle machine the two agree; under load the CPU figure moves less.
    """
    set_threads(cfg.threads or available_cores())
    trainer = PPOTrainer(cfg, device=resolve_device(cfg.device, DistContext()))
    ppo = cfg.ppo
    rollout_s = train_s = cpu_s = 0.0
    try:
        for i in range(warmup + updates):
            c0, t0 = time.process_time(), time.perf_counter()
            trainer.loop, _ = collect_rollout(
                trainer.policy, trainer.envs, trainer.storage, trainer.loop, ppo.gamma, ppo.gae_lambda
            )
            t1 = time.perf_counter()
            trainer.train_epochs()
            t2, c2 = time.perf_counter(), time.process_time()
            if i >= warmup:
                rollout_s += t1 - t0
                train_s += t2 - t1
                cpu_s += c2 - c0
    finally:
        trainer.close()
    steps = updates * trainer.batch_size
    return {
        "rollout_steps_per_s": steps / rollout_s,
        "train_steps_per_s": steps / train_s,
        "steps_per_s": steps / (rollout_s + train_s),
        "steps_per_cpu_s": steps / cpu_s,
        "threads": float(torch.get_num_threads()),
        "num_envs": float(cfg.num_envs),
        "parameters": float(sum(p.numel() for p in trainer.policy.parameters())),
    }
