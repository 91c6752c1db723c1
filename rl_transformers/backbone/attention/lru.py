"""``lru``: the linear recurrent unit (Orvieto et al. 2023, arXiv 2303.06349).

A complex diagonal linear recurrence over N state channels, with input u_t (the block's normalised input, d):

    h_t = λ ⊙ h_{t-1} + γ ⊙ (B u_t),        y_t = Re(C h_t) + D ⊙ u_t,
    λ = exp(-exp(ν) + i·exp(θ)),             γ = exp(γ_log) (initialised to sqrt(1 - |λ|²)),

with B (N × d) and C (d × N) complex, D (d) real. The exponential parametrisation keeps |λ| < 1 (stable) and
the normalisation γ keeps the state's scale at initialisation independent of how close |λ| is to 1. Ring
initialisation: |λ|² uniform on [r_min², r_max²], arg λ uniform on [0, max_phase] (the paper's Appendix A).

A window runs as one parallel scan (``_scan.linear_scan``); acting is the same scan over one token. The state
is h (B, N) stored as (real, imaginary) pairs in at least float32 (:class:`LRUState`); an episode start inside
the window sets the step's λ to 0 there. Cost: O(T·N·d) for the projections, O(T·N·log C) for the scan.
"""

from __future__ import annotations

import math
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
class LRUState(State):
    """h: (B, N, 2) the complex state as (real, imaginary) pairs; all zeros when empty."""

    h: Tensor


@dataclass(frozen=True)
class LRUOptions:
    d_state: int | None = None
    """N: complex state channels (None = d_model)."""
    r_min: float = 0.0
    """Smallest |λ| at initialisation."""
    r_max: float = 1.0
    """Largest |λ| at initialisation (the draw is kept below 1)."""
    max_phase: float = 2 * math.pi
    """arg λ is drawn uniformly on [0, max_phase]."""
    chunk_size: int = 64
    """C: tokens per chunk of the parallel scan (a schedule: the result does not depend on it)."""

    def __post_init__(self) -> None:
        if self.d_state is not None:
            check_positive("d_state", self.d_state)
        check_positive("chunk_size", self.chunk_size)
        if not 0.0 <= self.r_min < self.r_max <= 1.0:
            raise ValueError(f"need 0 <= r_min < r_max <= 1, got r_min={self.r_min!r}, r_max={self.r_max!r}")
        if not self.max_phase > 0:
            raise ValueError(f"max_phase must be > 0, got {self.max_phase!r}")


@register(
    "attention",
    "lru",
    options=LRUOptions,
    capabilities=Capabilities(causal=True, exact=False, streaming="exact", noncausal=False),
)
class LRUMixer(RecurrentMixer):
    """Linear recurrent unit as a token mixer (see the module docstring)."""

    def __init__(self, cfg: Any, options: LRUOptions, position: Position, layer: int) -> None:
        super().__init__(cfg, options, position, layer)
        d = cfg.d_model
        n = options.d_state or d
        self.d_state = n
        u1 = torch.rand(n).clamp(1e-4, 1 - 1e-4)
        u2 = torch.rand(n)
        mag2 = u1 * (options.r_max**2 - options.r_min**2) + options.r_min**2
        self.nu_log = nn.Parameter(torch.log(-0.5 * torch.log(mag2)))
        self.theta_log = nn.Parameter(torch.log(options.max_phase * u2.clamp_min(1e-4)))
        self.gamma_log = nn.Parameter(0.5 * torch.log1p(-mag2))
        self.b_re = nn.Parameter(torch.randn(n, d) / math.sqrt(2 * d))
        self.b_im = nn.Parameter(torch.randn(n, d) / math.sqrt(2 * d))
        self.c_re = nn.Parameter(torch.randn(d, n) / math.sqrt(n))
        self.c_im = nn.Parameter(torch.randn(d, n) / math.sqrt(n))
        self.d_skip = nn.Parameter(torch.randn(d))

    def init_state(self, batch: int, device: torch.device | None, dtype: torch.dtype) -> LRUState:
        return LRUState(h=torch.zeros(batch, self.d_state, 2, device=device, dtype=work_dtype(dtype)))

    def coefficients(self, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """(λ (N) complex, γ (N) real) in ``dtype``'s precision."""
        nu, theta = torch.exp(self.nu_log.to(dtype)), torch.exp(self.theta_log.to(dtype))
        lam = torch.polar(torch.exp(-nu), theta)
        return lam, torch.exp(self.gamma_log.to(dtype))

    def forward(self, x: Tensor, ctx: ForwardContext, state: Any = None) -> tuple[Tensor, Any]:
        self.enter(x, ctx)
        wd = work_dtype(x.dtype)
        u = x.to(wd)
        lam, gamma = self.coefficients(wd)
        bu = torch.complex(u @ self.b_re.to(wd).T, u @ self.b_im.to(wd).T) * gamma  # (B, T, N)
        a, b = gate_inputs(lam.expand_as(bu), bu, ctx)
        h0 = torch.view_as_complex(state.h.to(wd).contiguous()) if isinstance(state, LRUState) else None
        h = linear_scan(a, b, h0, self.options.chunk_size)
        y = h.real @ self.c_re.to(wd).T - h.imag @ self.c_im.to(wd).T + u * self.d_skip.to(wd)
        new_state = state
        if isinstance(state, LRUState):
            new_state = LRUState(h=torch.view_as_real(h[:, -1]).to(state.h.dtype))
        return y.to(x.dtype), new_state
