"""``mingru``: the minimal GRU (Feng et al. 2024, "Were RNNs All We Needed?", arXiv 2410.01201).

The gate and the candidate depend on the current input only, so the recurrence is linear in h:

    z_t = σ(W_z x_t + b_z),   h̃_t = g(W_h x_t + b_h),   h_t = (1 - z_t) ⊙ h_{t-1} + z_t ⊙ h̃_t,

with g(v) = v + 1/2 for v ≥ 0 and σ(v) otherwise (the paper's positive candidate of its log-space version,
Appendix B.3), over d_inner = expansion · d_model channels, then y_t = W_o h_t (the identity when
expansion = 1). The paper evaluates the recurrence with a log-space scan; here it is the shared associative
scan (``_scan.linear_scan``), which computes the same h without logarithms (it only multiplies and adds, so it
is as stable and also takes a_t = 0 at an episode start). Acting is the same recurrence over one token; the
state is h (B, d_inner) in at least float32 (:class:`MinGRUState`). Cost: O(T·d·d_inner) for the projections,
O(T·d_inner·log C) for the scan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from rl_transformers.backbone.attention._scan import (
    RecurrentMixer,
    check_positive,
    gate_inputs,
    linear_scan,
    work_dtype,
)
from rl_transformers.backbone.context import ForwardContext
from rl_transformers.backbone.position.base import Position
from rl_transformers.backbone.registry import Capabilities, register
from rl_transformers.backbone.state import State


@dataclass
class MinGRUState(State):
    """h: (B, d_inner) the hidden state; all zeros when empty."""

    h: Tensor


@dataclass(frozen=True)
class MinGRUOptions:
    expansion: float = 1.0
    """d_inner = round(expansion · d_model) hidden channels; an output projection when expansion != 1."""
    chunk_size: int = 64
    """C: tokens per chunk of the parallel scan (a schedule: the result does not depend on it)."""

    def __post_init__(self) -> None:
        check_positive("chunk_size", self.chunk_size)
        if not (isinstance(self.expansion, (int, float)) and self.expansion > 0):
            raise ValueError(f"expansion must be a positive number, got {self.expansion!r}")


def candidate(v: Tensor) -> Tensor:
    """g(v) = v + 1/2 (v ≥ 0), σ(v) (v < 0): continuous, positive."""
    return torch.where(v >= 0, v + 0.5, torch.sigmoid(v))


@register(
    "attention",
    "mingru",
    options=MinGRUOptions,
    capabilities=Capabilities(causal=True, exact=False, streaming="exact", noncausal=False),
)
class MinGRUMixer(RecurrentMixer):
    """minGRU as a token mixer (see the module docstring)."""

    def __init__(self, cfg: Any, options: MinGRUOptions, position: Position, layer: int) -> None:
        super().__init__(cfg, options, position, layer)
        d = cfg.d_model
        self.d_inner = max(1, round(options.expansion * d))
        self.in_proj = nn.Linear(d, 2 * self.d_inner)
        """(candidate pre-activation, gate pre-activation), in that order."""
        self.out_proj: nn.Module = nn.Linear(self.d_inner, d) if self.d_inner != d else nn.Identity()

    def init_state(self, batch: int, device: torch.device | None, dtype: torch.dtype) -> MinGRUState:
        return MinGRUState(h=torch.zeros(batch, self.d_inner, device=device, dtype=work_dtype(dtype)))

    def forward(self, x: Tensor, ctx: ForwardContext, state: Any = None) -> tuple[Tensor, Any]:
        self.enter(x, ctx)
        wd = work_dtype(x.dtype)
        hidden, gate = self.in_proj(x).to(wd).chunk(2, dim=-1)
        z = torch.sigmoid(gate)
        a, b = gate_inputs(torch.sigmoid(-gate), z * candidate(hidden), ctx)  # 1 - z, without cancellation
        h0 = state.h.to(wd) if isinstance(state, MinGRUState) else None
        h = linear_scan(a, b, h0, self.options.chunk_size)
        new_state = MinGRUState(h=h[:, -1].to(state.h.dtype)) if isinstance(state, MinGRUState) else state
        return self.out_proj(h.to(x.dtype)), new_state
