"""Rollout storage for memory policies and GAE(λ) (the rollout loop that fills it:
:mod:`~rl_transformers.algos.rollout`).

Storage layout. A rollout is ``num_steps`` steps of ``num_envs`` envs, (T, N, ...). It is cut into training
sequences of ``seq_len`` = W steps on a fixed grid (steps [gW, (g+1)W) of env e form sequence s = g·N + e), and
the policy state of every env at each grid step is stored (``store_state``, called by the rollout before the
policy acts at that step). A PPO minibatch is a set of whole sequences: the policy re-runs each one in one pass
from its stored state, gradients flowing through the W steps of the sequence (the training window) while the
stored state (XL memory, KV cache, RNN state) is a constant (the memory window can be much longer than W).
Episode starts inside a sequence are stored with it and applied as in the rollout by
:meth:`~rl_transformers.policies.actor_critic.ActorCritic.evaluate_sequence`, so sequences never mix episodes.

GAE (Schulman et al. 2016, arXiv 1506.02438) with Gymnasium's two kinds of episode end:
δ_t = r_t + γ V_next(t) − V(s_t), A_t = δ_t + γλ (1 − done_t) A_{t+1}, where V_next(t) is 0 if the episode
terminated at t, V(final observation) if it was truncated at t (time limit: the episode would have continued),
V(s_{t+1}) otherwise (``last_value`` after the last step). Returns R_t = A_t + V(s_t).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from gymnasium import spaces
from torch import Tensor

from rl_transformers.backbone.state import State, cat_rows
from rl_transformers.policies.encoders import Obs, obs_to_tensor, tree_map

__all__ = ["RolloutStorage", "SequenceBatch", "compute_gae", "state_signature"]


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
    # Everything but the recursion is elementwise over (T, N) at once (the same operations per element as a
    # step-by-step evaluation, hence the same numbers); the loop carries only A_t = δ_t + γλ(1 − done_t) A_{t+1}.
    next_values = torch.cat([values[1:], last_value.unsqueeze(0)])
    next_values = torch.where(truncated, final_values, next_values)
    next_values = torch.where(terminated, torch.zeros_like(next_values), next_values)
    deltas = rewards + gamma * next_values - values
    decay = gamma * gae_lambda * (~(terminated | truncated)).to(rewards.dtype)
    advantages = torch.empty_like(rewards)
    gae = torch.zeros_like(last_value)
    for t in reversed(range(rewards.shape[0])):
        gae = deltas[t] + decay[t] * gae
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
            _write(buffer[k], index, value[k])  # type: ignore[index, call-overload]
    elif isinstance(buffer, tuple):
        for b, v in zip(buffer, value):  # type: ignore[arg-type]
            _write(b, index, v)
    else:
        buffer[index] = value  # type: ignore[assignment]  # value mirrors buffer's structure: a Tensor leaf here


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
        zeros: dict[str, Any] = dict(dtype=torch.float32, device=self.device)
        self.log_probs = torch.zeros(t, n, **zeros)
        self.values = torch.zeros(t, n, **zeros)
        self.rewards = torch.zeros(t, n, **zeros)
        self.final_values = torch.zeros(t, n, **zeros)
        self.advantages = torch.zeros(t, n, **zeros)
        self.returns = torch.zeros(t, n, **zeros)
        flags: dict[str, Any] = dict(dtype=torch.bool, device=self.device)
        self.terminated = torch.zeros(t, n, **flags)
        self.truncated = torch.zeros(t, n, **flags)
        self.episode_starts = torch.zeros(t, n, **flags)
        self.states: list[Any] = [None] * self.num_seq_starts
        self._stacked: tuple[tuple[Any, ...], Any] | None = None
        """(the stored states, their rows concatenated): sequence s's state is row s (``state_of``)."""

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
        self.insert_policy(step, obs, action, log_prob, value, episode_start)
        self.rewards[step] = reward
        self.terminated[step] = terminated
        self.truncated[step] = truncated
        self.final_values[step] = 0.0 if final_value is None else final_value

    def insert_policy(
        self, step: int, obs: Obs, action: Tensor, log_prob: Tensor, value: Tensor, episode_start: Tensor
    ) -> None:
        """Record the policy's side of step ``step`` (the env's answers: :meth:`insert_env`)."""
        _write(self.obs, step, obs)
        self.actions[step] = action
        self.log_probs[step] = log_prob
        self.values[step] = value
        self.episode_starts[step] = episode_start

    def insert_env(self, rewards: Any, terminated: Any, truncated: Any) -> None:
        """The env's answers of the whole rollout at once: (T, N) arrays (NumPy or tensors)."""
        self.rewards.copy_(torch.as_tensor(rewards, dtype=torch.float32))
        self.terminated.copy_(torch.as_tensor(terminated, dtype=torch.bool))
        self.truncated.copy_(torch.as_tensor(truncated, dtype=torch.bool))

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
        same = {state_signature(s) for s in self.states}
        if len(same) == 1 and isinstance(self.states[0], State):
            # One shape (the common case): sequence s = g·N + e is row s of the stored states concatenated,
            # concatenated once per rollout, so a minibatch is a single gather.
            states = tuple(self.states)
            if self._stacked is None or any(a is not b for a, b in zip(self._stacked[0], states)):
                self._stacked = (states, cat_rows(list(states)))
            rows = self._stacked[1].index_select(seq_ids.to(self.device))
            return [(torch.arange(len(seq_ids)), rows)]
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
                obs=tree_map(cast("Callable[[Any], Any]", lambda x, r=dev_ids: x[r]), data["obs"]),
                actions=data["actions"][dev_ids],
                log_probs=data["log_probs"][dev_ids],
                values=data["values"][dev_ids],
                advantages=data["advantages"][dev_ids],
                returns=data["returns"][dev_ids],
                episode_starts=data["episode_starts"][dev_ids],
                state_groups=[(p.to(self.device), s) for p, s in self.state_of(ids)],
            )
