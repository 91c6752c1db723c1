"""The Decision Transformer's rollout agent: a stateful per-step policy over parallel environments.

:class:`DTAgent` is kept apart from the network (as d3rlpy keeps its stateful wrapper apart from its
model): :mod:`~rl_transformers.policies.decision_transformer` holds the network, this module the episode
bookkeeping (target return, running return-to-go, the last K steps, a streamed backbone state). The trainer's
evaluation (:mod:`rl_transformers.algos.evaluation`) and the user-facing
:class:`~rl_transformers.agents.dt_agent.StatefulDTWrapper` (d3rlpy's ``predict(observation, reward)`` API,
in ``rl_transformers/agents/dt_agent.py``) both drive a :class:`DTAgent`.

Named ``dt_rollout`` (not ``dt_agent``) so it is not confused with ``rl_transformers.agents.dt_agent``.
Imports one way: this module imports :mod:`~rl_transformers.policies.dt_padding` and
:mod:`~rl_transformers.policies.decision_transformer`, neither imports it.

Method: Chen et al. 2021, "Decision Transformer: Reinforcement Learning via Sequence Modeling", arXiv
2106.01345 (the return-to-go starts at the target and each reward is subtracted from it).
"""

from __future__ import annotations

from typing import Literal, TypeVar

import numpy as np
import torch
from torch import Tensor

from rl_transformers.backbone.state import BackboneState, State
from rl_transformers.policies.decision_transformer import DecisionTransformer
from rl_transformers.policies.dt_padding import last_index, pad_steps

S = TypeVar("S", bound=State)


