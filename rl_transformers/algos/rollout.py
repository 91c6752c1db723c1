"""Rollout storage for memory policies, GAE(λ) and the rollout loop (env construction: :mod:`~rl_transformers.algos.env_util`;
evaluation: :mod:`~rl_transformers.algos.evaluation`).

Storage layout. A rollout is ``num_steps`` steps of ``num_envs`` envs, (T, N, ...). It is cut into training
sequences of ``seq_len`` = W steps on a fixed grid (steps [gW, (g+1)W) of env e form sequence s = g·N + e), and
the policy state of every env at each grid step is stored (``store_state``, called by the rollout before the
policy acts at that step). A PPO minibatch is a set of whole sequences: the policy re-runs each one in one pass
from its stored state, gradients flowing through the W steps of the sequence (the training window) while the
stored state (XL memory, KV cache, RNN state) is a constant (the memory window can be much longer than W).
Episode starts inside a sequence are stored with it and applied as in the rollout by
:meth:`~rl_transformers.policies.gtrxl.ActorCritic.evaluate_sequence`, so sequences never mix episodes.

GAE (Schulman et al. 2016, arXiv 1506.02438) with Gymnasium's two kinds of episode end:
δ_t = r_t + γ V_next(t) − V(s_t), A_t = δ_t + γλ (1 − done_t) A_{t+1}, where V_next(t) is 0 if the episode
terminated at t, V(final observation) if it was truncated at t (time limit: the episode would have continued),
V(s_{t+1}) otherwise (``last_value`` after the last step). Returns R_t = A_t + V(s_t).

Vector envs run with Gymnasium's ``SAME_STEP`` autoreset: the observation returned at an episode end is
already the next episode's first one and the final observation is in ``info["final_obs"]``; it is evaluated
with the pre-reset policy state to bootstrap truncations.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector.utils import concatenate, create_empty_array
from torch import Tensor

from rl_transformers.algos.env_util import (  # re-exported: env construction moved there
    check_same_step,  # noqa: F401
    make_env_thunk,  # noqa: F401
    make_vec_env,  # noqa: F401
    register_rlt_envs,  # noqa: F401
    video_unavailable,  # noqa: F401
)
from rl_transformers.backbone.state import State, cat_rows
from rl_transformers.policies.encoders import Obs, obs_to_tensor, tree_map
from rl_transformers.policies.gtrxl import ActorCritic


# -- GAE ------------------------------------------------------------------------------------------------------
def compute_gae(
    rewards: Tensor,
    values: Tensor,
    terminated: Tensor,
    truncated: Tensor,
    final_values: Tensor,
    last_value: Tensor,
    gamma: float,
    gae_lambda: float,
) -> tuple[Tensor, Tensor]:
    """Advantages and returns, (T, N) each. See the module docstring.

    rewards, values, final_values (T, N) float; terminated, truncated (T, N) bool; last_value (N,) = V of the
    observation after the last step. ``final_values[t]`` is read only where ``truncated[t]`` (and not
    ``terminated[t]``: termination wins).
    """
    n_steps = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    gae = torch.zeros_like(last_value)
    for t in reversed(range(n_steps)):
        next_value = last_value if t == n_steps - 1 else values[t + 1]
        next_value = torch.where(truncated[t], final_values[t], next_value)
        next_value = torch.where(terminated[t], torch.zeros_like(next_value), next_value)
        delta = rewards[t] + gamma * next_value - values[t]
        not_done = (~(terminated[t] | truncated[t])).to(rewards.dtype)
        gae = delta + gamma * gae_lambda * not_done * gae
        advantages[t] = gae
    return advantages, advantages + values


# -- storage --------------------------------------------------------------------------------------------------
def _empty_obs(space: spaces.Space, lead: tuple[int, ...], device: torch.device | str) -> Obs:
    if isinstance(space, spaces.Dict):
        return {k: _empty_obs(s, lead, device) for k, s in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(_empty_obs(s, lead, device) for s in space.spaces)
    sample = obs_to_tensor(space.sample(), space)
    return torch.zeros(*lead, *sample.shape, dtype=sample.dtype, device=device)  # type: ignore[union-attr]


def _write(buffer: Obs, index: Any, value: Obs) -> None:
    if isinstance(buffer, dict):
        for k in buffer:
            _write(buffer[k], index, value[k])  # type: ignore[index]
    elif isinstance(buffer, tuple):
        for b, v in zip(buffer, value):  # type: ignore[arg-type]
            _write(b, index, v)
    else:
        buffer[index] = value


def state_signature(state: Any) -> tuple[Any, ...]:
    """Shapes (without the batch dim) and dtypes of a state's tensors: states can be row-concatenated iff equal."""
    shapes: list[Any] = []
    if isinstance(state, State):
        state.map(lambda t: shapes.append((tuple(t.shape[1:]), t.dtype)) or t)  # type: ignore[func-returns-value]
    return tuple(shapes)


