"""``mamba``: the selective state space mixer (Gu & Dao 2023, arXiv 2312.00752, Algorithm 2 and Fig. 3).

With E = expand · d_model inner channels, N state channels per inner channel and a kernel of K taps:

    (u_t, g_t) = W_in x_t                                        (two E-vectors)
    c_t = SiLU(b_conv + Σ_{k<K} w_k ⊙ u_{t-k})                    (causal depthwise convolution)
    Δ_t = softplus(W_Δ (W_r c_t) + b_Δ)   (E),   B_t = W_B c_t,  C_t = W_C c_t   (N each)
    h_t = exp(Δ_t A) ⊙ h_{t-1} + (Δ_t B_t^T) ⊙ c_t               (E × N, A = -exp(A_log) diagonal)
    y_t = W_out((C_t · h_t + D ⊙ c_t) ⊙ SiLU(g_t))

(zero-order hold for A, Euler for B, as in the paper's reference implementation). A window runs as one parallel
scan fused with its inputs and read-out (``_scan.selective_scan``, whose backward forms the E × N gradients once)
and the convolution as K shifted sums; an episode start inside the window cuts both
(the scan's a_t = 0 and the taps that would reach into the previous episode). The state (:class:`MambaState`) is
the convolution's last K - 1 inputs and h, in at least float32. Initialisation as the paper's code: A_log =
log(1 … N), b_Δ such that Δ starts log-uniform in [dt_min, dt_max]. Cost: O(T·d·E) for the projections,
O(T·E·N·log C) for the scan; state O(E·(N + K)).
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
    selective_scan,
    work_dtype,
)
from rl_transformers.backbone.context import ForwardContext
from rl_transformers.backbone.position.base import Position
from rl_transformers.backbone.registry import Capabilities, register
from rl_transformers.backbone.state import State


@dataclass
class MambaState(State):
    """conv: (B, K - 1, E) the last inputs of the convolution (oldest first); h: (B, E, N). Zeros when empty."""

    conv: Tensor
    h: Tensor


@dataclass(frozen=True)
class MambaOptions:
    d_state: int = 16
    """N: state channels per inner channel."""
    d_conv: int = 4
    """K: taps of the causal depthwise convolution."""
    expand: int = 2
    """E = expand · d_model inner channels."""
    dt_rank: int | None = None
    """R: rank of the Δ projection (None = ceil(d_model / 16))."""
    dt_min: float = 0.001
    """Smallest Δ at initialisation."""
    dt_max: float = 0.1
    """Largest Δ at initialisation."""
    chunk_size: int = 64
    """C: tokens per chunk of the parallel scan (a schedule: the result does not depend on it)."""

    def __post_init__(self) -> None:
        for name in ("d_state", "d_conv", "expand", "chunk_size"):
            check_positive(name, getattr(self, name))
        if self.dt_rank is not None:
            check_positive("dt_rank", self.dt_rank)
        if not 0 < self.dt_min <= self.dt_max:
            raise ValueError(f"need 0 < dt_min <= dt_max, got dt_min={self.dt_min!r}, dt_max={self.dt_max!r}")


@register(
    "attention",
    "mamba",
    options=MambaOptions,
    capabilities=Capabilities(causal=True, exact=False, streaming="exact", noncausal=False),
)
class MambaMixer(RecurrentMixer):
    """Mamba's selective SSM with its convolution and gate as a token mixer (see the module docstring)."""

    def __init__(self, cfg: Any, options: MambaOptions, position: Position, layer: int) -> None:
        super().__init__(cfg, options, position, layer)
        d, n, k = cfg.d_model, options.d_state, options.d_conv
        e = options.expand * d
        r = options.dt_rank or math.ceil(d / 16)
        self.d_inner, self.d_state, self.dt_rank = e, n, r
        self.in_proj = nn.Linear(d, 2 * e, bias=False)
        self.conv1d = nn.Conv1d(e, e, kernel_size=k, groups=e, padding=k - 1)
        """Only its weight (E, 1, K) and bias are used: the shifted sums of :meth:`convolve`."""
        self.x_proj = nn.Linear(e, r + 2 * n, bias=False)
        self.dt_proj = nn.Linear(r, e)
        nn.init.uniform_(self.dt_proj.weight, -(r**-0.5), r**-0.5)
        lo, hi = math.log(options.dt_min), math.log(options.dt_max)
        dt = torch.exp(torch.rand(e) * (hi - lo) + lo).clamp_min(1e-4)
        with torch.no_grad():
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus⁻¹(dt)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, n + 1, dtype=torch.float32)).repeat(e, 1))
        self.D = nn.Parameter(torch.ones(e))
        self.out_proj = nn.Linear(e, d, bias=False)

    def init_state(self, batch: int, device: torch.device | None, dtype: torch.dtype) -> MambaState:
        wd = work_dtype(dtype)
        k = self.options.d_conv
        return MambaState(
            conv=torch.zeros(batch, k - 1, self.d_inner, device=device, dtype=wd),
            h=torch.zeros(batch, self.d_inner, self.d_state, device=device, dtype=wd),
        )

    def convolve(self, u: Tensor, past: Tensor | None, ctx: ForwardContext) -> tuple[Tensor, Tensor]:
        """Causal depthwise convolution of u (B, T, E) after the carried inputs ``past`` (B, K - 1, E): the
        output (B, T, E) and the new carried inputs. Taps reaching into an earlier episode read zeros."""
        b, t, e = u.shape
        k = self.options.d_conv
        past = u.new_zeros(b, k - 1, e) if past is None else past.to(u.dtype)
        ext = torch.cat([past, u], dim=1)  # (B, K - 1 + T, E)
        seg = ctx.segment
        seg_ext = None
        if seg is not None:
            seg_ext = torch.cat([seg.new_zeros(b, k - 1), seg], dim=1)  # carried inputs are segment 0
        w = self.conv1d.weight[:, 0].to(u.dtype)  # (E, K): w[:, K - 1] multiplies u_t
        assert self.conv1d.bias is not None
        out = self.conv1d.bias.to(u.dtype).expand(b, t, e)
        for lag in range(k):
            shifted = ext[:, k - 1 - lag : k - 1 - lag + t]
            if seg_ext is not None and seg is not None and lag > 0:
                same = seg_ext[:, k - 1 - lag : k - 1 - lag + t] == seg
                shifted = shifted * same[..., None].to(u.dtype)
            out = out + shifted * w[:, k - 1 - lag]
        return out, self._carried(ext, seg_ext, seg, None if ctx.all_valid else ctx.valid)

    def _carried(
        self, ext: Tensor, seg_ext: Tensor | None, seg: Tensor | None, valid: Tensor | None
    ) -> Tensor:
        """The last K - 1 inputs of ``ext`` (B, K - 1 + T, E) that the next call's convolution reads: inputs of a
        row's last episode only, padded tokens skipped (a padded token leaves the state as it is)."""
        b, n, _ = ext.shape
        k1 = self.options.d_conv - 1
        if valid is None:
            carried = ext[:, n - k1 :]
            if seg_ext is not None and seg is not None:  # inputs from before a row's last start are dropped
                carried = carried * (seg_ext[:, n - k1 :] == seg[:, -1:])[..., None].to(ext.dtype)
            return carried
        keep = torch.cat([valid.new_ones(b, k1), valid], dim=1)  # the carried inputs count as real
        if seg_ext is not None and seg is not None:
            keep = keep & (seg_ext == seg[:, -1:])
        order = torch.where(keep, torch.arange(n, device=ext.device), -1)
        last = order.topk(k1, dim=1).values.flip(
            1
        )  # (B, K - 1) positions of the last kept inputs, oldest first
        picked = ext.gather(1, last.clamp_min(0)[..., None].expand(-1, -1, ext.shape[2]))
        return picked * (last >= 0)[..., None].to(ext.dtype)

    def forward(self, x: Tensor, ctx: ForwardContext, state: Any = None) -> tuple[Tensor, Any]:
        self.enter(x, ctx)
        wd = work_dtype(x.dtype)
        u, gate = self.in_proj(x).to(wd).chunk(2, dim=-1)
        if not ctx.all_valid:  # a padded token feeds nothing into the convolution
            u = u * ctx.valid[..., None].to(wd)
        carried = isinstance(state, MambaState)
        c, conv_state = self.convolve(u, state.conv if carried else None, ctx)
        c = F.silu(c)
        dbc = F.linear(c, self.x_proj.weight.to(wd))
        dt_r, bmat, cmat = torch.split(dbc, [self.dt_rank, self.d_state, self.d_state], dim=-1)
        delta = F.softplus(F.linear(dt_r, self.dt_proj.weight.to(wd), self.dt_proj.bias.to(wd)))  # (B, T, E)
        a_mat = -torch.exp(self.A_log.to(wd))  # (E, N)
        h0 = state.h.to(wd) if carried else None
        y, h_last = selective_scan(delta, c, a_mat, bmat, cmat, h0, ctx, self.options.chunk_size)
        y = y + self.D.to(wd) * c
        out = self.out_proj((y * F.silu(gate)).to(x.dtype))
        if not carried:
            return out, state
        return out, MambaState(conv=conv_state.to(state.conv.dtype), h=h_last.to(state.h.dtype))