class DTAgent:
    """Stateful rollout wrapper (d3rlpy's ``as_stateful_wrapper`` idea) over ``num_envs`` parallel episodes.

    Per env it keeps the target return, the running return-to-go R̂ (R̂_0 = target, R̂_{t+1} = R̂_t − r_t in
    raw units; the model scales it) and the last K steps. ``act(obs)`` appends (R̂_t, s_t) and returns a_t;
    ``observe(rewards, dones)`` then decrements R̂ and ends the episodes of ``dones`` (their next ``act``
    starts afresh). Two ways to compute a_t, equal up to float rounding:

    - **recompute** (always correct): the last K steps, padded exactly like a training window
      (:func:`pad_steps`), go through the full forward; the prediction is read at the last real step.
    - **stream** (``mode="auto"`` when the model's
      :attr:`~rl_transformers.policies.decision_transformer.DecisionTransformer.streams_exactly`): the
      backbone state is carried; each step feeds the tokens (R̂_t, s_t), reads a_t at s_t, then feeds the
      a_t token. Used while every env's whole episode fits in the context (all t < K, at most 3K tokens
      since the state began) — the state starts when all envs start an episode together (e.g. after
      :meth:`reset`); a single env resetting inside it resets its row. Once the context would slide, the
      agent drops the state and recomputes until all envs start together again. ``last_mode`` / ``calls`` tell which path ran.
    - **segment** (a model trained with segment memory, :attr:`~rl_transformers.policies.decision_transformer.
      DecisionTransformer.carries_memory`; RATE, Cherepanov et al. 2023, arXiv 2306.09459): the episode is cut
      into K-step segments at t = 0, K, 2K, ... as in training; a_t is read from the current segment
      (recomputed, padded like a training segment) run on the backbone memory of the segments before it, and
      when a segment is full it is folded into that memory (one forward with its actions) before the next
      starts. A cue older than K stays reachable as far as the memory reaches.
    """

    def __init__(
        self,
        model: DecisionTransformer,
        num_envs: int = 1,
        target_return: float | np.ndarray | None = None,
        *,
        mode: Literal["auto", "recompute"] = "auto",
        sample: bool = False,
        generator: torch.Generator | None = None,
    ) -> None:
        if mode not in ("auto", "recompute"):
            raise ValueError(f"mode={mode!r} is not one of ['auto', 'recompute']")
        if model.condition_on_return and target_return is None:
            raise ValueError("a return-conditioned model needs target_return")
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs!r}")
        self.model = model.eval()
        self.num_envs = int(num_envs)
        self.mode = mode
        self.sample = sample
        self.generator = generator
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        n, k = self.num_envs, model.context_len
        self.target = torch.zeros(n, dtype=torch.float64, device=self.device)
        self.set_target(0.0 if target_return is None else target_return)
        obs_dtype = torch.long if model.discrete_observations else torch.float32
        act_shape = (n, k) if model.discrete_actions else (n, k, model.action_dim)
        self.rtg = torch.zeros(n, k, dtype=torch.float64, device=self.device)
        self.obs = torch.zeros(n, k, *model.obs_shape, dtype=obs_dtype, device=self.device)
        self.act_hist = torch.zeros(
            act_shape, dtype=torch.long if model.discrete_actions else torch.float32, device=self.device
        )
        self.timesteps = torch.zeros(n, k, dtype=torch.long, device=self.device)
        self.lengths = torch.zeros(n, dtype=torch.long, device=self.device)
        self.t = torch.zeros(n, dtype=torch.long, device=self.device)
        self.current_rtg = self.target.clone()
        self._stream: BackboneState | None = None
        self._stream_tokens = 0
        self._stream_reset = torch.zeros(n, dtype=torch.bool, device=self.device)
        self.last_mode: str | None = None
        self.calls = {"stream": 0, "recompute": 0}
        self.memory: BackboneState | None = None
        """Backbone memory of the finished segments of each env's episode (segment mode only)."""
        if model.carries_memory:
            self.memory = model.backbone.init_state(n, self.device, self.dtype)
            self.calls["segment"] = 0

    # -- episode bookkeeping ----------------------------------------------------------------------------------
    def set_target(self, target_return: float | np.ndarray | Tensor) -> None:
        """Target return of every env (a scalar or one per env); applies from the next episode start."""
        value = torch.as_tensor(np.asarray(target_return, dtype=np.float64), device=self.device)
        self.target = (
            value.expand(self.num_envs).clone() if value.dim() == 0 else value.reshape(self.num_envs).clone()
        )

    def reset(self, mask: np.ndarray | Tensor | None = None) -> None:
        """Start new episodes in the envs of ``mask`` (all when None), returns-to-go back to the target."""
        rows = (
            torch.ones(self.num_envs, dtype=torch.bool, device=self.device)
            if mask is None
            else torch.as_tensor(np.asarray(mask), dtype=torch.bool, device=self.device).reshape(
                self.num_envs
            )
        )
        if not bool(rows.any()):
            return
        for buf in (self.rtg, self.obs, self.act_hist, self.timesteps):
            buf[rows] = 0
        self.lengths[rows] = 0
        self.t[rows] = 0
        self.current_rtg = torch.where(rows, self.target, self.current_rtg)
        self._stream_reset |= rows
        if self.memory is not None:
            self.memory = self.memory.reset(rows)

    def observe(self, rewards: np.ndarray | Tensor | float, dones: np.ndarray | Tensor | None = None) -> None:
        """After ``env.step``: R̂ ← R̂ − r, t ← t + 1; envs in ``dones`` start a new episode at the next act."""
        r = torch.as_tensor(np.asarray(rewards, dtype=np.float64), device=self.device).reshape(-1)
        self.current_rtg = self.current_rtg - r.expand(self.num_envs)
        self.t += 1
        if dones is not None:
            self.reset(dones)

    # -- acting ---------------------------------------------------------------------------------------------
    def _push(self, observations: Tensor) -> None:
        """Append (R̂_t, s_t, a=0, t) to each env's window, sliding out the oldest step when full."""
        k = self.model.context_len
        full = self.lengths >= k
        if bool(full.any()):
            for buf in (self.rtg, self.obs, self.act_hist, self.timesteps):
                buf[full] = torch.roll(buf[full], shifts=-1, dims=1)
        idx = self.lengths.clamp(max=k - 1)
        rows = torch.arange(self.num_envs, device=self.device)
        self.rtg[rows, idx] = self.current_rtg
        self.obs[rows, idx] = observations.to(self.obs.dtype)
        self.act_hist[rows, idx] = 0
        self.timesteps[rows, idx] = self.t
        self.lengths = (self.lengths + 1).clamp(max=k)

    def context(self) -> dict[str, Tensor]:
        """The current windows as model inputs (padded like training batches): rtg, obs, actions, t, mask."""
        k, pad = self.model.context_len, self.model.padding
        lengths = self.lengths
        mask = torch.arange(k, device=self.device)[None, :] < lengths[:, None]
        return {
            "returns_to_go": pad_steps(self.rtg, lengths, pad).to(torch.float32),
            "observations": pad_steps(self.obs, lengths, pad),
            "actions": pad_steps(self.act_hist, lengths, pad),
            "timesteps": pad_steps(self.timesteps, lengths, pad),
            "mask": pad_steps(mask, lengths, pad),
        }

    def _fold_full_segments(self) -> None:
        """Segment mode: each env whose current segment holds K steps folds it into its memory and starts an
        empty segment (the other rows keep theirs)."""
        full = self.lengths >= self.model.context_len
        if self.memory is None or not bool(full.any()):
            return
        out = self.model(**self.context(), state=self.memory, return_state=True)
        self.memory = select_rows(full, out.state, self.memory)
        for buf in (self.rtg, self.obs, self.act_hist, self.timesteps):
            buf[full] = 0
        self.lengths[full] = 0

    def _can_stream(self) -> bool:
        if self.mode != "auto" or not self.model.streams_exactly:
            return False
        k = self.model.context_len
        if bool((self.t >= k).any()):
            return False
        if self._stream is None:
            return bool((self.t == 0).all())  # a new state only when all envs start together
        return self._stream_tokens + self.model.tokens_per_step <= self.model.tokens_per_step * k

    @torch.no_grad()
    def act(self, observations: np.ndarray | Tensor) -> np.ndarray:
        """Actions (num_envs, A) float or (num_envs,) int for observations (num_envs, *obs_shape)."""
        model = self.model
        obs = torch.as_tensor(np.asarray(observations), device=self.device)
        obs = obs.reshape(self.num_envs, *model.obs_shape)
        self._fold_full_segments()
        self._push(obs)
        rows = torch.arange(self.num_envs, device=self.device)
        cur = self.lengths - 1  # index of step t in the unpadded (left-aligned) history
        if self._can_stream():
            if self._stream is None:
                self._stream = model.backbone.init_state(self.num_envs, self.device, self.dtype)
                self._stream_tokens = 0
                self._stream_reset.zero_()
            steps = model.embed_steps(
                self.rtg[rows, cur].float()[:, None],
                self.obs[rows, cur][:, None],  # as stored, so stream and recompute see the same input
                self.act_hist[rows, cur][:, None],
                self.t[:, None],
            )
            n_in = model.tokens_per_step - 1  # [R̂_t,] s_t: everything but the unknown action
            out = model.run_tokens(steps[:, 0, :n_in], state=self._stream, reset=self._stream_reset.clone())
            self._stream_reset.zero_()
            pred = model.head(out.y[:, -1])
            action = model.to_action(pred, self.sample, self.generator)
            self.act_hist[rows, cur] = action.to(self.act_hist.dtype)
            a_tok = model.embed_steps(
                self.rtg[rows, cur].float()[:, None],
                self.obs[rows, cur][:, None],
                self.act_hist[rows, cur][:, None],
                self.t[:, None],
            )[:, 0, n_in:]
            self._stream = model.run_tokens(a_tok, state=out.state).state
            self._stream_tokens += model.tokens_per_step
            self.last_mode = "stream"
        else:
            self._stream = None
            ctx = self.context()
            out = model(**ctx) if self.memory is None else model(**ctx, state=self.memory)
            at = last_index(self.lengths, model.context_len, model.padding)
            action = model.to_action(out.predictions[rows, at], self.sample, self.generator)
            self.act_hist[rows, cur] = action.to(self.act_hist.dtype)
            self.last_mode = "recompute" if self.memory is None else "segment"
        self.calls[self.last_mode] += 1
        return action.cpu().numpy()


def select_rows(rows: Tensor, new: S, old: S) -> S:
    """``new``'s rows where ``rows`` (B,) is True, ``old``'s elsewhere (two states of the same structure)."""
    olds: list[Tensor] = []
    old.map(lambda t: olds.append(t) or t)  # type: ignore[func-returns-value]
    it = iter(olds)

    def pick(t: Tensor) -> Tensor:
        o = next(it)
        return torch.where(rows.to(t.device).view(-1, *([1] * (t.dim() - 1))), t, o)

    return new.map(pick)


__all__ = ["DTAgent", "select_rows"]
