"""Rotary schemes: ``rope`` (Su et al. 2021, arXiv 2104.09864) and ``xpos`` (Sun et al. 2022, arXiv 2212.10554).

RoPE rotates each pair of query/key dimensions (2i, 2i+1) by the angle p·θ_i, θ_i = base^(-2i/D), so that
q_m·k_n depends on positions only through m - n. It transforms q and k before the kernel (kind ``"qk"``), so it
composes with every attention, including the kernel / linear family. Shapes: q, k (B, H, T, D), pos (B, T).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rl_transformers.backbone.position.base import Position
from rl_transformers.backbone.registry import register


def rotate_pairs(x: Tensor, angles: Tensor) -> Tensor:
    """Rotate consecutive pairs (x[2i], x[2i+1]) of the last dim by ``angles`` (..., D/2)."""
    cos, sin = torch.cos(angles).to(x.dtype), torch.sin(angles).to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return out.flatten(-2)


def rope_angles(pos: Tensor, dim: int, base: float) -> Tensor:
    """(B, 1, T, dim/2) angles p·θ_i (computed in float64 so large positions stay accurate)."""
    inv_freq = base ** (-torch.arange(0, dim, 2, device=pos.device, dtype=torch.float64) / dim)
    return (pos.double().unsqueeze(-1) * inv_freq).unsqueeze(1)


@dataclass(frozen=True)
class RopeOptions:
    base: float = 10000.0
    """θ_i = base^(-2i/D)."""

    def __post_init__(self) -> None:
        if self.base <= 1:
            raise ValueError(f"rope base must be > 1, got {self.base!r}")


@register("position", "rope", options=RopeOptions)
class RotaryPosition(Position):
    kind = "qk"

    def __init__(self, cfg: Any, options: RopeOptions) -> None:
        super().__init__(cfg, options)
        if cfg.d_head % 2:
            raise ValueError(f"rope needs an even head dim, got d_head={cfg.d_head}")

    def transform_q(self, q: Tensor, pos: Tensor, layer: int) -> Tensor:
        return rotate_pairs(q, rope_angles(pos, q.shape[-1], self.options.base))

    def transform_k(self, k: Tensor, pos: Tensor, layer: int) -> Tensor:
        return rotate_pairs(k, rope_angles(pos, k.shape[-1], self.options.base))
