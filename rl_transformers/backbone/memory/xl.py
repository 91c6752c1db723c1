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

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rl_transformers.backbone.context import ForwardContext, MemoryContext
from rl_transformers.backbone.memory.base import Memory
from rl_transformers.backbone.registry import Capabilities, register
from rl_transformers.backbone.state import State, zero_rows


@dataclass
class XLMemoryState(State):
    """h: (B, L, M, d) per-layer memories; pos: (B, M); valid: (B, M). Columns are time-aligned.

    k, v: (B, L, M, d) each layer's key / value projections of h, or None. Cached for acting only
    (``Backbone.project_memory``: valid while the weights do not change, e.g. one rollout); a forward with
    gradients ignores them and projects h. kf: (B, L, H, M, F) each layer's key features, cached with them
    when every layer's attention is a feature-map attention (``Attention.memory_key_features``), else None.
    """

    h: Tensor
    pos: Tensor
    valid: Tensor
    k: Tensor | None = None
    v: Tensor | None = None
    kf: Tensor | None = None

    def reset(self, mask: Tensor | None) -> XLMemoryState:
        """Rows where ``mask`` is True lose their memory: validity and positions are cleared, the hidden states
        (and projections) are kept, since an invalid column is never attended: its softmax weight is exactly 0,
        so its (finite) key and value add exact zeros to outputs and gradients. Saves copying the whole memory
        at every acting step (resets are masked arithmetic applied at every step)."""
        if mask is None:
            return self
        return dataclasses.replace(self, pos=zero_rows(self.pos, mask), valid=zero_rows(self.valid, mask))


@dataclass(frozen=True)
class XLOptions:
    mem_len: int = 64
    """M: hidden states kept per layer."""

    def __post_init__(self) -> None:
        if self.mem_len < 1:
            raise ValueError(f"mem_len must be >= 1, got {self.mem_len!r}")


TRIM_INVALID = True
"""``XLMemory.read_visible`` drops the columns invalid in every row; False: it reads them all (tests and
timings compare the two)."""


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
    segment_aware = True

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
        k, v, kf = state.k, state.v, state.kf
        return [
            MemoryContext(
                state.h[:, i],
                state.pos,
                state.valid,
                k=None if k is None else k[:, i],
                v=None if v is None else v[:, i],
                kf=None if kf is None else kf[:, i],
            )
            for i in range(state.h.shape[1])
        ]

    def read_visible(self, state: XLMemoryState) -> list[MemoryContext | None]:
        """:meth:`read` without the oldest columns that are invalid in every row (columns are time-aligned and
        a reset invalidates a row's whole memory, so these are all the columns no query can see once episodes
        are shorter than the memory). Only for attentions whose result does not depend on keys masked for
        every query (``Attention.drops_invalid_keys``): the same sums without exact zeros. The width depends
        on the data (a host sync), so compiled forwards read the full width."""
        m = state.valid.shape[1]
        if not TRIM_INVALID or m == 0:
            return self.read(state)
        any_valid = state.valid.any(0)
        cut = int(any_valid.to(torch.uint8).argmax()) if bool(any_valid.any()) else m
        if cut == 0:
            return self.read(state)
        k, v, kf = state.k, state.v, state.kf
        return self.read(
            XLMemoryState(
                h=state.h[:, :, cut:],
                pos=state.pos[:, cut:],
                valid=state.valid[:, cut:],
                k=None if k is None else k[:, :, cut:],
                v=None if v is None else v[:, :, cut:],
                kf=None if kf is None else kf[:, :, :, cut:],
            )
        )

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
        projections = ctx.extras.get("memory_projections")
        if state.k is not None and state.v is not None and projections is not None:
            n = state.h.shape[1]  # the new tokens' projections, computed by the attentions of this forward
            new_k = torch.stack([projections[i][0] for i in range(n)], dim=1).to(state.k.dtype)
            new_v = torch.stack([projections[i][1] for i in range(n)], dim=1).to(state.v.dtype)
            out.k = append_window(state.k, new_k, 2, m)
            out.v = append_window(state.v, new_v, 2, m)
            if state.kf is not None:
                new_kf = torch.stack([projections[i][2] for i in range(n)], dim=1).to(state.kf.dtype)
                out.kf = append_window(state.kf, new_kf, 3, m)
        if ctx.collect_info:
            ctx.add_info("backbone/memory_fill", out.valid.float().mean(1).mean().detach())
        return out

    def with_projections(self, state: XLMemoryState, attentions: list[Any]) -> XLMemoryState:
        """Each layer's k_proj / v_proj of its memory h, cached in the state (acting with fixed weights: a
        step then projects its new tokens only, and ``write`` appends their projections)."""
        if len(attentions) != state.h.shape[1]:
            return state
        k = torch.stack([att.k_proj(state.h[:, i]) for i, att in enumerate(attentions)], dim=1)
        v = torch.stack([att.v_proj(state.h[:, i]) for i, att in enumerate(attentions)], dim=1)
        features = [att.memory_key_features(k[:, i], state.pos) for i, att in enumerate(attentions)]
        kf = None if any(f is None for f in features) else torch.stack(features, dim=1)  # type: ignore[misc]
        return dataclasses.replace(state, k=k, v=v, kf=kf)

    def without_projections(self, state: XLMemoryState) -> XLMemoryState:
        return dataclasses.replace(state, k=None, v=None, kf=None)

    @property
    def window(self) -> int:
        return self.options.mem_len

    @classmethod
    def check_config(cls, cfg: Any, options: Any) -> None:
        super().check_config(cfg, options)
