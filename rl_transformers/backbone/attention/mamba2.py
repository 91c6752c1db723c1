"""``mamba2``: the state-space dual (SSD) layer of Mamba-2, a scalar data-dependent decay per head (Dao & Gu 2024,
arXiv 2405.21060).

h_t = a_t h_{t-1} + Δ_t B_t x_t^T (N × P per head), y_t = C_t^T h_t + D ⊙ x_t, with Δ_t = softplus(x_t W_Δ + b_Δ)
and a_t = exp(-Δ_t exp(A_log)) per head (section 7 / Listing 1). x, B, C are this layer's value, key and query
projections (one B, C per head: n_groups = H, state size N = D), each passed through a short causal depthwise
convolution (kernel ``d_conv``) and SiLU, as in the paper's block. The output is gated and normalised:
Y = RMSNorm(y ⊙ SiLU(x W_z)) (per head here). The SSD form is a linear attention with values x, keys Δ B,
queries C and a scalar decay: chunked by ``_gated_ops.gated_chunked`` (the paper's block decomposition: a masked
decay matrix inside a chunk, the state carried between chunks).

Restarts inside the window (``ForwardContext.segment``) cut the decay matrix and the convolution's window by
segment. Takes no memory module (memory=None). Streaming state: the SSM state (B, H, D, D) and the last
``d_conv - 1`` convolution inputs (B, H, d_conv - 1, 3D). Cost O(T·C·D + T·D²) per head.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rl_transformers.backbone.attention import _gated_ops as ops
from rl_transformers.backbone.attention._recurrent import HeadNorm, MatrixState, RecurrentMixer
from rl_transformers.backbone.attention.linear import check_chunk_size, work_dtype
from rl_transformers.backbone.context import ForwardContext
from rl_transformers.backbone.registry import Capabilities, register


@dataclass
class Mamba2State(MatrixState):
    """s (B, H, N, P): SSM state; conv (B, H, d_conv - 1, 3P): the convolution's last inputs (x, B, C). Zeros
    are the empty state."""

    conv: Tensor


@dataclass(frozen=True)
class Mamba2Options:
    chunk_size: int = 64
    """C: tokens per chunk (a computation schedule)."""
    d_conv: int = 4
    """Kernel of the causal depthwise convolution on x, B, C (1: a per-channel scale, no mixing over time)."""

    def __post_init__(self) -> None:
        check_chunk_size(self.chunk_size)
        if not isinstance(self.d_conv, int) or self.d_conv < 1:
            raise ValueError(f"mamba2 d_conv must be a positive int, got {self.d_conv!r}")


def causal_conv(
    xs: Tensor, weight: Tensor, bias: Tensor, history: Tensor, segment: Tensor | None
) -> tuple[Tensor, Tensor]:
    """Depthwise causal convolution by segment: (out (B, H, T, E), new history (B, H, W - 1, E)).

    xs (B, H, T, E) inputs, weight (H, W, E) (tap W - 1 is the current token), bias (H, E), history
    (B, H, W - 1, E) the inputs before xs (segment 0). A token sees the inputs of its own segment only.
    """
    t, w = xs.shape[2], weight.shape[1]
    ext = torch.cat([history, xs], dim=2)
    seg = None
    if segment is not None:
        seg = torch.cat([segment.new_zeros(*segment.shape[:-1], w - 1), segment], dim=-1)[..., None]
    out = bias[:, None, :].expand_as(xs)
    for tap in range(w):
        src = ext[:, :, tap : tap + t]
        if seg is not None:
            src = torch.where(seg[..., tap : tap + t, :] == seg[..., w - 1 :, :], src, 0.0)
        out = out + weight[:, tap, None, :] * src
    new_history = ext[:, :, ext.shape[2] - (w - 1) :]
    if seg is not None:
        new_history = torch.where(
            seg[..., seg.shape[-2] - (w - 1) :, :] == seg[..., -1:, :], new_history, 0.0
        )
    return out, new_history


@register(
    "attention",
    "mamba2",
    options=Mamba2Options,
    capabilities=Capabilities(causal=True, noncausal=False, exact=False, streaming="exact"),
)
class Mamba2(RecurrentMixer):
    """SSD with a short convolution, per-head Δ / A / D and a gated RMS norm."""

    def __init__(self, cfg: Any, options: Any, position: Any, layer: int) -> None:
        super().__init__(cfg, options, position, layer)
        h, p = self.n_heads, self.d_head
        self.dt_proj = nn.Linear(cfg.d_model, h, bias=False)
        self.z_proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.conv_weight = nn.Parameter(torch.randn(h, options.d_conv, 3 * p) / math.sqrt(options.d_conv))
        self.conv_bias = nn.Parameter(torch.zeros(h, 3 * p))
        # the paper's initialisation: A ~ U[1, 16], Δ = softplus(b_Δ) log-uniform in [1e-3, 1e-1]
        self.A_log = nn.Parameter(torch.empty(h).uniform_(1.0, 16.0).log())
        dt = torch.exp(torch.empty(h).uniform_(math.log(1e-3), math.log(1e-1)))
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
        self.D = nn.Parameter(torch.ones(h))
        self.norm = HeadNorm(h, p)

    def init_state(self, batch: int, device: torch.device | None, dtype: torch.dtype) -> Mamba2State:
        wd, h, p = work_dtype(dtype), self.n_heads, self.d_head
        return Mamba2State(
            s=torch.zeros(batch, h, p, p, device=device, dtype=wd),
            conv=torch.zeros(batch, h, self.options.d_conv - 1, 3 * p, device=device, dtype=wd),
        )

    def core(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        q_pos: Tensor,
        k_pos: Tensor,
        k_valid: Tensor,
        ctx: ForwardContext,
        state: Any,
    ) -> tuple[Tensor, Any]:
        b, h, _, p = q.shape
        wd = work_dtype(q.dtype)
        x_in = self.layer_input(ctx, v)
        keep, segment = self.padding(ctx, k_valid), self.segments(ctx)
        xbc = torch.cat([v, k, q], dim=-1).to(wd)
        if keep is not None:
            xbc = xbc * keep
        if isinstance(state, Mamba2State):
            history = state.conv.to(wd)
        else:
            history = xbc.new_zeros(b, h, self.options.d_conv - 1, 3 * p)
        conv, new_history = causal_conv(xbc, self.conv_weight.to(wd), self.conv_bias.to(wd), history, segment)
        x, bk, c = F.silu(conv).split(p, dim=-1)
        dt = F.softplus(self.dt_proj(x_in).to(wd) + self.dt_bias.to(wd)).transpose(1, 2)[
            ..., None
        ]  # (B, H, T, 1)
        log_a = -dt * self.A_log.to(wd).exp()[:, None, None]
        bk = bk * dt
        if keep is not None:
            bk, log_a = bk * keep, log_a * keep
        s0 = self.carried(state, b, q.device, wd)
        y, s_end = ops.gated_chunked(c, bk, x, log_a, s0, self.options.chunk_size, segment)
        y = y + self.D.to(wd)[:, None, None] * x
        gate = F.silu(self.split_heads(self.z_proj(x_in)))
        out = self.norm(y.to(gate.dtype) * gate)
        if not isinstance(state, Mamba2State):
            return out, state
        return out, Mamba2State(s=s_end.to(state.s.dtype), conv=new_history.to(state.conv.dtype))
