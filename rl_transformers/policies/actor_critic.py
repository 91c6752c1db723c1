"""Memory actor-critic: observation encoder -> sequence core -> actor head + critic head.

The core (:mod:`rl_transformers.policies.cores`: the shared backbone, a context-recomputing backbone, or the
LSTM / GRU / MLP baselines of :mod:`rl_transformers.policies.recurrent`) maps a chunk of tokens with a carried
per-env state to features; the heads (:mod:`rl_transformers.policies.heads`) turn them into an action
distribution and a value. Two ways to run a policy, which give the same numbers (tested):

- :meth:`ActorCritic.act` - one token per env per step, state carried (rollouts; ``episode_start`` (B,) clears
  the rows of envs whose episode just began, via the core's ``reset``);
- :meth:`ActorCritic.evaluate_sequence` - a stored sequence (B, T) in one pass from the state stored at its
  first step (PPO updates). Episode starts inside the sequence are applied as in the rollout. A core that
  restarts rows itself (``Core.segments``: the backbone masks each token to the keys of its own episode and
  counts positions from the episode's start) runs the (B, T) batch as it is; otherwise each row is cut at its
  episode starts, the pieces are packed into one right-padded batch (:class:`Packing`), run in a single
  forward, and scattered back. Both are the same attention sums; the first has no padding and projects each
  row's memory once instead of once per piece (for T-Maze minibatches, ~0.65x the query rows and ~0.45x the
  memory rows of the packed batch).

Shapes: B envs (or sequences), T time steps, d = core width; obs (B, *obs_shape) when acting,
(B, T, *obs_shape) in ``evaluate_sequence``; values, log-probs, entropies (B,) / (B, T).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import torch
from gymnasium import spaces
from torch import Tensor, nn

from rl_transformers.policies.cores import Core, CoreOutput, TwinCore
from rl_transformers.policies.encoders import Obs, RunningNorm, make_encoder
from rl_transformers.policies.heads import ActionHead, make_action_head
from rl_transformers.policies.packing import Packing

SEGMENT_PATH = True
"""Run stored sequences through cores with ``segments`` without cutting them; False: always cut and pack
(tests and timings compare the two)."""


class ActOutput(NamedTuple):
    """What :meth:`ActorCritic.act` returns (unpacks as ``action, value, log_prob, state``)."""

    action: Tensor
    """(B, *action_shape) sampled (or modal) action, unclipped."""
    value: Tensor
    """(B,) critic value."""
    log_prob: Tensor
    """(B,) log-probability of ``action``."""
    state: Any
    """State after this step."""


@dataclass
class SequenceOutput:
    log_prob: Tensor
    """(B, T) log-probabilities of the given actions."""
    entropy: Tensor
    """(B, T) policy entropy."""
    value: Tensor
    """(B, T) critic values."""
    aux_losses: dict[str, Tensor] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)


def _init_linear(layer: nn.Linear, gain: float) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def _mlp(d_in: int, hidden: tuple[int, ...]) -> nn.Module:
    """Linear -> ReLU per entry of ``hidden`` (orthogonal, gain √2, as CleanRL's heads); identity when empty."""
    if not hidden:
        return nn.Identity()
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [_init_linear(nn.Linear(d_in, width), 2**0.5), nn.ReLU()]
        d_in = width
    return nn.Sequential(*layers)


class ActorCritic(nn.Module):
    """Encoder -> core -> (actor head, critic head), with a per-env state carried by the caller."""

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        core: Core,
        log_std_init: float = 0.0,
        head_hidden: tuple[int, ...] = (),
        obs_encoder: str = "mlp",
    ) -> None:
        super().__init__()
        self.observation_space = observation_space
        self.action_space = action_space
        self.encoder = make_encoder(observation_space, core.d_in, obs_encoder)
        self.core = core
        width = core.d_out // 2 if isinstance(core, TwinCore) else core.d_out
        self.actor_body = _mlp(width, head_hidden)
        self.critic_body = _mlp(width, head_hidden)
        """Hidden layers of each head on the core's features (``PolicyConfig.head_hidden``; empty: identity)."""
        width = head_hidden[-1] if head_hidden else width
        self.actor: ActionHead = make_action_head(action_space, width, log_std_init)
        self.critic = _init_linear(nn.Linear(width, 1), 1.0)
        self.detach_critic = False
        """True: the value loss does not back-propagate into the core and encoder (``PolicyConfig.critic``
        "detached"). A :class:`TwinCore` gives the critic its own core instead ("separate")."""
        self.obs_norm: RunningNorm | None = None
        """Observation normaliser (``enable_obs_norm``); None: observations go to the encoder as they are."""
        self.compiled_step: Callable[..., tuple[Tensor, Any]] | None = None
        """Compiled :meth:`eager_step` used by :meth:`act` (``policies.compile.compile_policy``), or None."""
        self.compiled_core: Callable[..., CoreOutput] | None = None
        """Compiled core used by :meth:`features` (the training forward), or None."""

    def enable_obs_norm(self, clip: float = 10.0) -> None:
        """Normalise observations with running statistics (Box observation spaces only)."""
        space = self.observation_space
        if not isinstance(space, spaces.Box):
            raise ValueError(
                f"norm_obs needs a Box observation space, got {space}; valid: Box (flatten Dict / Tuple "
                "observations first, e.g. with envs.FloatFlattenObservation)"
            )
        self.obs_norm = RunningNorm(tuple(space.shape), clip).to(next(self.parameters()).device)

    @contextmanager
    def inputs_normalised(self, active: bool = True) -> Iterator[RunningNorm | None]:
        """Within: observations reach the policy already normalised by ``obs_norm``, which is detached and
        yielded (to the trainer's VecNormalize-style cadence, ``ppo.norm_obs_update`` "step"); restored on exit,
        so evaluation, checkpoints and deployment see the normaliser again. ``active`` False: a no-op."""
        norm = self.obs_norm
        if not active or norm is None:
            yield None
            return
        self.obs_norm = None
        try:
            yield norm
        finally:
            self.obs_norm = norm

    def default_init_heads(self) -> None:
        """PyTorch's default initialisation for the heads and their hidden layers (``PolicyConfig.init``)."""
        for module in (self.actor_body, self.critic_body, self.actor.linear, self.critic):
            for layer in module.modules():
                if isinstance(layer, nn.Linear):
                    layer.reset_parameters()

    def encode(self, obs: Obs) -> Tensor:
        """Encoder features of observations (normalised first when ``obs_norm`` is set)."""
        return self.encoder(obs if self.obs_norm is None else self.obs_norm(obs))

    # -- state --------------------------------------------------------------------------------------------
    def initial_state(self, batch_size: int, device: torch.device | str | None = None) -> Any:
        p = next(self.parameters())
        return self.core.initial_state(batch_size, p.device if device is None else device, p.dtype)

    def segment_start(self, state: Any) -> Any:
        """Call at the first step of each training sequence, before storing the state (trims context cores)."""
        return self.core.segment_start(state)

    def acting_state(self, state: Any) -> Any:
        """``state`` prepared for acting with the current weights (the XL memory's key / value projections
        cached, so each step projects its new tokens only; a ``knn`` store copied once and then written in
        place, so keep only the latest state: :meth:`plain_state` for one to store); call at the start of
        every rollout."""
        return self.core.acting_state(state)

    def plain_state(self, state: Any) -> Any:
        """``state`` without the acting caches (what training sequences start from)."""
        return self.core.plain_state(state)

    # -- acting -------------------------------------------------------------------------------------------
    def eager_step(
        self, obs: Obs, state: Any, episode_start: Tensor | None, *, return_state: bool = True
    ) -> tuple[Tensor, Any]:
        """Core features (B, d) of one step and the new state (encoder + core, no heads; the state is None
        with ``return_state=False``)."""
        x = self.encode(obs).unsqueeze(1)
        reset = None if episode_start is None else episode_start.to(device=x.device, dtype=torch.bool)
        out = self.core(x, state, reset=reset, return_state=return_state)
        return out.y[:, 0], out.state

    def act(
        self, obs: Obs, state: Any, episode_start: Tensor | None = None, deterministic: bool = False
    ) -> ActOutput:
        """One step for B envs: obs (B, ...), episode_start (B,) bool (True: the episode begins with obs)."""
        step = self.compiled_step if self.compiled_step is not None else self.eager_step
        h, new_state = step(obs, state, episode_start)
        h_actor, h_critic = self.head_inputs(h)
        dist = self.actor(h_actor)
        action = dist.mode() if deterministic else dist.sample()
        return ActOutput(action, self.critic(h_critic).squeeze(-1), dist.log_prob(action), new_state)

    def value(self, obs: Obs, state: Any, episode_start: Tensor | None = None) -> Tensor:
        """(B,) critic values of ``obs`` given the state (used to bootstrap truncated episodes). Eager (batch
        sizes vary) and without a memory write: ``state`` stays valid, even a rollout's owned ``knn`` store."""
        h, _ = self.eager_step(obs, state, episode_start, return_state=False)
        return self.critic(self.head_inputs(h)[1]).squeeze(-1)

    def head_inputs(self, y: Tensor) -> tuple[Tensor, Tensor]:
        """(actor features, critic features) of core features ``y`` (..., d_out): the halves of a
        :class:`TwinCore`'s, else ``y`` for both (the critic's detached with ``detach_critic``), each through
        its head's hidden layers."""
        if isinstance(self.core, TwinCore):
            d = y.shape[-1] // 2
            y_actor, y_critic = y[..., :d], y[..., d:]
        else:
            y_actor, y_critic = y, (y.detach() if self.detach_critic else y)
        return self.actor_body(y_actor), self.critic_body(y_critic)

    def to_env(self, action: Tensor) -> np.ndarray:
        """Actions for ``env.step`` (NumPy, Box actions clipped to the bounds)."""
        return self.actor.to_env(action)

    # -- training -----------------------------------------------------------------------------------------
    def features(self, obs: Obs, state: Any, episode_starts: Tensor) -> CoreOutput:
        """Core features (B, T, d) of stored sequences, cutting rows at episode starts (see module docstring)."""
        x = self.encode(obs)
        b, t = x.shape[:2]
        starts = episode_starts.to(device=x.device, dtype=torch.bool)
        core = self.compiled_core if self.compiled_core is not None else self.core
        drop = {"return_state": False}  # the training pass drops the new state: the memory is not written
        if not self.core.stateful or t == 1:
            return core(x, state, reset=starts[:, 0], **drop)
        limit = self.core.segment_chunk_limit
        if self.core.segments and SEGMENT_PATH and (limit is None or t <= limit):
            # restarts masked inside the core: no cut, no host sync
            return core(x, state, starts=starts, **drop)
        if not bool(starts[:, 1:].any()):
            return core(x, state, reset=starts[:, 0], **drop)
        packing = Packing.from_starts(starts)  # data-dependent cut: eager, before the (compiled) core
        piece_state = state.index_select(packing.row)
        out = core(packing.pack(x), piece_state, reset=packing.reset, valid=packing.valid(), **drop)
        return CoreOutput(packing.unpack(out.y, b, t), None, out.aux_losses, out.info)

    def evaluate_sequence(
        self, obs: Obs, actions: Tensor, state: Any, episode_starts: Tensor
    ) -> SequenceOutput:
        """Log-probs, entropies and values of stored sequences in one pass.

        obs (B, T, ...), actions (B, T, *action_shape), state: the state before step 0 of each row (B rows),
        episode_starts (B, T) bool as recorded while acting.
        """
        out = self.features(obs, state, episode_starts)
        h_actor, h_critic = self.head_inputs(out.y)
        dist = self.actor(h_actor)
        value = self.critic(h_critic).squeeze(-1)
        return SequenceOutput(dist.log_prob(actions), dist.entropy(), value, out.aux_losses, out.info)

    @property
    def collect_info(self) -> bool:
        return self.core.collect_info

    @collect_info.setter
    def collect_info(self, value: bool) -> None:
        self.core.collect_info = value


__all__ = ["ActOutput", "ActorCritic", "SequenceOutput"]