def _clone_state(state: Any) -> Any:
    # Leave inference mode so the copy can enter autograd graphs later (inference tensors cannot).
    with torch.inference_mode(False):
        return state.map(lambda t: t.clone()) if isinstance(state, State) else state


@dataclass
class SequenceBatch:
    """A minibatch of B whole training sequences of W steps (tensors (B, W, ...))."""

    obs: Obs
    actions: Tensor
    log_probs: Tensor
    values: Tensor
    advantages: Tensor
    returns: Tensor
    episode_starts: Tensor
    state_groups: list[tuple[Tensor, Any]] = field(default_factory=list)
    """(rows of this batch, their stored states); one group unless stored states differ in shape."""

    def select(self, rows: Tensor) -> dict[str, Any]:
        return {
            "obs": tree_map(lambda x: x[rows], self.obs),
            "actions": self.actions[rows],
            "episode_starts": self.episode_starts[rows],
        }


class RolloutStorage:
    """(T, N) buffers of one rollout plus the policy states at the training-sequence starts."""

    def __init__(
        self,
        num_steps: int,
        num_envs: int,
        seq_len: int,
        observation_space: spaces.Space,
        action_shape: tuple[int, ...],
        action_dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> None:
        if seq_len < 1 or num_steps % seq_len:
            raise ValueError(
                f"num_steps={num_steps} must be a positive multiple of seq_len={seq_len} "
                f"(e.g. num_steps={max(seq_len, 1) * max(num_steps // max(seq_len, 1), 1)})"
            )
        self.num_steps, self.num_envs, self.seq_len = num_steps, num_envs, seq_len
        self.num_seq_starts = num_steps // seq_len
        self.device = torch.device(device)
        t, n = num_steps, num_envs
        self.obs = _empty_obs(observation_space, (t, n), self.device)
        self.actions = torch.zeros(t, n, *action_shape, dtype=action_dtype, device=self.device)
        zeros = dict(dtype=torch.float32, device=self.device)
        self.log_probs = torch.zeros(t, n, **zeros)  # type: ignore[arg-type]
        self.values = torch.zeros(t, n, **zeros)  # type: ignore[arg-type]
        self.rewards = torch.zeros(t, n, **zeros)  # type: ignore[arg-type]
        self.final_values = torch.zeros(t, n, **zeros)  # type: ignore[arg-type]
        self.advantages = torch.zeros(t, n, **zeros)  # type: ignore[arg-type]
        self.returns = torch.zeros(t, n, **zeros)  # type: ignore[arg-type]
        flags = dict(dtype=torch.bool, device=self.device)
        self.terminated = torch.zeros(t, n, **flags)  # type: ignore[arg-type]
        self.truncated = torch.zeros(t, n, **flags)  # type: ignore[arg-type]
        self.episode_starts = torch.zeros(t, n, **flags)  # type: ignore[arg-type]
        self.states: list[Any] = [None] * self.num_seq_starts

    # -- writing --------------------------------------------------------------------------------------------
    def store_state(self, step: int, state: Any) -> None:
        """The policy state before acting at ``step`` (a multiple of seq_len), N rows."""
        if step % self.seq_len:
            raise ValueError(f"states are stored at multiples of seq_len={self.seq_len}, got step {step}")
        self.states[step // self.seq_len] = _clone_state(state)

    def insert(
        self,
        step: int,
        obs: Obs,
        action: Tensor,
        log_prob: Tensor,
        value: Tensor,
        reward: Tensor,
        terminated: Tensor,
        truncated: Tensor,
        episode_start: Tensor,
        final_value: Tensor | None = None,
    ) -> None:
        """Record step ``step``: the obs acted on, the action and its log-prob / value, the env's answer."""
        _write(self.obs, step, obs)
        self.actions[step] = action
        self.log_probs[step] = log_prob
        self.values[step] = value
        self.rewards[step] = reward
        self.terminated[step] = terminated
        self.truncated[step] = truncated
        self.episode_starts[step] = episode_start
        self.final_values[step] = 0.0 if final_value is None else final_value

    def compute_returns(self, last_value: Tensor, gamma: float, gae_lambda: float) -> None:
        self.advantages, self.returns = compute_gae(
            self.rewards,
            self.values,
            self.terminated,
            self.truncated,
            self.final_values,
            last_value.to(self.values),
            gamma,
            gae_lambda,
        )

    # -- reading --------------------------------------------------------------------------------------------
    def _to_sequences(self, x: Tensor) -> Tensor:
        """(T, N, ...) -> (S, W, ...) with sequence s = g·N + e."""
        g, w, n = self.num_seq_starts, self.seq_len, self.num_envs
        return x.reshape(g, w, n, *x.shape[2:]).transpose(1, 2).reshape(g * n, w, *x.shape[2:])

    @property
    def num_sequences(self) -> int:
        return self.num_seq_starts * self.num_envs

    def sequences(self) -> dict[str, Any]:
        """Every buffer as (S, W, ...) sequences."""
        seq = self._to_sequences
        return {
            "obs": tree_map(seq, self.obs),
            "actions": seq(self.actions),
            "log_probs": seq(self.log_probs),
            "values": seq(self.values),
            "advantages": seq(self.advantages),
            "returns": seq(self.returns),
            "episode_starts": seq(self.episode_starts),
            "rewards": seq(self.rewards),
        }

    def state_of(self, seq_ids: Tensor) -> list[tuple[Tensor, Any]]:
        """Stored states of sequences ``seq_ids``, grouped by shape: [(positions in seq_ids, state rows)]."""
        if any(s is None for s in self.states):
            raise RuntimeError("a state was not stored for every sequence start (call store_state)")
        n = self.num_envs
        grid = (seq_ids // n).tolist()
        env = (seq_ids % n).tolist()
        groups: dict[tuple[Any, ...], dict[int, list[int]]] = {}
        for pos, g in enumerate(grid):
            groups.setdefault(state_signature(self.states[g]), {}).setdefault(g, []).append(pos)
        out = []
        for by_grid in groups.values():
            parts = [
                self.states[g].index_select(torch.as_tensor([env[p] for p in positions]))
                for g, positions in by_grid.items()
            ]
            order = [p for positions in by_grid.values() for p in positions]
            out.append(
                (torch.as_tensor(order, dtype=torch.long), cat_rows(parts) if len(parts) > 1 else parts[0])
            )
        return out

    def minibatches(
        self, num_minibatches: int, generator: torch.Generator | None = None
    ) -> Iterator[SequenceBatch]:
        """Shuffled minibatches of whole sequences (num_sequences // num_minibatches each)."""
        total = self.num_sequences
        if num_minibatches < 1 or num_minibatches > total:
            raise ValueError(
                f"num_minibatches={num_minibatches} must be in [1, {total}] (number of sequences)"
            )
        data = self.sequences()
        order = torch.randperm(total, generator=generator)
        size = total // num_minibatches
        for i in range(num_minibatches):
            ids = order[i * size : (i + 1) * size]
            dev_ids = ids.to(self.device)
            yield SequenceBatch(
                obs=tree_map(lambda x, r=dev_ids: x[r], data["obs"]),
                actions=data["actions"][dev_ids],
                log_probs=data["log_probs"][dev_ids],
                values=data["values"][dev_ids],
                advantages=data["advantages"][dev_ids],
                returns=data["returns"][dev_ids],
                episode_starts=data["episode_starts"][dev_ids],
                state_groups=[(p.to(self.device), s) for p, s in self.state_of(ids)],
            )


# -- vector envs: built by rl_transformers.algos.env_util (names re-exported above) ------------------------
def final_observations(info: dict[str, Any], space: spaces.Space, done_idx: np.ndarray) -> Any:
    """Batch the final observations of envs ``done_idx`` from a SAME_STEP ``info``."""
    items = [info["final_obs"][i] for i in done_idx]
    return concatenate(space, items, create_empty_array(space, len(items)))


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
) -> tuple[LoopState, list[tuple[float, int]]]:
    """Fill ``storage`` with ``num_steps`` steps, compute GAE; return the new loop state and finished episodes.

    Acting runs under ``torch.inference_mode`` with one token per env per step and the carried state. A NaN /
    infinite observation or reward from the envs raises :class:`NonFiniteError` naming the env (``env_id``),
    its vector index and the step (``global_step``: the run's step when the rollout started).
    """
    space = envs.single_observation_space
    device = storage.device
    episodes: list[tuple[float, int]] = []
    obs, starts, state = loop.obs, loop.episode_start, loop.policy_state
    ep_return, ep_length = loop.ep_return.copy(), loop.ep_length.copy()
    for step in range(storage.num_steps):
        with torch.inference_mode():
            if step % storage.seq_len == 0:
                state = policy.segment_start(state)
                storage.store_state(step, state)
            out = policy.act(obs, state, starts)
        next_obs, reward, terminated, truncated, info = envs.step(policy.to_env(out.action))
        _check_env_output(next_obs, reward, env_id, step, global_step)
        final_value = None
        boot = np.flatnonzero(truncated & ~terminated)
        if boot.size:  # bootstrap time-limit ends from V(final obs) with the pre-reset state
            final_obs = obs_to_tensor(final_observations(info, space, boot), space, device)
            idx = torch.as_tensor(boot, device=device)
            with torch.inference_mode():
                v = policy.value(final_obs, out.state.index_select(idx), None)
            final_value = torch.zeros(envs.num_envs, device=device)
            final_value[idx] = v.float()
        done = terminated | truncated
        storage.insert(
            step,
            obs,
            out.action,
            out.log_prob,
            out.value,
            torch.as_tensor(reward, dtype=torch.float32, device=device),
            torch.as_tensor(terminated, device=device),
            torch.as_tensor(truncated, device=device),
            starts,
            final_value,
        )
        ep_return += reward
        ep_length += 1
        for i in np.flatnonzero(done):
            episodes.append((float(ep_return[i]), int(ep_length[i])))
        ep_return[done] = 0.0
        ep_length[done] = 0
        obs = obs_to_tensor(next_obs, space, device)
        starts = torch.as_tensor(done, device=device)
        state = out.state
    with torch.inference_mode():
        last_value = policy.value(obs, state, starts)
    storage.compute_returns(last_value.float(), gamma, gae_lambda)
    return LoopState(obs, starts, state, ep_return, ep_length), episodes


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
    return np.sum(parts, axis=0) if parts else None


def _check_env_output(obs: Any, reward: np.ndarray, env_id: str | None, step: int, global_step: int) -> None:
    """Blame the environment (not the loss) for NaN / inf observations or rewards."""
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


def __getattr__(name: str) -> Any:
    """``evaluate_policy`` moved to :mod:`rl_transformers.algos.evaluation` (imported lazily: it imports this
    module)."""
    if name == "evaluate_policy":
        from rl_transformers.algos.evaluation import evaluate_policy

        return evaluate_policy
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
