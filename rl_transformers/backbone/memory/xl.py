"""``xl``: Transformer-XL segment-level recurrence (Dai et al. 2019, arXiv 1901.02860).

Each layer l keeps the last ``mem_len`` hidden states that entered its attention (after the block's input norm), (B, M, d), with stop-gradient, and
prepends them on the key/value side of its attention: h̃ = [SG(m^{l}) ; h^{l}], k, v = h̃ W_k, h̃ W_v. Positions
continue across segments (memory tokens keep their positions), so any relative scheme (xl_relative, rope,
alibi, t5, ...) works; absolute schemes are refused. ``reset`` marks a row's memory invalid. Memory length
(how far back the policy sees) and the training window (how far gradients flow, chosen by the trainer) are
separate knobs. A chunked run equals a full run under the banded causal mask "key j visible from query t iff
seg_start(t) - M <= j <= t" (tested); with M >= sequence length it equals full causal attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rl_transformers.backbone.context import ForwardContext, MemoryContext
from rl_transformers.backbone.memory.base import Memory
from rl_transformers.backbone.registry import Capabilities, register
from rl_transformers.backbone.state import State


@dataclass
class XLMemoryState(State):
    """h: (B, L, M, d) per-layer memories; pos: (B, M); valid: (B, M). Columns are time-aligned."""

    h: Tensor
    pos: Tensor
    valid: Tensor


@dataclass(frozen=True)
class XLOptions:
    mem_len: int = 64
    """M: hidden states kept per layer."""

    def __post_init__(self) -> None:
        if self.mem_len < 1:
            raise ValueError(f"mem_len must be >= 1, got {self.mem_len!r}")


def append_window(old: Tensor, new: Tensor, dim: int, keep: int) -> Tensor:
    """Concatenate along ``dim`` and keep the last ``keep`` entries."""
    both = torch.cat([old, new], dim=dim)
    return both.narrow(dim, max(0, both.shape[dim] - keep), min(keep, both.shape[dim]))


@register(
    "memory",
    "xl",
    options=XLOptions,
    capabilities=Capabilities(causal=True, exact=True, streaming="window", noncausal=False),
)
class XLMemory(Memory):
    aligned_positions = True

    def init_state(self, batch: int, device: torch.device | None, dtype: torch.dtype) -> XLMemoryState:
        """M invalid columns: the state has one shape for the whole stream (a compiled step never sees a new
        one), and invalid keys are never attended, so this equals an empty memory that grows to M."""
        n, m = self.cfg.n_layers, self.options.mem_len
        return XLMemoryState(
            h=torch.zeros(batch, n, m, self.cfg.d_model, device=device, dtype=dtype),
            pos=torch.zeros(batch, m, dtype=torch.long, device=device),
            valid=torch.zeros(batch, m, dtype=torch.bool, device=device),
        )

    def read(self, state: XLMemoryState) -> list[MemoryContext | None]:
        return [MemoryContext(state.h[:, i], state.pos, state.valid) for i in range(state.h.shape[1])]

    def write(self, state: XLMemoryState, ctx: ForwardContext) -> XLMemoryState:
        m = self.options.mem_len
        new_h = torch.stack([h.detach() for h in ctx.attention_inputs[: state.h.shape[1]]], dim=1)
        old_valid, new_valid = state.valid, ctx.valid
        if ctx.segment is not None:  # rows restarted inside the chunk keep their last segment only
            last = ctx.segment[:, -1:]
            old_valid, new_valid = old_valid & (last == 0), new_valid & (ctx.segment == last)
        out = XLMemoryState(
            h=append_window(state.h, new_h.to(state.h.dtype), 2, m),
            pos=append_window(state.pos, ctx.pos, 1, m),
            valid=append_window(old_valid, new_valid, 1, m),
        )
        if ctx.collect_info:
            ctx.add_info("backbone/memory_fill", out.valid.float().mean(1).mean().detach())
        return out

    @property
    def window(self) -> int:
        return self.options.mem_len

    @classmethod
    def check_config(cls, cfg: Any, options: Any) -> None:
        super().check_config(cfg, options)
