"""``deltanet``: linear attention with the delta rule (Schlag et al. 2021, arXiv 2102.11174), trained in the
chunkwise parallel form of Yang et al. 2024 (arXiv 2406.06484).

S_t = (I - β_t k_t k_t^T) S_{t-1} + β_t k_t v_t^T, o_t = q_t^T S_t (S (D_k, D_v) per head; the papers write its
transpose): each step replaces the value stored under k_t by a β_t-mix of the old and the new one. As in Yang
et al. q and k are L2-normalised after a SiLU (so the update is a contraction), β_t = σ(x_t W_β) per head, and
each head's output is RMS-normalised. The chunkwise form (the UT / WY representation: per chunk one unit
lower-triangular solve for the pseudo-values u, then a linear-attention chunk with values u) is
``_gated_ops.delta_chunked``. The papers' short convolutions on q / k / v are left out.

Restarts inside the window (``ForwardContext.segment``) cut the chunk's triangular system and its attention by
segment. Takes no memory module (memory=None). Streaming state (B, H, D, D). Cost O(T·C·D + T·D² + T·C²) per
head (the triangular solve), for chunks of C tokens.
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from rl_transformers.backbone.attention import _gated_ops as ops
from rl_transformers.backbone.attention._recurrent import ChunkOptions, HeadNorm, RecurrentMixer
from rl_transformers.backbone.attention.linear import work_dtype
from rl_transformers.backbone.context import ForwardContext
from rl_transformers.backbone.registry import Capabilities, register


def unit_features(x: Tensor) -> Tensor:
    """L2-normalised SiLU features (..., D): the keys (and queries) of the delta rule."""
    return F.normalize(F.silu(x), dim=-1, eps=1e-6)


@register(
    "attention",
    "deltanet",
    options=ChunkOptions,
    capabilities=Capabilities(causal=True, noncausal=False, exact=False, streaming="exact"),
)
class DeltaNet(RecurrentMixer):
    """Delta-rule linear attention with a per-head writing strength β and a per-head output norm."""

    def __init__(self, cfg: Any, options: Any, position: Any, layer: int) -> None:
        super().__init__(cfg, options, position, layer)
        self.beta_proj = nn.Linear(cfg.d_model, self.n_heads)
        self.norm = HeadNorm(self.n_heads, self.d_head)

    def log_decay(self, x: Tensor) -> Tensor | None:
        """(B, H, T, 1) log α_t of the gated variant; None: no decay."""
        return None

    def output(self, o: Tensor, x: Tensor) -> Tensor:
        """The head outputs (B, H, T, D) after the norm (the gated variant also gates them)."""
        return self.norm(o)

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
        b = q.shape[0]
        wd = work_dtype(q.dtype)
        x = self.layer_input(ctx, v)
        q, k = unit_features(q.to(wd)), unit_features(k.to(wd))
        beta = self.beta_proj(x).to(wd).sigmoid().transpose(1, 2)[..., None]  # (B, H, T, 1)
        log_a = self.log_decay(x)
        log_a = None if log_a is None else log_a.to(wd)
        if (keep := self.padding(ctx, k_valid)) is not None:  # padding neither writes nor decays
            beta = beta * keep
            log_a = None if log_a is None else log_a * keep
        s0 = self.carried(state, b, q.device, wd)
        out, s_end = ops.delta_chunked(
            q, k, v.to(wd), beta, log_a, s0, self.options.chunk_size, self.segments(ctx)
        )
        return self.output(out.to(x.dtype), x), self.new_state(state, s_end)
