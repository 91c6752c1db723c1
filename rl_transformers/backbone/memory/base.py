"""The memory interface every ``memory`` entry implements.

A memory module keeps, in its state, what later chunks may attend to. Before the stack runs, :meth:`read` gives
one :class:`~rl_transformers.backbone.context.MemoryContext` per layer application (hidden states prepended on
the key/value side, with their positions and validity); after the stack, :meth:`write` builds the next state
from ``ctx.attention_inputs`` (the inputs of each attention application in this forward). When a memory is
configured, attention layers keep no KV cache of their own: the memory is the only carried context.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from rl_transformers.backbone.context import ForwardContext, MemoryContext


class Memory(nn.Module):
    Options: ClassVar[type]
    registry_name: ClassVar[str]
    aux_losses: ClassVar[tuple[str, ...]] = ()
    """Names the memory adds to ``BackboneOutput.aux_losses``, at :meth:`write` (so a memory with losses is
    written even when the caller drops the state)."""
    segment_aware: ClassVar[bool] = False
    """Whether :meth:`write` handles ``ctx.segment`` (rows restarted inside the chunk, ``Backbone.forward(
    starts=...)``): each restarted row's returned state holds its last segment only, and losses made at the
    write equal those of the row's pieces run apart. :meth:`segments_unsupported` may refuse some options."""
    aligned_positions: ClassVar[bool] = False
    """True when the memory's columns are time-aligned with positions counted since reset, so key positions
    follow the column distance wherever keys are valid (``ForwardContext.aligned``)."""

    def __init__(self, cfg: Any, options: Any) -> None:
        super().__init__()
        self.cfg = cfg
        self.options = options

    def init_state(self, batch: int, device: torch.device | None, dtype: torch.dtype) -> Any:
        raise NotImplementedError

    def read(self, state: Any) -> list[MemoryContext | None]:
        raise NotImplementedError

    def write(self, state: Any, ctx: ForwardContext) -> Any:
        raise NotImplementedError

    @classmethod
    def segments_unsupported(cls, options: Any) -> str | None:
        """Why chunks with restarts are refused with these options (None: supported)."""
        return None if cls.segment_aware else "it is not segment-aware"

    @classmethod
    def segment_chunk_limit(cls, options: Any) -> int | None:
        """Longest chunk with restarts :meth:`write` handles (None: any); longer ones are cut and packed."""
        return None

    def with_projections(self, state: Any, attentions: list[Any]) -> Any:
        """``state`` with the key / value projections of its memory cached for acting (default: unchanged)."""
        return state

    def without_projections(self, state: Any) -> Any:
        """``state`` without cached projections (default: unchanged)."""
        return state

    @classmethod
    def check_config(cls, cfg: Any, options: Any) -> None:
        from rl_transformers.backbone import registry

        kind = registry.get("position", cfg.position).cls.kind
        if kind == "input":
            raise ValueError(
                f"memory {cls.registry_name!r} cannot use the absolute position scheme {cfg.position!r}: memory "
                "tokens would reuse positions. Use a relative scheme: xl_relative, rope, alibi, t5, ..."
            )
        if not cfg.causal:
            raise ValueError(f"memory {cls.registry_name!r} needs causal=True (memory holds the past)")
