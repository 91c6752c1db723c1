"""``retnet``: retention, a linear attention with a fixed decay per head (Sun et al. 2023, arXiv 2307.08621).

S_t = γ_h S_{t-1} + k_t v_t^T, o_t = q_t^T S_t (eq. 1-3: the recurrent form of retention), with
γ_h = 1 - 2^{-5-h} for head h = 0 … H-1 (the paper's per-head decays; eq. 8 ties the head to its range) and
keys scaled by D^{-1/2}. The parallel form over a window is (Q K^T ⊙ D) V with D_ij = γ^{i-j} for j ≤ i, computed
chunkwise (section 2.2: inside a chunk the masked decay matrix, across chunks the carried state;
``_gated_ops.gated_chunked``). As in the paper's multi-scale retention block each head's output is normalised
(GroupNorm, here an RMS norm per head) and gated: Y = swish(x W_G) ⊙ norm(o). The paper's xPos rotation of q and
k is the ``qk`` position kind (``rope``); its decay part is γ itself.

Restarts inside the window (``ForwardContext.segment``) cut the decay matrix by segment. Takes no memory module
(memory=None). Streaming state (B, H, D, D). Cost O(T·C·D + T·D²) per head for chunks of C tokens.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rl_transformers.backbone.attention import _gated_ops as ops
from rl_transformers.backbone.attention._recurrent import ChunkOptions, HeadNorm, RecurrentMixer
from rl_transformers.backbone.attention.linear import work_dtype
from rl_transformers.backbone.context import ForwardContext
from rl_transformers.backbone.registry import Capabilities, register


def retention_decays(n_heads: int) -> Tensor:
    """(H,) γ_h = 1 - 2^{-5-h} (float64)."""
    return 1.0 - torch.pow(2.0, -5.0 - torch.arange(n_heads, dtype=torch.float64))


@register(
    "attention",
    "retnet",
    options=ChunkOptions,
    capabilities=Capabilities(causal=True, noncausal=False, exact=False, streaming="exact"),
)
class Retention(RecurrentMixer):
    """Multi-scale retention with a swish output gate and a per-head norm."""

    def __init__(self, cfg: Any, options: Any, position: Any, layer: int) -> None:
        super().__init__(cfg, options, position, layer)
        self.g_proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.norm = HeadNorm(self.n_heads, self.d_head)
        self.log_gamma = retention_decays(self.n_heads).log()  # float64 constants, cast per call

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
        b, h, t, d = q.shape
        wd = work_dtype(q.dtype)
        k = k.to(wd) * d**-0.5
        log_a = self.log_gamma.to(q.device, wd)[None, :, None, None].expand(b, h, t, 1)
        if (keep := self.padding(ctx, k_valid)) is not None:
            k, log_a = k * keep, log_a * keep
        s0 = self.carried(state, b, q.device, wd)
        out, s_end = ops.gated_chunked(
            q.to(wd), k, v.to(wd), log_a, s0, self.options.chunk_size, self.segments(ctx)
        )
        gate = F.silu(self.split_heads(self.g_proj(self.layer_input(ctx, v))))
        return gate * self.norm(out.to(q.dtype)), self.new_state(state, s_end)
