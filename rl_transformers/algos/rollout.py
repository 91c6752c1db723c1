"""The rollout loop of PPO: step a vector env with the policy, fill the rollout storage, bootstrap truncations
(storage and GAE: :mod:`~rl_transformers.algos.storage`; env construction:
:mod:`~rl_transformers.algos.env_util`; evaluation: :mod:`~rl_transformers.algos.evaluation`).

Vector envs run with Gymnasium's ``SAME_STEP`` autoreset: the observation returned at an episode end is
already the next episode's first one and the final observation is in ``info["final_obs"]``; it is evaluated
with the pre-reset policy state to bootstrap truncations.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, cast

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector.utils import concatenate, create_empty_array
from torch import Tensor

from rl_transformers.algos.reward_norm import RewardNorm
from rl_transformers.algos.storage import RolloutStorage
from rl_transformers.backbone.state import State, cat_rows
from rl_transformers.policies.actor_critic import ActorCritic
from rl_transformers.policies.encoders import Obs, RunningNorm, obs_to_tensor


def final_observations(info: dict[str, Any], space: spaces.Space, done_idx: np.ndarray) -> Any:
    """Batch the final observations of envs ``done_idx`` from a SAME_STEP ``info``."""
    items = [info["final_obs"][i] for i in done_idx]
    return concatenate(space, items, cast(Any, create_empty_array(space, len(items))))


# -- the rollout loop -----------------------------------------------------------------------------------------
@dataclass
class LoopState:
    """What the rollout loop carries from one rollout to the next (saved in checkpoints)."""

    obs: Obs
    """Current observations (N, ...) as tensors."""
    episode_start: Tensor
    """(N,) bool: the current observation begins an episode."""
    policy_state: Any
    """Policy state (N rows) before acting on ``obs``."""
    ep_return: np.ndarray
    """(N,) running undiscounted return of the current episodes."""
    ep_length: np.ndarray
    """(N,) running length of the current episodes."""


def reset_loop(
    envs: gym.vector.VectorEnv, policy: ActorCritic, seed: int | None, device: torch.device | str
) -> LoopState:
    """Reset the envs (seeds seed, seed+1, ...) and start an empty policy state."""
    obs, _ = envs.reset(seed=seed)
    n = envs.num_envs
    return LoopState(
        obs=obs_to_tensor(obs, envs.single_observation_space, device),
        episode_start=torch.ones(n, dtype=torch.bool, device=device),
        policy_state=policy.initial_state(n, device),
        ep_return=np.zeros(n, dtype=np.float64),
        ep_length=np.zeros(n, dtype=np.int64),
    )


def collect_rollout(
    policy: ActorCritic,
    envs: gym.vector.VectorEnv,
    storage: RolloutStorage,
    loop: LoopState,
    gamma: float,
    gae_lambda: float,
    env_id: str | None = None,
    global_step: int = 0,
    reward_norm: RewardNorm | None = None,
    obs_norm: RunningNorm | None = None,
    *,
    _per_step_bootstrap: bool = False,
) -> tuple[LoopState, list[tuple[float, int]]]:
    """Fill ``storage`` with ``num_steps`` steps, compute GAE; return the new loop state and finished episodes.

    Acting runs under ``torch.inference_mode`` with one token per env per step and the carried state. A NaN /
    infinite observation or reward from the envs raises :class:`NonFiniteError` naming the env (``env_id``),
    its vector index and the step (``global_step``: the run's step when the rollout started). With
    ``reward_norm`` the stored rewards are scaled (:mod:`~rl_transformers.algos.reward_norm`); the returned
    episodes keep the env's rewards.

    ``obs_norm`` (``ppo.norm_obs_update`` "step"): as SB3's VecNormalize, arriving observations join it
    (:func:`observe`); acting and storage use them normalised at their step. ``loop.obs`` stays raw.

    Truncation bootstraps V(final observation | pre-reset state) are computed after the last step, all in one
    batched forward per state shape (the weights do not change during a rollout; every row is evaluated from
    its own kept state rows, so the values are those of a per-step call). ``_per_step_bootstrap`` (tests
    only) evaluates them at their step instead, one forward per step with a truncation.
    """
    space = envs.single_observation_space
    device = storage.device
    n_envs, n_steps = envs.num_envs, storage.num_steps
    episodes: list[tuple[float, int]] = []
    obs, starts, state = loop.obs, loop.episode_start, loop.policy_state
    ep_return, ep_length = loop.ep_return.copy(), loop.ep_length.copy()
    # Env answers are gathered in NumPy and copied to the storage once, after the last step.
    rewards = np.zeros((n_steps, n_envs), dtype=np.float32)
    terminated_all = np.zeros((n_steps, n_envs), dtype=bool)
    truncated_all = np.zeros((n_steps, n_envs), dtype=bool)
    pending: list[_Bootstrap] = []
    storage.final_values.zero_()  # written below only where an env was truncated
    with torch.inference_mode():  # projections cached for this rollout's weights (state stored without them)
        state = policy.acting_state(state)
    for step in range(n_steps):
        with torch.inference_mode():
            if step % storage.seq_len == 0:
                state = policy.segment_start(state)
                storage.store_state(step, policy.plain_state(state))
            seen = obs if obs_norm is None else obs_norm(obs)
            out = policy.act(seen, state, starts)
        next_obs, reward, terminated, truncated, info = envs.step(policy.to_env(out.action))
        _check_env_output(next_obs, reward, env_id, step, global_step)
        terminated, truncated = np.asarray(terminated, dtype=bool), np.asarray(truncated, dtype=bool)
        arrived = observe(obs_norm, obs_to_tensor(next_obs, space, device))
        boot = np.flatnonzero(truncated & ~terminated)
        if boot.size:  # bootstrap time-limit ends from V(final obs) with the pre-reset state
            final_obs = obs_to_tensor(final_observations(info, space, boot), space, device)
            with torch.inference_mode():
                item = _Bootstrap.of(
                    step, torch.as_tensor(boot, device=device), final_obs, out.state, obs_norm
                )
                if _per_step_bootstrap:
                    _bootstrap_values(policy, [item], storage.final_values)
                else:
                    pending.append(item)
        done = terminated | truncated
        storage.insert_policy(step, seen, out.action, out.log_prob, out.value, starts)
        rewards[step] = reward if reward_norm is None else reward_norm(reward, done)
        terminated_all[step], truncated_all[step] = terminated, truncated
        episodes += _count_episodes(ep_return, ep_length, reward, done)
        obs = arrived
        starts = torch.as_tensor(done, device=device)
        state = out.state
    storage.insert_env(rewards, terminated_all, truncated_all)
    with torch.inference_mode():
        _bootstrap_values(policy, pending, storage.final_values)
        last_value = policy.value(obs if obs_norm is None else obs_norm(obs), state, starts)
    storage.compute_returns(last_value.float(), gamma, gae_lambda)
    return LoopState(obs, starts, state, ep_return, ep_length), episodes


def _count_episodes(
    ep_return: np.ndarray, ep_length: np.ndarray, reward: np.ndarray, done: np.ndarray
) -> list:
    """Add a step's rewards to the running episodes (in place); return (return, length) of those it ended."""
    ep_return += reward
    ep_length += 1
    ended = [(float(ep_return[i]), int(ep_length[i])) for i in np.flatnonzero(done)]
    ep_return[done] = 0.0
    ep_length[done] = 0
    return ended


def observe(obs_norm: RunningNorm | None, obs: Obs) -> Obs:
    """Merge newly arrived observations into ``obs_norm``'s statistics (VecNormalize's cadence); return them."""
    if obs_norm is not None:
        obs_norm.update(cast(Tensor, obs))
    return obs


@dataclass
class _Bootstrap:
    """A step's truncated envs: their final observations and pre-reset policy state rows."""

    step: int
    idx: Tensor
    obs: Obs
    state: Any

    @classmethod
    def of(
        cls, step: int, idx: Tensor, final_obs: Obs, state: Any, obs_norm: RunningNorm | None
    ) -> _Bootstrap:
        """The rows ``idx`` of the step's post-action state; final observations normalised as acting's."""
        return cls(step, idx, final_obs if obs_norm is None else obs_norm(final_obs), state.index_select(idx))


def _rows_key(value: Any) -> Any:
    """Hashable structure of a state: states with equal keys can be row-concatenated (``cat_rows``)."""
    if isinstance(value, Tensor):
        return (tuple(value.shape[1:]), value.dtype, value.device)
    if isinstance(value, State):
        return (type(value), tuple(_rows_key(getattr(value, f.name)) for f in dataclasses.fields(value)))
    if isinstance(value, tuple | list):
        return (type(value), tuple(_rows_key(v) for v in value))
    try:
        hash(value)
    except TypeError:
        return ("object", id(value))
    return ("value", type(value), value)


def _cat_obs(parts: list[Obs]) -> Obs:
    first = parts[0]
    if isinstance(first, dict):
        return {k: _cat_obs([p[k] for p in parts]) for k in first}  # type: ignore[index, call-overload]
    if isinstance(first, tuple):
        return tuple(_cat_obs([p[i] for p in parts]) for i in range(len(first)))  # type: ignore[index]
    return torch.cat(parts, dim=0)  # type: ignore[arg-type]


def _bootstrap_values(policy: ActorCritic, pending: list[_Bootstrap], final_values: Tensor) -> None:
    """Write V(final obs | kept state rows) of every pending bootstrap into ``final_values`` (T, N): one
    forward per group of row-concatenable states (no reset: the rows are the pre-reset states)."""
    groups: dict[Any, list[_Bootstrap]] = {}
    for b in pending:
        groups.setdefault(_rows_key(b.state), []).append(b)
    for group in groups.values():
        if len(group) == 1:
            obs, state = group[0].obs, group[0].state
        else:
            obs, state = _cat_obs([b.obs for b in group]), cat_rows([b.state for b in group])
        values = policy.value(obs, state, None).float()
        offset = 0
        for b in group:
            n = b.idx.shape[0]
            final_values[b.step, b.idx] = values[offset : offset + n]
            offset += n


def _nonfinite_rows(x: Any) -> np.ndarray | None:
    """Per-env count of non-finite entries of a batched observation tree (None: no float leaves)."""
    if isinstance(x, dict):
        parts = [_nonfinite_rows(v) for v in x.values()]
    elif isinstance(x, tuple | list):
        parts = [_nonfinite_rows(v) for v in x]
    else:
        a = np.asarray(x)
        if not np.issubdtype(a.dtype, np.floating):
            return None
        return (~np.isfinite(a)).reshape(a.shape[0], -1).sum(axis=1) if a.ndim else None
    parts = [q for q in parts if q is not None]
    return np.sum(cast("list[np.ndarray]", parts), axis=0) if parts else None


def _check_env_output(obs: Any, reward: np.ndarray, env_id: str | None, step: int, global_step: int) -> None:
    """Blame the environment (not the loss) for NaN / inf observations or rewards."""
    if (
        isinstance(obs, np.ndarray)
        and isinstance(reward, np.ndarray)
        and (not np.issubdtype(obs.dtype, np.floating) or np.isfinite(obs).all())
        and np.isfinite(reward).all()
    ):
        return  # the common case: one array of observations, all finite
    bad_obs = _nonfinite_rows(obs)
    bad_rew = ~np.isfinite(np.asarray(reward, dtype=np.float64))
    if (bad_obs is None or not bad_obs.any()) and not bad_rew.any():
        return
    from rl_transformers.utils.training import NonFiniteError

    n = len(bad_rew)
    where = [i for i in range(n) if bad_rew[i] or (bad_obs is not None and bad_obs[i])]
    i = where[0]
    what = "reward " + repr(float(reward[i])) if bad_rew[i] else "observation"
    name = f"observation/reward from the environment {env_id or '?'}"
    detail = (
        f"env index {i} (of {n}; also {where[1:]})" if len(where) > 1 else f"env index {i} (of {n})"
    ) + (
        f" returned a non-finite {what} at rollout step {step} of the update that started at global step "
        f"{global_step}; this is the environment's output, not a training divergence"
    )
    raise NonFiniteError(name, global_step + step * n, detail)
