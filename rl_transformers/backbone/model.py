"""Backbone: embeddings in, a stack of blocks (under a depth controller), embeddings out.

``Backbone(cfg)(x, state=None, reset=None, key_padding_mask=None)`` maps x (B, T, d) to
``BackboneOutput(y (B, T, d), state, aux_losses, info)``. The state carries per-row positions (tokens seen
since the last reset), one attention state per layer (a KV cache, a linear-attention (S, z), ...) or the memory
module's state, and the depth controller's state. It is returned, never stored on the module, so callers (PPO
with many envs, DT rollouts) keep, slice, reset and detach it themselves.

``reset`` (B,) bool clears rows before this chunk (an episode starts); ``key_padding_mask`` (B, T) bool marks
real tokens (False = padding: never attended to by other tokens). ``starts`` (B, T) bool restarts rows inside
the chunk: a token with ``starts`` True and the tokens after it see neither the state nor the earlier tokens,
and their positions count from 0 there, as if the chunk had been cut at the start and the rest run from a reset
state (``starts[:, 0]`` acts as ``reset``). Only backbones whose parts support it take it
(:attr:`Backbone.segments_unsupported`); PPO re-runs stored sequences this way instead of packing their pieces.
``return_state=False`` tells the backbone the caller drops the new state (a training pass over stored
sequences): the memory's write is skipped unless it also makes losses (``compressive``'s) or diagnostics are
collected (``collect_info``: the memory's fill), and ``state`` is None. The outputs and losses are those of
``return_state=True``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import Tensor, nn

from rl_transformers.backbone import registry
from rl_transformers.backbone.blocks import Block
from rl_transformers.backbone.config import BackboneConfig
from rl_transformers.backbone.context import ForwardContext
from rl_transformers.backbone.memory.xl import XLMemory
from rl_transformers.backbone.state import BackboneState


@dataclass
class BackboneOutput:
    y: Tensor
    """(B, T, d) output hidden states."""
    state: BackboneState | None
    """State to pass to the next chunk (None when the forward was called with ``return_state=False``)."""
    aux_losses: dict[str, Tensor] = field(default_factory=dict)
    """Named auxiliary losses (unweighted; the trainer weights them)."""
    info: dict[str, Any] = field(default_factory=dict)
    """Diagnostics (filled only when ``backbone.collect_info`` is True)."""


class Backbone(nn.Module):
    """The shared encoder stack. See the module docstring and docs/design.md."""

    def __init__(self, cfg: BackboneConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.collect_info = False
        self.position = registry.get("position", cfg.position).cls(cfg, cfg.options("position"))
        attention_cls = registry.get("attention", cfg.attention).cls
        block_cls = registry.get("block", cfg.block).cls
        attention_options, block_options = cfg.options("attention"), cfg.options("block")

        def make_block(layer: int) -> Block:
            attention = attention_cls(cfg, attention_options, self.position, layer)
            return block_cls(cfg, block_options, attention, layer)

        self.depth = registry.get("depth", cfg.depth).cls(cfg, cfg.options("depth"), make_block)
        self.memory = (
            registry.get("memory", cfg.memory).cls(cfg, cfg.options("memory")) if cfg.memory else None
        )
        self.final_norm: nn.Module = nn.LayerNorm(cfg.d_model) if block_cls.final_norm else nn.Identity()
        self._read_visible = isinstance(self.memory, XLMemory) and attention_cls.drops_invalid_keys
        """Read only the XL memory columns some row can see (eager forwards; ``XLMemory.read_visible``)."""
        self._segments_unsupported = self._segments_reason()

    # -- state ------------------------------------------------------------------------------------------------
    def init_state(
        self, batch_size: int, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> BackboneState:
        """The empty state for ``batch_size`` rows."""
        if device is None or dtype is None:
            p = next(self.parameters())
            device = p.device if device is None else device
            dtype = p.dtype if dtype is None else dtype
        device = torch.device(device)
        if self.memory is not None:
            layers: tuple[Any, ...] = (None,) * self.depth.n_applications
            memory = self.memory.init_state(batch_size, device, dtype)
        else:
            layers = tuple(
                self.depth.attention_for(i).init_state(batch_size, device, dtype)
                for i in range(self.depth.n_applications)
            )
            memory = None
        return BackboneState(
            pos=torch.zeros(batch_size, dtype=torch.long, device=device),
            layers=layers,
            memory=memory,
            depth=self.depth.init_state(batch_size, device, dtype),
        )

    def project_memory(self, state: BackboneState) -> BackboneState:
        """``state`` with its memory's key / value projections cached (XL memory), for acting while the
        weights stay fixed (a rollout): each step then projects only its new tokens. Forwards with gradients
        ignore the cache; call again after the weights change, :meth:`unproject_memory` before storing. The
        ``knn`` memory also takes a private copy of its store that acting steps write in place
        (``KNNMemoryState.owned``): a state passed to such a step is spent; ``state`` itself is not changed."""
        if self.memory is None or state.memory is None:
            return state
        attentions = [self.depth.attention_for(i) for i in range(self.depth.n_applications)]
        with torch.no_grad():
            memory = self.memory.with_projections(state.memory, attentions)
        return dataclasses.replace(state, memory=memory)

    def unproject_memory(self, state: BackboneState) -> BackboneState:
        """``state`` without the cached projections of :meth:`project_memory`."""
        if self.memory is None or state.memory is None:
            return state
        return dataclasses.replace(state, memory=self.memory.without_projections(state.memory))

    @property
    def segments_unsupported(self) -> str | None:
        """Why ``forward(starts=...)`` is refused (None: supported): the attention must mask by segment
        (``Attention.masks_segments``), the memory segment-aware (``Memory.segments_unsupported``: ``xl``,
        ``knn``, ``compressive`` except ``most_used``), the depth ``fixed``, the block not ``reversible``. Decided
        once, at construction (no work inside a traced forward)."""
        return self._segments_unsupported

    @property
    def segment_chunk_limit(self) -> int | None:
        """Longest chunk ``forward(starts=...)`` takes (None: any): ``compressive`` handles restarts in chunks
        of at most ``mem_len`` tokens (``Memory.segment_chunk_limit``); trainers cut longer ones."""
        return None if self.memory is None else self.memory.segment_chunk_limit(self.memory.options)

    def _segments_reason(self) -> str | None:
        cfg = self.cfg
        if not registry.get("attention", cfg.attention).cls.masks_segments(cfg.options("attention")):
            return f"attention {cfg.attention!r} (with these options) does not mask by segment"
        if self.memory is not None and (why := self.memory.segments_unsupported(self.memory.options)):
            return f"memory {cfg.memory!r}: {why}"
        if cfg.depth != "fixed" or cfg.block == "reversible":
            return f"depth {cfg.depth!r} / block {cfg.block!r} is not segment-aware"
        return None

    # -- forward ----------------------------------------------------------------------------------------------
    def forward(
        self,
        x: Tensor,
        state: BackboneState | None = None,
        reset: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        starts: Tensor | None = None,
        return_state: bool = True,
    ) -> BackboneOutput:
        if x.dim() != 3 or x.shape[-1] != self.cfg.d_model:
            raise ValueError(f"expected x of shape (B, T, {self.cfg.d_model}), got {tuple(x.shape)}")
        b, t, _ = x.shape
        if state is None:
            state = self.init_state(b, x.device, x.dtype)
        segment = None
        if starts is not None:
            if (reason := self.segments_unsupported) is not None:
                raise ValueError(f"starts (restarts inside a chunk) is not supported here: {reason}")
            if (limit := self.segment_chunk_limit) is not None and t > limit:
                raise ValueError(
                    f"starts (restarts inside a chunk) with memory {self.cfg.memory!r} takes chunks of at most "
                    f"{limit} tokens, got {t}: cut the chunk"
                )
            starts = starts.to(torch.bool)
            reset = starts[:, 0] if reset is None else reset.to(torch.bool) | starts[:, 0]
            segment = starts.long().cumsum(1)
        if reset is not None:
            state = state.reset(reset.to(torch.bool))
        valid = (
            torch.ones(b, t, dtype=torch.bool, device=x.device)
            if key_padding_mask is None
            else key_padding_mask.to(torch.bool)
        )
        steps = torch.arange(t, device=x.device)
        pos = state.pos[:, None] + steps
        if starts is not None:  # positions count from each row's last start (cummax: no host sync)
            last = torch.where(starts, steps, -1).cummax(1).values
            pos = torch.where(last >= 0, steps - last, pos)
        ctx = ForwardContext(
            pos=pos,
            valid=valid,
            causal=self.cfg.causal,
            all_valid=key_padding_mask is None,
            aligned=self.memory is None or self.memory.aligned_positions,
            info={} if self.collect_info else None,
            memory=self._read_memory(state.memory),
            embed=self.position.embed if self.position.kind == "input" else None,
            segment=segment,
        )
        ctx.extras["memory_state"] = state.memory
        h, layers, depth_state = self.depth(x, ctx, state.layers, state.depth)
        y = self.final_norm(h)
        memory = None
        if self.memory is not None and (return_state or self.memory.aux_losses or ctx.collect_info):
            memory = self.memory.write(state.memory, ctx)
        if not return_state:
            return BackboneOutput(y=y, state=None, aux_losses=ctx.aux, info=ctx.info or {})
        new_pos = state.pos + t if starts is None else pos[:, -1] + 1
        new_state = BackboneState(pos=new_pos, layers=layers, memory=memory, depth=depth_state)
        return BackboneOutput(y=y, state=new_state, aux_losses=ctx.aux, info=ctx.info or {})

    def _read_memory(self, memory_state: Any) -> list[Any] | None:
        if self.memory is None:
            return None
        if self._read_visible and not torch.compiler.is_compiling():  # compiled: static widths
            return cast(XLMemory, self.memory).read_visible(memory_state)
        return self.memory.read(memory_state)


def build_backbone(cfg: BackboneConfig) -> Backbone:
    """Same as ``Backbone(cfg)``."""
    return Backbone(cfg)
