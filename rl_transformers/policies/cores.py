"""Sequence cores of the memory actor-critics: a chunk of tokens x (B, T, d_in) with a carried per-env state
-> features y (B, T, d_out).

:class:`Core` is the interface (``initial_state``, ``forward(x, state, reset, valid)``, ``segment_start``);
:class:`TransformerCore` streams the shared :class:`~rl_transformers.backbone.Backbone` chunk by chunk with its
own state; :class:`ContextCore` re-runs a non-streaming backbone over a window of past tokens at every step.
The LSTM / GRU / MLP baselines (:mod:`rl_transformers.policies.recurrent`) implement the same interface.

One-pass == step-by-step (what PPO relies on, see :mod:`rl_transformers.policies.actor_critic`) holds when a
query of the training pass sees exactly the keys it saw when acting. That is true of streaming attentions
(exact KV cache / linear state / windowed caches). Transformer-XL memory (Dai et al. 2019, arXiv 1901.02860)
alone is not: a one-pass query at offset i of a sequence sees mem_len + i keys, an acting step mem_len.
:func:`bounded_backbone` therefore limits full attention to ``mem_len`` past keys under XL memory, and to
``context_len`` past keys without memory (a KV cache keeps its columns across episodes, so an unbounded cache
would grow for the whole run); :func:`replay_exactness` says whether a configuration replays exactly.
Non-streaming attentions (capability ``streaming="none"``) run through :class:`ContextCore`: the policy keeps
the last ``context_len`` tokens plus the tokens of the current training segment, and recomputes the backbone
over them at every step.

Shapes: B envs (or sequences), T time steps, d = backbone.d_model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from rl_transformers.backbone.config import BackboneConfig
from rl_transformers.backbone.model import Backbone
from rl_transformers.backbone.registry import capabilities
from rl_transformers.backbone.state import State


# -- the interface --------------------------------------------------------------------------------------------------
@dataclass
class CoreOutput:
    y: Tensor
    """(B, T, d_out) features for the heads."""
    state: Any
    """State after the chunk."""
    aux_losses: dict[str, Tensor] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)


class Core(nn.Module):
    """Sequence core interface. ``forward`` resets rows only at the chunk start (``reset`` (B,) bool)."""

    d_in: int
    d_out: int
    stateful: bool = True
    """False for memory-less cores: sequences need no cutting at episode starts."""
    segments: bool = False
    """True when ``forward`` takes ``starts`` (B, T) bool and restarts rows inside the chunk itself
    (``Backbone.forward(starts=...)``), so stored sequences need no cutting into pieces."""
    segment_chunk_limit: int | None = None
    """With ``segments``: the longest chunk ``starts`` may come with (None: any); longer ones are cut."""

    def initial_state(self, batch: int, device: torch.device | str, dtype: torch.dtype) -> State:
        raise NotImplementedError

    def forward(
        self,
        x: Tensor,
        state: Any,
        reset: Tensor | None = None,
        valid: Tensor | None = None,
        *,
        return_state: bool = True,
    ) -> CoreOutput:
        """``return_state=False``: the caller drops the new state (a training pass), so a core may skip work
        that only the state needs and return None as the state."""
        raise NotImplementedError

    def segment_start(self, state: Any) -> Any:
        """Called by trainers at the first step of every training sequence (before the state is stored)."""
        return state

    def acting_state(self, state: Any) -> Any:
        """``state`` prepared for acting while the weights stay fixed (a rollout), e.g. with cached
        projections; call again after the weights change. Default: unchanged."""
        return state

    def plain_state(self, state: Any) -> Any:
        """``state`` without what :meth:`acting_state` added (what trainers store). Default: unchanged."""
        return state

    @property
    def collect_info(self) -> bool:
        return False

    @collect_info.setter
    def collect_info(self, value: bool) -> None:
        pass


def replay_exactness(cfg: BackboneConfig) -> tuple[bool, str]:
    """Whether a one-pass training sequence sees exactly the keys each acting step saw (and why not)."""
    streaming = capabilities("attention", cfg.attention).streaming
    if streaming == "none":
        return True, "non-streaming attention: recomputed over the policy's context segment"
    if cfg.memory is None:
        return True, f"attention {cfg.attention!r} streams ({streaming})"
    if cfg.memory != "xl":
        return False, f"memory {cfg.memory!r} depends on how the stream is chunked"
    mem_len = cfg.options("memory").mem_len
    window = getattr(cfg.options("attention"), "max_cache", None)
    if window is not None and window <= mem_len:
        return True, f"attention window {window} <= mem_len {mem_len}"
    return False, (
        f"attention {cfg.attention!r} under XL memory sees mem_len + i keys at offset i of a training sequence "
        f"but mem_len={mem_len} keys when acting (set its max_cache <= mem_len, or bound_context=True)"
    )


def bounded_backbone(cfg: BackboneConfig, context_len: int) -> BackboneConfig:
    """``cfg`` with a window on attentions that would otherwise see more when training than when acting."""
    opts = cfg.options("attention")
    if not any(f.name == "max_cache" for f in dataclasses.fields(opts)) or opts.max_cache is not None:
        return cfg
    if cfg.memory == "xl":
        window = cfg.options("memory").mem_len
    elif cfg.memory is None:
        window = context_len
    else:
        return cfg
    return dataclasses.replace(cfg, attention_options={**cfg.attention_options, "max_cache": window})


class TransformerCore(Core):
    """The shared :class:`Backbone`, streaming one chunk at a time with its own state."""

    def __init__(self, cfg: BackboneConfig) -> None:
        super().__init__()
        self.backbone = Backbone(cfg)
        self.d_in = self.d_out = cfg.d_model
        self.segments = type(self) is TransformerCore and self.backbone.segments_unsupported is None
        self.segment_chunk_limit = self.backbone.segment_chunk_limit

    def initial_state(self, batch: int, device: torch.device | str, dtype: torch.dtype) -> State:
        return self.backbone.init_state(batch, device, dtype)

    def acting_state(self, state: Any) -> Any:
        return self.backbone.project_memory(state)

    def plain_state(self, state: Any) -> Any:
        return self.backbone.unproject_memory(state)

    def forward(
        self,
        x: Tensor,
        state: Any,
        reset: Tensor | None = None,
        valid: Tensor | None = None,
        starts: Tensor | None = None,
        *,
        return_state: bool = True,
    ) -> CoreOutput:
        out = self.backbone(
            x, state=state, reset=reset, key_padding_mask=valid, starts=starts, return_state=return_state
        )
        return CoreOutput(out.y, out.state, out.aux_losses, out.info)

    @property
    def collect_info(self) -> bool:
        return self.backbone.collect_info

    @collect_info.setter
    def collect_info(self, value: bool) -> None:
        self.backbone.collect_info = value


@dataclass
class ContextState(State):
    """Recent input tokens x (B, S, d) and their validity (B, S) for non-streaming attentions."""

    x: Tensor
    valid: Tensor


class ContextCore(TransformerCore):
    """A backbone re-run over a context window of past tokens at every step (non-streaming attentions).

    The window holds the last ``context_len`` tokens before the current training segment plus the segment's
    tokens (at most ``2 * context_len``); :meth:`segment_start` trims it to ``context_len``. A training pass
    over the segment from the stored window then sees exactly what each acting step saw (for position schemes
    that depend on distances only). Tokens in the window are detached (like XL memory).
    """

    def __init__(self, cfg: BackboneConfig, context_len: int) -> None:
        super().__init__(cfg)
        self.context_len = context_len

    def initial_state(self, batch: int, device: torch.device | str, dtype: torch.dtype) -> ContextState:
        return ContextState(
            x=torch.zeros(batch, 0, self.d_in, device=device, dtype=dtype),
            valid=torch.zeros(batch, 0, dtype=torch.bool, device=device),
        )

    def forward(
        self,
        x: Tensor,
        state: Any,
        reset: Tensor | None = None,
        valid: Tensor | None = None,
        starts: Tensor | None = None,
        *,
        return_state: bool = True,
    ) -> CoreOutput:
        if starts is not None:
            raise ValueError("ContextCore does not restart rows inside a chunk (segments=False): cut them")
        if reset is not None:
            state = state.reset(reset.to(torch.bool))
        t = x.shape[1]
        if valid is None:
            valid = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
        seq = torch.cat([state.x.to(x.dtype), x], dim=1)
        mask = torch.cat([state.valid, valid.to(torch.bool)], dim=1)
        out = self.backbone(seq, key_padding_mask=mask)
        keep = seq.shape[1] if seq.shape[1] <= 2 * self.context_len else self.context_len
        new_state = ContextState(seq[:, -keep:].detach(), mask[:, -keep:])
        return CoreOutput(out.y[:, -t:], new_state, out.aux_losses, out.info)

    def segment_start(self, state: Any) -> Any:
        k = self.context_len
        return ContextState(state.x[:, -k:], state.valid[:, -k:])


# -- a critic with its own core ---------------------------------------------------------------------------------------
@dataclass
class TwinState(State):
    """The states of a :class:`TwinCore`'s two cores (row operations apply to both)."""

    actor: Any
    critic: Any


