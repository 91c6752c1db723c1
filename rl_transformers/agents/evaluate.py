"""Evaluate a finished run, PPO or DT alike: returns over N episodes, per-episode JSON, optional video.

Defaults reproduce the trainer's own evaluation of the checkpoint: PPO uses the seed its trainer used at that
update (``seed + 100_003 + update``), ``eval_episodes`` episodes over ``min(episodes, 8)`` envs, greedy
actions, so the mean equals the ``eval/mean_reward`` logged for that step; DT uses ``eval_seed`` (episode i
resets with ``eval_seed + i``), ``eval_episodes`` and the run's targets, as ``eval/step_<n>.json``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from rl_transformers.agents.dt_agent import DecisionTransformerAgent
from rl_transformers.agents.ppo_agent import PPOAgent
from rl_transformers.runs.lifecycle import run_dir_of
from rl_transformers.runs.paths import run_subdir
from rl_transformers.utils.errors import UserError


@dataclass
class TargetResult:
    target: float | None
    """DT target return (None for PPO and BC)."""
    returns: list[float]
    lengths: list[int]

    @property
    def mean(self) -> float:
        return float(np.mean(self.returns))

    @property
    def std(self) -> float:
        return float(np.std(self.returns))


@dataclass
class EvaluationReport:
    algo: str
    env_id: str | None
    checkpoint: str
    step: int | None
    seed: int
    deterministic: bool
    results: list[TargetResult] = field(default_factory=list)

    def lines(self) -> list[str]:
        """One human line per target: mean ± std, episodes, mean length."""
        mode = "greedy" if self.deterministic else "stochastic"
        out = []
        for r in self.results:
            target = "" if r.target is None else f" at target {r.target:g}"
            out.append(
                f"{self.env_id}{target}: return {r.mean:.3f} ± {r.std:.3f} over {len(r.returns)} episodes "
                f"(length {np.mean(r.lengths):.1f}; {mode} actions; seed {self.seed})"
            )
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "algo": self.algo,
            "env_id": self.env_id,
            "checkpoint": self.checkpoint,
            "step": self.step,
            "seed": self.seed,
            "deterministic": self.deterministic,
            "results": [
                {"target": r.target, "mean": r.mean, "std": r.std, "returns": r.returns, "lengths": r.lengths}
                for r in self.results
            ],
        }


def check_video(render_modes: Sequence[str], env_id: str | None) -> None:
    """Raise a clear :class:`UserError` when episodes cannot be recorded as video."""
    if importlib.util.find_spec("moviepy") is None:
        raise UserError("--video needs moviepy (gymnasium's RecordVideo writes with it): pip install moviepy")
    if "rgb_array" not in render_modes:
        raise UserError(
            f"--video: {env_id} does not render rgb_array frames (render_modes={list(render_modes)})"
        )


def evaluate_agent(
    agent: PPOAgent | DecisionTransformerAgent,
    episodes: int | None = None,
    seed: int | None = None,
    num_envs: int | None = None,
    deterministic: bool = True,
    targets: Sequence[float] | None = None,
    video_dir: str | Path | None = None,
) -> EvaluationReport:
    """Evaluate ``agent`` (see the module docstring for the defaults)."""
    if isinstance(agent, PPOAgent):
        if targets:
            raise UserError("--target-return applies to DT runs; a PPO policy takes no target")
        return _evaluate_ppo(agent, episodes, seed, num_envs, deterministic, video_dir)
    if not deterministic:
        raise UserError(
            "--stochastic applies to PPO runs; a DT run acts with the model's deterministic action"
        )
    return _evaluate_dt(agent, episodes, seed, num_envs, targets, video_dir)


def _evaluate_ppo(
    agent: PPOAgent,
    episodes: int | None,
    seed: int | None,
    num_envs: int | None,
    deterministic: bool,
    video_dir: str | Path | None,
) -> EvaluationReport:
    n = episodes or agent.config.eval_episodes
    seed = agent.trainer_eval_seed() if seed is None else seed
    if video_dir is not None:
        env = agent.make_env()
        modes = env.metadata.get("render_modes", [])
        env.close()
        check_video(modes, agent.env_id)
    returns, lengths = agent.evaluate(
        n,
        seed=seed,
        deterministic=deterministic,
        num_envs=min(num_envs or 8, n),
        video_dir=None if video_dir is None else str(video_dir),
    )
    result = TargetResult(None, [float(r) for r in returns], [int(x) for x in lengths])
    return EvaluationReport(
        "ppo", agent.env_id, str(agent.checkpoint), agent.step, seed, deterministic, [result]
    )


def _evaluate_dt(
    agent: DecisionTransformerAgent,
    episodes: int | None,
    seed: int | None,
    num_envs: int | None,
    targets: Sequence[float] | None,
    video_dir: str | Path | None,
) -> EvaluationReport:
    cfg = agent.config
    n = episodes or cfg.eval_episodes or 10
    seed = cfg.eval_seed if seed is None else seed
    chosen: list[float | None] = list(targets) if targets else agent.default_targets()
    if targets and not agent.model.condition_on_return:
        raise UserError(f"this is a {cfg.algo} run (not return-conditioned): it takes no --target-return")
    results = []
    if video_dir is None:
        evals = agent.evaluate(chosen, n, seed, num_envs=num_envs or cfg.eval_envs)
    else:
        evals = _evaluate_dt_video(agent, chosen, n, seed, Path(video_dir))
    for res in evals:
        results.append(TargetResult(res.target, res.returns.tolist(), [int(x) for x in res.lengths]))
    return EvaluationReport(cfg.algo, agent.env_id, str(agent.checkpoint), agent.step, seed, True, results)


def _evaluate_dt_video(
    agent: DecisionTransformerAgent, targets: list[float | None], n: int, seed: int, video_dir: Path
) -> list[Any]:
    """The trainer's DT evaluation with one env wrapped in RecordVideo per target (episode i: seed + i)."""
    from rl_transformers.algos.evaluation import evaluate_dt as evaluate

    make_env = agent.make_env_factory()
    probe = make_env()
    limited = probe.spec is not None and probe.spec.max_episode_steps is not None
    check_video(probe.metadata.get("render_modes", []), agent.env_id)
    probe.close()
    out = []
    for target in targets:
        prefix = "bc" if target is None else f"target{target:g}"
        env = gym.wrappers.RecordVideo(
            make_env(render_mode="rgb_array"),
            str(video_dir),
            episode_trigger=lambda _: True,
            name_prefix=prefix,
            disable_logger=True,
        )
        max_steps = None if limited else agent.model.max_ep_len
        out += evaluate(agent.model, make_env, [target], n, seed, max_steps=max_steps, envs=[env])
        env.close()
    return out


def default_output(checkpoint: Path | None) -> Path:
    """``<run>/eval/evaluate-<checkpoint name>.json``; an ``eval`` that is a symbolic link out of the run is
    refused (:class:`~rl_transformers.runs.paths.RunDirError`), never written through."""
    if checkpoint is None:
        raise UserError("give --output: the agent has no run directory")
    return run_subdir(run_dir_of(checkpoint), "eval", create=False) / f"evaluate-{checkpoint.stem}.json"


__all__ = ["EvaluationReport", "TargetResult", "default_output", "evaluate_agent"]
