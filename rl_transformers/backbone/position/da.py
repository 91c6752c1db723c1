"""``da``: distance-aware attention scores (DA-Transformer, Wu et al. 2021, arXiv 2010.06925).

Each head h of each layer re-weights its (non-negative) attention scores by a learned, bounded, monotone
function of the distance R = |i - j|:

    R̂_h = (1 + exp(v_h)) / (1 + exp(v_h - w_h·R)),    logits = ReLU(q_i·k_j)·R̂_h(|i - j|) / sqrt(D),

followed by the usual masked softmax. R̂(0) = 1; w_h > 0 lets a head favour distant keys (R̂ grows to the
bound 1 + exp(v_h)), w_h < 0 favours near keys (R̂ decays to 0); v_h sets the bound and the steepness. The
ReLU keeps the scores non-negative so that multiplying by R̂ moves them monotonically. We evaluate R̂ in the
overflow-free form exp(softplus(v_h))·sigmoid(w_h·R - v_h). Parameters: w, v (n_layers, H), initialised to w_h
spread over [-0.1, 0.1] across heads and v_h = 0.

Kind ``"scores"``: :meth:`logits` builds the logits itself from q (B, H, *, Tq, D), k (B, H, *, Tk, D) and the
positions q_pos (B, *, Tq), k_pos (B, *, Tk); they depend on positions only through |i - j|, so the scheme is
shift-invariant and streams exactly. Cost: O(B·H·Tq·Tk·D) time, O(B·H·Tq·Tk) memory, as dense attention.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rl_transformers.backbone.position.base import NoOptions, Position, relative
from rl_transformers.backbone.registry import register


def da_weight(dist: Tensor, w: Tensor, v: Tensor) -> Tensor:
    """R̂ = (1 + e^v) / (1 + e^(v - w·dist)), broadcasting ``dist`` against ``w``, ``v``."""
    return torch.exp(F.softplus(v)) * torch.sigmoid(w * dist - v)


@register("position", "da", options=NoOptions)
class DistanceAwarePosition(Position):
    kind = "scores"

    def __init__(self, cfg: Any, options: NoOptions) -> None:
        super().__init__(cfg, options)
        h = cfg.n_heads
        spread = torch.linspace(-0.1, 0.1, h) if h > 1 else torch.full((1,), 0.1)
        self.w = nn.Parameter(spread.expand(cfg.n_layers, h).clone())
        """(n_layers, H) distance rates w_h."""
        self.v = nn.Parameter(torch.zeros(cfg.n_layers, h))
        """(n_layers, H) offsets v_h (the bound of R̂ is 1 + exp(v_h))."""

    def weight(self, q_pos: Tensor, k_pos: Tensor, layer: int, dtype: torch.dtype) -> Tensor:
        """R̂ (B, H, *, Tq, Tk) of ``layer``."""
        dist = relative(q_pos, k_pos).abs().to(dtype).unsqueeze(1)
        shape = (1, -1) + (1,) * (dist.dim() - 2)
        return da_weight(dist, self.w[layer].to(dtype).view(shape), self.v[layer].to(dtype).view(shape))

    def logits(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        scores = torch.relu(torch.matmul(q, k.transpose(-1, -2))) * self.scale
        dtype = torch.promote_types(q.dtype, torch.float32)
        return scores * self.weight(q_pos, k_pos, layer, dtype).to(scores.dtype)