class TwinCore(Core):
    """Two cores of one kind side by side: the actor's and the critic's (``PolicyConfig.critic="separate"``).

    Their features are concatenated, y = [y_actor, y_critic] (B, T, 2 d): :class:`~rl_transformers.policies.
    actor_critic.ActorCritic` gives the first half to the actor head and the second to the critic head, as
    sb3-contrib's ``RecurrentPPO`` does by default (``enable_critic_lstm=True``). The critic's core reads the
    observation encoder's features detached, so the value loss trains the critic's core and head only, and the
    policy loss never reaches them. Both cores see the same chunk, resets and segment starts, and cut or stream
    alike (the flags are the actor's); their aux losses of one name are summed. Costs two cores' forward.
    """

    def __init__(self, actor: Core, critic: Core) -> None:
        super().__init__()
        if (actor.d_in, actor.d_out, type(actor)) != (critic.d_in, critic.d_out, type(critic)):
            raise ValueError("TwinCore needs two cores of the same kind and widths")
        self.actor, self.critic = actor, critic
        self.d_in, self.d_out = actor.d_in, 2 * actor.d_out
        self.stateful, self.segments = actor.stateful, actor.segments
        self.segment_chunk_limit = actor.segment_chunk_limit

    def initial_state(self, batch: int, device: torch.device | str, dtype: torch.dtype) -> TwinState:
        return TwinState(
            self.actor.initial_state(batch, device, dtype), self.critic.initial_state(batch, device, dtype)
        )

    def forward(self, x: Tensor, state: Any, *args: Any, **kwargs: Any) -> CoreOutput:
        a = self.actor(x, state.actor, *args, **kwargs)
        c = self.critic(x.detach(), state.critic, *args, **kwargs)  # the encoder is the actor's
        aux = dict(a.aux_losses)
        for name, loss in c.aux_losses.items():
            aux[name] = aux[name] + loss if name in aux else loss
        new_state = None if a.state is None and c.state is None else TwinState(a.state, c.state)
        return CoreOutput(torch.cat([a.y, c.y], dim=-1), new_state, aux, a.info)

    def segment_start(self, state: Any) -> Any:
        return TwinState(self.actor.segment_start(state.actor), self.critic.segment_start(state.critic))

    def acting_state(self, state: Any) -> Any:
        return TwinState(self.actor.acting_state(state.actor), self.critic.acting_state(state.critic))

    def plain_state(self, state: Any) -> Any:
        return TwinState(self.actor.plain_state(state.actor), self.critic.plain_state(state.critic))

    @property
    def collect_info(self) -> bool:
        return self.actor.collect_info

    @collect_info.setter
    def collect_info(self, value: bool) -> None:
        self.actor.collect_info = value  # diagnostics (info) are the actor's


__all__ = [
    "ContextCore",
    "ContextState",
    "Core",
    "CoreOutput",
    "TransformerCore",
    "TwinCore",
    "TwinState",
    "bounded_backbone",
    "replay_exactness",
]
