"""Angular LSH for :mod:`lsh` (Kitaev et al. 2020, arXiv 2001.04451, §2): the stored random rotations, the bucket
of each unit key (half precision is hashed in float32)."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["draw_rotations", "hash_buckets"]


def draw_rotations(
    n_hashes: int, n_heads: int, d_head: int, n_buckets: int, generator: torch.Generator | None = None
) -> Tensor:
    """(R, H, D, n_buckets/2) Gaussian rotations; round r's draw does not depend on n_hashes (nested rounds)."""
    half = n_buckets // 2
    return torch.stack([torch.randn(n_heads, d_head, half, generator=generator) for _ in range(n_hashes)])


def hash_buckets(x: Tensor, rotations: Tensor) -> Tensor:
    """Angular LSH buckets (B, H, R, S) of x (B, H, S, D): argmax over [xR; -xR] (Kitaev 2020, §2).

    Half-precision keys are hashed in float32: rounding the projections to 8 bits of mantissa flips the argmax of
    keys near a bucket boundary, so a bf16 run attended other keys than the same run in float32 or float64 (the
    GPU benchmark's gate measured a 0.9 relative error)."""
    if rotations.shape[-1] == 0:
        b, h, s, _ = x.shape
        return torch.zeros(b, h, rotations.shape[0], s, dtype=torch.long, device=x.device)
    if x.dtype in (torch.float16, torch.bfloat16):
        x = x.float()
    proj = torch.einsum("bhsd,rhdn->bhrsn", x, rotations.to(x.dtype))
    return torch.cat([proj, -proj], dim=-1).argmax(dim=-1)
