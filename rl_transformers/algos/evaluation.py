"""Policy evaluation shared by the trainers, ``scripts/evaluate.py`` and the Python API (SB3's
``common/evaluation.py`` role).

:func:`evaluate_policy` plays a memory policy (PPO's actor-critic) in a vector env and returns the undiscounted
returns and lengths of a fixed number of episodes (each env runs its share); :func:`evaluate_episodes` also
returns their success flags where the env reports one (SB3's ``is_success``, or ``success``); :func:`evaluate_dt` rolls out a
Decision Transformer for each target return with deterministic actions, episode i reset with ``seed + i``.
Envs come from :mod:`rl_transformers.algos.env_util`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from rl_transformers.algos.env_util import make_env_thunk, make_vec_env, video_unavailable
from rl_transformers.algos.rollout import reset_loop
from rl_transformers.policies.actor_critic import ActorCritic
from rl_transformers.policies.decision_transformer import DecisionTransformer
from rl_transformers.policies.dt_rollout import DTAgent
from rl_transformers.policies.encoders import obs_to_tensor

__all__ = ["EpisodeStats", "EvalResult", "evaluate_dt", "evaluate_episodes", "evaluate_policy"]


@dataclass
class EpisodeStats:
    """Per evaluated episode: undiscounted return, length, and success (1.0 / 0.0; NaN where the env reported
    none); ``successes`` is None when no episode reported one."""

    returns: np.ndarray
    lengths: np.ndarray
    successes: np.ndarray | None

    @property
    def success_rate(self) -> float | None:
        """Fraction of successful episodes (an episode without a report counts as a failure, like the DT's)."""
        return None if self.successes is None else float(np.nan_to_num(self.successes, nan=0.0).mean())


def final_success(infos: dict[str, Any], i: int) -> float:
    """:func:`success_flag` of env ``i``'s finished episode in a ``SAME_STEP`` vector env's step infos (its
    ``final_info``); NaN when that env reported none."""
    final = infos.get("final_info")
    if not isinstance(final, dict):
        return float("nan")
    for key in ("is_success", "success"):
        if key in final and bool(final.get(f"_{key}", np.ones(i + 1, dtype=bool))[i]):
            return float(bool(final[key][i]))
    return float("nan")


def evaluate_policy(
    policy: ActorCritic,
    env_id: str,
    env_kwargs: dict[str, Any] | None,
    n_episodes: int,
    seed: int,
    seq_len: int,
    deterministic: bool = True,
    device: torch.device | str = "cpu",
    num_envs: int | None = None,
    video_dir: str | None = None,
    allow_env_modules: Sequence[str] = (),
) -> tuple[np.ndarray, np.ndarray]:
    """Undiscounted returns and lengths of ``n_episodes`` episodes (:func:`evaluate_episodes`, whose
    arguments these are)."""
    stats = evaluate_episodes(
        policy, env_id, env_kwargs, n_episodes, seed, seq_len, deterministic, device, num_envs, video_dir,
        allow_env_modules,
    )  # fmt: skip
    return stats.returns, stats.lengths


def evaluate_episodes(
    policy: ActorCritic,
    env_id: str,
    env_kwargs: dict[str, Any] | None,
    n_episodes: int,
    seed: int,
    seq_len: int,
    deterministic: bool = True,
    device: torch.device | str = "cpu",
    num_envs: int | None = None,
    video_dir: str | None = None,
    allow_env_modules: Sequence[str] = (),
) -> EpisodeStats:
    """Undiscounted returns, lengths and success flags of ``n_episodes`` episodes (each env runs its share, so
    short episodes are not over-represented). ``seq_len``: the training window (context cores are trimmed on that grid).
    ``video_dir``: record every episode with ``gymnasium.wrappers.RecordVideo`` (one env; see
    :func:`video_unavailable`). The env id is resolved by :func:`envs.resolve.resolve_env`
    (``allow_env_modules``: the ``--allow-env-modules`` flag)."""
    if video_dir is not None:
        reason = video_unavailable(env_id, env_kwargs, allow_env_modules)
        if reason is not None:
            raise RuntimeError(f"cannot record video: {reason}")
        base = make_env_thunk(
            env_id, env_kwargs, render_mode="rgb_array", allow_env_modules=allow_env_modules
        )

        def thunk() -> gym.Env:  # the autoreset after the last episode starts no (n + 1)-th one-frame video
            return gym.wrappers.RecordVideo(
                base(), video_dir, episode_trigger=lambda episode: episode < n_episodes, disable_logger=True
            )

        envs: gym.vector.VectorEnv = gym.vector.SyncVectorEnv([thunk], autoreset_mode=AutoresetMode.SAME_STEP)
    else:
        envs = make_vec_env(
            env_id, num_envs or min(n_episodes, 8), env_kwargs, allow_env_modules=allow_env_modules
        )
    n = envs.num_envs
    targets = np.array([n_episodes // n + (1 if i < n_episodes % n else 0) for i in range(n)])
    counts = np.zeros(n, dtype=np.int64)
    returns: list[float] = []
    lengths: list[int] = []
    successes: list[float] = []
    was_training = policy.training
    policy.eval()
    try:
        loop = reset_loop(envs, policy, seed, device)
        obs, starts, state = loop.obs, loop.episode_start, loop.policy_state
        ep_return, ep_length = loop.ep_return, loop.ep_length
        with torch.inference_mode():  # the memory's key / value projections cached, as in the rollout
            state = policy.acting_state(state)
        step = 0
        while (counts < targets).any():
            with torch.inference_mode():
                if step % seq_len == 0:
                    state = policy.segment_start(state)
                out = policy.act(obs, state, starts, deterministic=deterministic)
            next_obs, reward, terminated, truncated, infos = envs.step(policy.to_env(out.action))
            done = terminated | truncated
            ep_return += reward
            ep_length += 1
            for i in np.flatnonzero(done):
                if counts[i] < targets[i]:
                    returns.append(float(ep_return[i]))
                    lengths.append(int(ep_length[i]))
                    successes.append(final_success(infos, int(i)))
                    counts[i] += 1
            ep_return[done] = 0.0
            ep_length[done] = 0
            obs = obs_to_tensor(next_obs, envs.single_observation_space, device)
            starts = torch.as_tensor(done, device=device)
            state = out.state
            step += 1
    finally:
        envs.close()
        policy.train(was_training)
    flags = np.asarray(successes, dtype=np.float64)
    return EpisodeStats(np.asarray(returns), np.asarray(lengths), None if np.isnan(flags).all() else flags)


# -- Decision Transformer --------------------------------------------------------------------------------
@dataclass
class EvalResult:
    """Returns and lengths of the evaluation episodes of one target, and their success flags where the env
    reports one (the last step's ``info["is_success"]``, SB3's key, or ``info["success"]``; else None)."""

    target: float | None
    returns: np.ndarray
    lengths: np.ndarray
    successes: np.ndarray | None = None


def evaluate_dt(
    model: DecisionTransformer,
    make_env: Callable[[], gym.Env],
    targets: Sequence[float | None],
    n_episodes: int,
    seed: int,
    num_envs: int = 10,
    max_steps: int | None = None,
    envs: list[gym.Env] | None = None,
) -> list[EvalResult]:
    """Roll out ``model`` (deterministic actions) for ``n_episodes`` per target; episode i resets with seed + i.

    Episodes run in chunks of ``num_envs`` envs stepped together through one :class:`DTAgent`. An episode
    ends at termination / truncation or after ``max_steps`` steps (for envs without a time limit).
    """
    was_training = model.training
    own = envs is None
    envs = envs if envs is not None else [make_env() for _ in range(max(1, min(num_envs, n_episodes)))]
    results = []
    try:
        for target in targets:
            returns = np.zeros(n_episodes)
            lengths = np.zeros(n_episodes, dtype=np.int64)
            successes = np.full(n_episodes, np.nan)
            for first in range(0, n_episodes, len(envs)):
                ids = list(range(first, min(n_episodes, first + len(envs))))
                n = len(ids)
                agent = DTAgent(model, n, target)
                obs = np.stack([np.asarray(envs[j].reset(seed=seed + i)[0]) for j, i in enumerate(ids)])
                alive = np.ones(n, dtype=bool)
                while alive.any():
                    actions = agent.act(obs)
                    rewards = np.zeros(n)
                    for j in np.flatnonzero(alive):
                        action = actions[j] if not model.discrete_actions else int(actions[j])
                        ob, r, terminated, truncated, info = envs[j].step(action)
                        obs[j] = np.asarray(ob)
                        rewards[j] = float(r)
                        returns[ids[j]] += float(r)
                        lengths[ids[j]] += 1
                        if (
                            terminated
                            or truncated
                            or (max_steps is not None and lengths[ids[j]] >= max_steps)
                        ):
                            alive[j] = False
                            successes[ids[j]] = success_flag(info)
                    agent.observe(rewards)
            known = None if np.isnan(successes).all() else successes
            results.append(EvalResult(target, returns, lengths, known))
    finally:
        if own:
            for env in envs:
                env.close()
        model.train(was_training)
    return results


def success_flag(info: dict) -> float:
    """1.0 / 0.0 from an episode's last ``info`` (``is_success``, as SB3 reads it, else ``success``); NaN when
    the env reports neither."""
    for key in ("is_success", "success"):
        if key in info and info[key] is not None:
            return float(bool(info[key]))
    return float("nan")
