"""``mlstm``: xLSTM's matrix memory with exponential gating (Beck et al. 2024, arXiv 2405.04517, section 2.3).

C_t = f_t C_{t-1} + i_t v_t k_t^T, n_t = f_t n_{t-1} + i_t k_t, h̃_t = C_t q_t / max(|n_t^T q_t|, 1) (eqs. 19-27),
keys scaled by D^{-1/2}, per-head scalar gates from the layer input: input gate i_t = exp(ĩ_t), forget gate
f_t = σ(f̃_t) (``forget_gate='sigmoid'``) or exp(f̃_t) (``'exp'``), ĩ / f̃ = x W + b, the forget bias initialised
in [3, 6]. The output is gated: Y = σ(x W_o) ⊙ norm(h̃) (norm: an RMS norm per head). Exponential gates overflow,
so the state is stabilised (eqs. 15-17): it holds C̃ = e^{-m} C, ñ = e^{-m} n and m, and h̃ = C̃ q / max(|ñ·q|,
e^{-m}) does not depend on m. The chunked form (``_gated_ops.mlstm_chunked``, the paper's parallel form eqs. 28-33
per chunk, the state carried between chunks) takes for each query the largest log-weight it sums as m.

Restarts inside the window (``ForwardContext.segment``) cut the decay matrix by segment. Takes no memory module
(memory=None). Streaming state C̃ (B, H, D, D), ñ (B, H, D), m (B, H); zeros are the empty state (m = 0 with
C̃ = ñ = 0 represents C = n = 0). Cost O(T·C·D + T·D²) per head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rl_transformers.backbone.attention import _gated_ops as ops
from rl_transformers.backbone.attention._recurrent import HeadNorm, RecurrentMixer
from rl_transformers.backbone.attention.linear import check_chunk_size, work_dtype
from rl_transformers.backbone.context import ForwardContext
from rl_transformers.backbone.options import check_choice
from rl_transformers.backbone.registry import Capabilities, register
from rl_transformers.backbone.state import State

ForgetGate = Literal["sigmoid", "exp"]


@dataclass
class MLSTMState(State):
    """c = C̃ (B, H, K, V), n = ñ (B, H, K), m (B, H): the stabilised matrix memory, C = e^m C̃, n = e^m ñ."""

    c: Tensor
    n: Tensor
    m: Tensor

    def represented(self) -> tuple[Tensor, Tensor]:
        """(C, n) without the stabiliser (may overflow for large m; for tests and diagnostics)."""
        scale = self.m.exp()
        return self.c * scale[..., None, None], self.n * scale[..., None]


@dataclass(frozen=True)
class MLSTMOptions:
    chunk_size: int = 64
    """C: tokens per chunk (a computation schedule)."""
    forget_gate: ForgetGate = "sigmoid"
    """f_t = σ(f̃_t) or exp(f̃_t)."""

    def __post_init__(self) -> None:
        check_chunk_size(self.chunk_size)
        check_choice("forget_gate", self.forget_gate, ForgetGate)


@register(
    "attention",
    "mlstm",
    options=MLSTMOptions,
    capabilities=Capabilities(causal=True, noncausal=False, exact=False, streaming="exact"),
)
class MLSTM(RecurrentMixer):
    """mLSTM cell with exponential input gate, stabiliser, output gate and per-head norm."""

    def __init__(self, cfg: Any, options: Any, position: Any, layer: int) -> None:
        super().__init__(cfg, options, position, layer)
        h = self.n_heads
        self.i_proj = nn.Linear(cfg.d_model, h)
        self.f_proj = nn.Linear(cfg.d_model, h)
        self.og_proj = nn.Linear(cfg.d_model, cfg.d_model)
        with torch.no_grad():
            nn.init.normal_(self.i_proj.bias, std=0.1)
            self.f_proj.bias.copy_(torch.linspace(3.0, 6.0, h))
        self.norm = HeadNorm(h, self.d_head)

    def init_state(self, batch: int, device: torch.device | None, dtype: torch.dtype) -> MLSTMState:
        wd, h, d = work_dtype(dtype), self.n_heads, self.d_head
        zeros = torch.zeros(batch, h, d, d, device=device, dtype=wd)
        return MLSTMState(c=zeros, n=zeros[..., 0].clone(), m=zeros[..., 0, 0].clone())

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
        b, h, _, d = q.shape
        wd = work_dtype(q.dtype)
        x = self.layer_input(ctx, v)
        log_i = self.i_proj(x).to(wd).transpose(1, 2)  # (B, H, T)
        f_pre = self.f_proj(x).to(wd).transpose(1, 2)
        log_f = F.logsigmoid(f_pre) if self.options.forget_gate == "sigmoid" else f_pre
        k = k.to(wd) * d**-0.5
        if (keep := self.padding(ctx, k_valid)) is not None:
            log_i = log_i.masked_fill(~keep[..., 0], float("-inf"))
            log_f, k = log_f * keep[..., 0], k * keep
        if isinstance(state, MLSTMState):
            carried = (state.c.to(wd), state.n.to(wd), state.m.to(wd))
        else:
            carried = (
                q.new_zeros(b, h, d, d, dtype=wd),
                q.new_zeros(b, h, d, dtype=wd),
                q.new_zeros(b, h, dtype=wd),
            )
        out, (c, n, m) = ops.mlstm_chunked(
            q.to(wd), k, v.to(wd), log_f, log_i, carried, self.options.chunk_size, self.segments(ctx)
        )
        gate = torch.sigmoid(self.split_heads(self.og_proj(x)))
        y = gate * self.norm(out.to(gate.dtype))
        if not isinstance(state, MLSTMState):
            return y, state
        return y, MLSTMState(c=c.to(state.c.dtype), n=n.to(state.n.dtype), m=m.to(state.m.dtype))
