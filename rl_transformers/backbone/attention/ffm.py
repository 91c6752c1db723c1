"""``ffm``: fast and forgetful memory (Morad et al. 2023, arXiv 2310.04128), an RL memory model.

An input-gated trace of m channels is aggregated over time with complex decays over c "contexts", then read
out through a gated skip connection:

    (p_t, i_t, o_t, s_t) = W_pre x_t + b_pre                   (m, m, d, d)
    x̃_t = p_t ⊙ σ(i_t)                                         (input gate)
    S_t = γ ⊙ S_{t-1} + x̃_t 1_c^T,   γ = exp(-|α| 1_c^T + i 1_m ω^T)   (m × c complex: learned α ∈ R^m forgetting,
                                                                         ω ∈ R^c frequencies)
    z_t = W_mix [Re S_t, Im S_t] + b_mix                      (d)
    y_t = LN(z_t) ⊙ σ(o_t) + s_t ⊙ (1 - σ(o_t))               (output gate)

so S_t = Σ_{j≤t} γ^{t-j} x̃_j: every trace channel forgets at its own rate and every context rotates at its
own frequency. Initialisation (a choice of this implementation): trace j keeps 1 % of an input after a
horizon h_j, the horizons log-spaced over [min_period, max_period] (α_j = ln(100) / h_j); context k turns once
per period p_k, the periods log-spaced over the same range (ω_k = 2π / p_k). A window runs as one parallel
scan (``_scan.linear_scan``); an episode start inside it sets the step's γ to 0. The state (:class:`FFMState`)
is S (B, m, c) as (real, imaginary) pairs in at least float32. Cost: O(T·d·(m + d) + T·m·c·d) for the
projections, O(T·m·c·log C) for the scan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
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
class FFMState(State):
    """s: (B, m, c, 2) the complex aggregate S as (real, imaginary) pairs; all zeros when empty."""

    s: Tensor


@dataclass(frozen=True)
class FFMOptions:
    memory_size: int = 32
    """m: trace channels (each with its own forgetting rate α)."""
    context_size: int = 4
    """c: contexts (each with its own frequency ω)."""
    min_period: float = 1.0
    """Shortest horizon / period at initialisation (tokens)."""
    max_period: float = 1024.0
    """Longest horizon / period at initialisation (tokens)."""
    chunk_size: int = 64
    """C: tokens per chunk of the parallel scan (a schedule: the result does not depend on it)."""

    def __post_init__(self) -> None:
        for name in ("memory_size", "context_size", "chunk_size"):
            check_positive(name, getattr(self, name))
        if not 0 < self.min_period <= self.max_period:
            raise ValueError(
                f"need 0 < min_period <= max_period, got min_period={self.min_period!r}, "
                f"max_period={self.max_period!r}"
            )


@register(
    "attention",
    "ffm",
    options=FFMOptions,
    capabilities=Capabilities(causal=True, exact=False, streaming="exact", noncausal=False),
)
class FFMMixer(RecurrentMixer):
    """Fast and forgetful memory as a token mixer (see the module docstring)."""

    def __init__(self, cfg: Any, options: FFMOptions, position: Position, layer: int) -> None:
        super().__init__(cfg, options, position, layer)
        d, m, c = cfg.d_model, options.memory_size, options.context_size
        self.m, self.c = m, c
        self.pre = nn.Linear(d, 2 * m + 2 * d)
        """(trace p, input gate i, output gate o, skip s), in that order."""
        self.mix = nn.Linear(2 * m * c, d)
        self.ln = nn.LayerNorm(d)
        lo, hi = math.log(options.min_period), math.log(options.max_period)
        horizons = torch.exp(torch.linspace(lo, hi, m))
        periods = torch.exp(torch.linspace(lo, hi, c))
        self.alpha = nn.Parameter(math.log(100.0) / horizons)
        self.omega = nn.Parameter(2 * math.pi / periods)

    def init_state(self, batch: int, device: torch.device | None, dtype: torch.dtype) -> FFMState:
        return FFMState(s=torch.zeros(batch, self.m, self.c, 2, device=device, dtype=work_dtype(dtype)))

    def decay(self, dtype: torch.dtype) -> Tensor:
        """γ (m, c) complex in ``dtype``'s precision."""
        mag = torch.exp(-self.alpha.to(dtype).abs())[:, None].expand(self.m, self.c)
        return torch.polar(mag, self.omega.to(dtype)[None, :].expand(self.m, self.c))

    def forward(self, x: Tensor, ctx: ForwardContext, state: Any = None) -> tuple[Tensor, Any]:
        self.enter(x, ctx)
        wd = work_dtype(x.dtype)
        m, d = self.m, x.shape[-1]
        p, i, o, s = self.pre(x).to(wd).split([m, m, d, d], dim=-1)
        trace = (p * torch.sigmoid(i))[..., None].expand(*p.shape, self.c)
        b = torch.complex(trace, torch.zeros_like(trace))  # (B, T, m, c)
        gamma = self.decay(wd)
        a, b = gate_inputs(gamma.expand_as(b), b, ctx)
        carried = isinstance(state, FFMState)
        h0 = torch.view_as_complex(state.s.to(wd).contiguous()) if carried else None
        agg = linear_scan(a, b, h0, self.options.chunk_size)  # (B, T, m, c)
        flat = torch.cat([agg.real, agg.imag], dim=-1).flatten(-2)  # (B, T, 2·m·c)
        z = F.linear(flat, self.mix.weight.to(wd), self.mix.bias.to(wd))
        z = F.layer_norm(z, (d,), self.ln.weight.to(wd), self.ln.bias.to(wd), self.ln.eps)
        gate = torch.sigmoid(o)
        y = (z * gate + s * (1 - gate)).to(x.dtype)
        if not carried:
            return y, state
        return y, FFMState(s=torch.view_as_real(agg[:, -1]).to(state.s.dtype))
