"""``gated_deltanet``: the delta rule with a scalar decay per head (Yang et al. 2024, arXiv 2412.06464).

S_t = α_t (I - β_t k_t k_t^T) S_{t-1} + β_t k_t v_t^T, o_t = q_t^T S_t (eq. 10, S (D_k, D_v) per head: the paper
writes its transpose), with α_t = exp(-softplus(x_t W_α + b_α) e^{A_log}) ∈ (0, 1) per head (the Mamba-2 decay
the paper uses), β_t = σ(x_t W_β), q and k L2-normalised after a SiLU. The output is RMS-normalised per head and
gated: Y = SiLU(x W_g) ⊙ norm(o). Chunkwise: ``_gated_ops.delta_chunked`` with the cumulative decays folded
into the chunk's triangular system and attention (section 3.3). The paper's short convolutions are left out.

Restarts inside the window (``ForwardContext.segment``) cut the chunk by segment. Takes no memory module
(memory=None). Streaming state (B, H, D, D). Cost as ``deltanet``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rl_transformers.backbone.attention._recurrent import ChunkOptions
from rl_transformers.backbone.attention.deltanet import DeltaNet
from rl_transformers.backbone.registry import Capabilities, register


@register(
    "attention",
    "gated_deltanet",
    options=ChunkOptions,
    capabilities=Capabilities(causal=True, noncausal=False, exact=False, streaming="exact"),
)
class GatedDeltaNet(DeltaNet):
    """Delta rule with a data-dependent scalar decay per head and a SiLU output gate."""

    def __init__(self, cfg: Any, options: Any, position: Any, layer: int) -> None:
        super().__init__(cfg, options, position, layer)
        h = self.n_heads
        self.alpha_proj = nn.Linear(cfg.d_model, h, bias=False)
        self.g_proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.A_log = nn.Parameter(torch.empty(h).uniform_(1.0, 16.0).log())
        dt = torch.exp(torch.empty(h).uniform_(math.log(1e-3), math.log(1e-1)))
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus, as Mamba-2

    def log_decay(self, x: Tensor) -> Tensor:
        dt = F.softplus(self.alpha_proj(x) + self.dt_bias)  # (B, T, H)
        return (-dt * self.A_log.exp()).transpose(1, 2)[..., None]

    def output(self, o: Tensor, x: Tensor) -> Tensor:
        return F.silu(self.split_heads(self.g_proj(x))) * self.norm(o)
