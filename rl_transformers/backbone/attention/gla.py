"""``gla``: gated linear attention, a data-dependent diagonal decay (Yang et al. 2023, arXiv 2312.06635).

S_t = diag(α_t) S_{t-1} + k_t v_t^T, o_t = q_t^T S_t (eq. 2, S (D_k, D_v) per head), with the decay on the key
dimension from a low-rank gate: α_t = σ(x_t W_α1 W_α2 + b_α)^{1/τ}, W_α1 (d, 16), W_α2 (16, d), τ = 16 (section
4.1), so log α_t = log σ(·)/τ. Queries are scaled by D^{-1/2}. The output is gated as in the paper's GLA layer:
Y = swish(x W_r) ⊙ norm(o) (norm: an RMS norm per head). The chunkwise form (section 4) is
``_gated_ops.gated_chunked``: inside a chunk it forms the decay e^{L_i - L_j} per key dimension, a (C, C, D) tensor,
only with non-positive exponents (the paper's secondary-level chunking avoids the same overflow), so the default
chunk is 16 tokens; memory O(T·C·D) per head.

Restarts inside the window (``ForwardContext.segment``) cut the decay matrix by segment. Takes no memory module
(memory=None). Streaming state (B, H, D, D). Cost O(T·C·D + T·D²) per head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from rl_transformers.backbone.attention import _gated_ops as ops
from rl_transformers.backbone.attention._recurrent import HeadNorm, RecurrentMixer
from rl_transformers.backbone.attention.linear import check_chunk_size, work_dtype
from rl_transformers.backbone.context import ForwardContext
from rl_transformers.backbone.registry import Capabilities, register


@dataclass(frozen=True)
class GLAOptions:
    chunk_size: int = 16
    """C: tokens per chunk (a computation schedule; the decay tensor of a chunk is C × C × D per head)."""
    gate_rank: int = 16
    """Rank of the decay gate's projection W_α1 W_α2."""
    gate_temperature: float = 16.0
    """τ: log α = log σ(·) / τ (larger τ: decays closer to 1)."""

    def __post_init__(self) -> None:
        check_chunk_size(self.chunk_size)
        if not isinstance(self.gate_rank, int) or self.gate_rank < 1:
            raise ValueError(f"gla gate_rank must be a positive int, got {self.gate_rank!r}")
        if not self.gate_temperature > 0:
            raise ValueError(f"gla gate_temperature must be > 0, got {self.gate_temperature!r}")


@register(
    "attention",
    "gla",
    options=GLAOptions,
    capabilities=Capabilities(causal=True, noncausal=False, exact=False, streaming="exact"),
)
class GatedLinearAttention(RecurrentMixer):
    """GLA layer: low-rank data-dependent key-dimension decay, swish output gate, per-head norm."""

    def __init__(self, cfg: Any, options: Any, position: Any, layer: int) -> None:
        super().__init__(cfg, options, position, layer)
        d = cfg.d_model
        self.gate_down = nn.Linear(d, options.gate_rank, bias=False)
        self.gate_up = nn.Linear(options.gate_rank, d)
        self.r_proj = nn.Linear(d, d)
        self.norm = HeadNorm(self.n_heads, self.d_head)

    def log_decay(self, x: Tensor) -> Tensor:
        """(B, H, T, D) log α_t from the layer input x (B, T, d)."""
        return F.logsigmoid(self.split_heads(self.gate_up(self.gate_down(x)))) / self.options.gate_temperature

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
        b, _, _, d = q.shape
        wd = work_dtype(q.dtype)
        x = self.layer_input(ctx, v)
        q, k, log_a = q.to(wd) * d**-0.5, k.to(wd), self.log_decay(x).to(wd)
        if (keep := self.padding(ctx, k_valid)) is not None:
            k, log_a = k * keep, log_a * keep
        s0 = self.carried(state, b, q.device, wd)
        out, s_end = ops.gated_chunked(q, k, v.to(wd), log_a, s0, self.options.chunk_size, self.segments(ctx))
        gate = F.silu(self.split_heads(self.r_proj(x)))
        return gate * self.norm(out.to(gate.dtype)), self.new_state(state, s_end)
