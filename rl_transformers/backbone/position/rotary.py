"""Rotary schemes: ``rope`` (Su et al. 2021, arXiv 2104.09864) and ``xpos`` (Sun et al. 2022, arXiv 2212.10554).

RoPE rotates each pair of query/key dimensions (2i, 2i+1) by the angle p·θ_i, θ_i = base^(-2i/D), so that
q_m·k_n depends on positions only through m - n. It transforms q and k before the kernel (kind ``"qk"``), so it
composes with every attention, including the kernel / linear family. Shapes: q, k (B, H, T, D), pos (B, T).

XPOS adds an exponential decay to RoPE: the query at position n is scaled by ζ_i^(n/γ) and the key at position
m by ζ_i^(-m/γ) on pair i, ζ_i = (2i/D + γ')/(1 + γ') in (0, 1], so the logit of a pair carries
ζ_i^((n - m)/γ): a decay with the distance into the past (γ = ``scale_base``, γ' = ``gamma``). It is
causal-only (for keys in the future the factor grows without bound), which ``check_config`` enforces.

Numerical range. Applied literally to absolute positions the factors leave float32 quickly: ζ_0^(-m/γ) with
γ' = 0.4, γ = 512 reaches e^88 (float32 overflow) at m ≈ 36k tokens and e^709 (float64 overflow) at m ≈ 290k,
and a KV cache would store those overflowing keys. Only the difference n - m matters, so we apply the scale at
logit time (kind ``"scores"``) relative to an anchor c, the last query position of a block of queries:
q·ζ^((n - c)/γ) and k·ζ^((c - m)/γ). The query factor lies in [1, e^4] (blocks hold at most
1 + 4γ/|ln ζ_0| queries, 1635 for the defaults; longer query runs are split), the key factor in (0, 1]: it
leaves float32's normal range only beyond ~36k tokens of distance, where the exact term is below e^-87·|q||k|
anyway, and then rounds to 0 instead of overflowing. So any stream length is safe, the KV cache holds plain
keys, and the rotation uses float64 angles like ``rope``. The anchor makes the scale exactly shift-invariant;
the rotation is invariant up to rounding, as rope's. Keys after a block's anchor (future keys, always masked
in a causal model) get a key factor clamped to 1 instead of a growing one, so their masked logits stay finite.
The price of "scores": no fused SDPA path and no kernel / linear attentions (they take "qk" schemes only).
Cost: O(B·H·Tq·Tk·D) for the logits plus O((1 + Tq/block)·B·H·Tk·D) for the rescaled keys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rl_transformers.backbone.position.base import Position
from rl_transformers.backbone.registry import Capabilities, register

MAX_QUERY_EXPONENT = 4.0
"""Bound on the natural log of the XPOS query factor ζ^((n - c)/γ) inside one block of queries."""


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


@dataclass(frozen=True)
class XPosOptions:
    base: float = 10000.0
    """Rotation: θ_i = base^(-2i/D), as in rope."""
    scale_base: float = 512.0
    """γ: the decay per pair i is ζ_i^(distance/γ) (larger = slower decay)."""
    gamma: float = 0.4
    """γ' in ζ_i = (2i/D + γ')/(1 + γ'): the fastest-decaying pair has ζ_0 = γ'/(1 + γ')."""

    def __post_init__(self) -> None:
        if self.base <= 1:
            raise ValueError(f"xpos base must be > 1, got {self.base!r}")
        if self.scale_base <= 0:
            raise ValueError(f"xpos scale_base must be > 0, got {self.scale_base!r}")
        if self.gamma <= 0:
            raise ValueError(f"xpos gamma must be > 0, got {self.gamma!r}")


def xpos_log_zeta(dim: int, gamma: float, device: torch.device | None = None) -> Tensor:
    """(dim/2,) float64 ln ζ_i, ζ_i = (2i/dim + gamma)/(1 + gamma)."""
    i2 = torch.arange(0, dim, 2, dtype=torch.float64, device=device)
    return torch.log((i2 / dim + gamma) / (1 + gamma))


@register("position", "xpos", options=XPosOptions, capabilities=Capabilities(causal=True, noncausal=False))
class XPosPosition(Position):
    kind = "scores"

    def __init__(self, cfg: Any, options: XPosOptions) -> None:
        super().__init__(cfg, options)
        if cfg.d_head % 2:
            raise ValueError(f"xpos needs an even head dim, got d_head={cfg.d_head}")
        log_zeta_min = math.log(options.gamma / (1 + options.gamma))
        self.block = 1 + int(MAX_QUERY_EXPONENT * options.scale_base / -log_zeta_min)
        """Queries per anchor block (keeps the query factor <= e^MAX_QUERY_EXPONENT)."""

    @classmethod
    def check_config(cls, cfg: Any, options: Any) -> None:
        if not cfg.causal:
            raise ValueError(
                "position 'xpos' needs causal=True: its factor ζ^((i - j)/γ) decays for keys in the past "
                "but grows without bound for keys in the future. For bidirectional models use 'rope', 'alibi' "
                "or 't5'"
            )

    def logits(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        opts, d = self.options, q.shape[-1]
        q = rotate_pairs(q, rope_angles(q_pos, d, opts.base))
        k = rotate_pairs(k, rope_angles(k_pos, d, opts.base))
        rate = (xpos_log_zeta(d, opts.gamma, q.device) / opts.scale_base).repeat_interleave(2)  # (D,) < 0
        blocks = []
        for start in range(0, q.shape[-2], self.block):
            pos = q_pos[..., start : start + self.block]
            anchor = pos.max(dim=-1, keepdim=True).values  # (B, *, 1): the last query of the block
            # ζ^((n - c)/γ) >= 1 on queries, ζ^((c - m)/γ) <= 1 on keys; their product is ζ^((n - m)/γ).
            # Keys after the anchor are masked in a causal model; clamping keeps their factor finite.
            q_scale = torch.exp((pos - anchor).double().unsqueeze(-1) * rate)
            k_scale = torch.exp((anchor - k_pos).clamp_min(0).double().unsqueeze(-1) * rate)
            qb = q[..., start : start + self.block, :] * q_scale.unsqueeze(1).to(q.dtype)
            kb = k * k_scale.unsqueeze(1).to(k.dtype)
            blocks.append(torch.matmul(qb, kb.transpose(-1, -2)))
        return torch.cat(blocks, dim=-2) * self.scale
