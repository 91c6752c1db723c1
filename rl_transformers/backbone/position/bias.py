"""Additive distance biases: ``t5``, ``alibi``, ``kerple_power``, ``kerple_log``, ``sandwich``.

Each scheme adds a per-head bias b_h(i - j) to the scaled logits q_i·k_j/sqrt(D) (kind ``"bias"``). The bias
depends on the query and key positions only through their difference, so every kernel that builds its logits
with :meth:`Position.logits` (dense, banded, blocked) gets it on any sub-block, streaming is exact because the
positions continue across chunks, and a sliding window (``full`` with ``max_cache``) composes with it (the
"super-baseline" of length extrapolation, Su 2023).

- ``t5`` (Raffel et al. 2020, arXiv 1910.10683): the distance n = i - j falls into one of ``n_buckets``
  buckets - one bucket per distance below ``n_buckets/2`` (exact), then log-spaced buckets up to
  ``max_distance`` (all longer distances share the last one). Bidirectional models give past and future keys
  separate halves of the buckets; causal models use all buckets for the past. One learned scalar per bucket
  and head, shared by all layers.
- ``alibi`` (Press et al. 2022, arXiv 2108.12409): b = -m_h·|i - j| with fixed slopes m_h = 2^(-8h/H),
  h = 1..H; for H not a power of two, the 2^⌊log2 H⌋ slopes of that power plus every other slope of the next
  power (the paper's rule). Causal models only see i >= j, where |i - j| = i - j.
- ``kerple_power`` (Chi et al. 2022, arXiv 2205.09921): b = -r1·|i - j|^r2 with r1 > 0, 0 < r2 < 2, learned
  per layer and head as r1 = softplus(ρ1), r2 = 2·sigmoid(ρ2). At initialisation r1 = the ALiBi slopes and
  r2 = 1, i.e. kerple_power starts as ALiBi.
- ``kerple_log``: b = -r1·log(1 + r2·|i - j|) with r1, r2 = softplus(ρ1), softplus(ρ2) > 0, per layer and
  head.
- ``sandwich`` (Chi et al. 2023, arXiv 2212.10356): the inner product of two sinusoidal embeddings of width d'
  is Σ_{k<d'/2} cos((i - j)·ω_k), ω_k = 10000^(-2k/d'), a function of i - j only. We use
  b_h = λ_h·(Σ_{k<d'/2} cos((i - j)·ω_k) - d'/2): subtracting d'/2 (a constant per row, invisible to the
  softmax) makes b = 0 at distance 0 and <= 0 elsewhere. λ_h = λ·H/(8h) (heads with different rates, like
  ALiBi's slopes) or λ_h = λ with ``head_scales=False``; λ = ``lam`` and d' = ``dim`` are options.

Shapes: q_pos (B, *, Tq), k_pos (B, *, Tk) long -> bias (B, H, *, Tq, Tk). The bias is computed in float32
(float64 for float64 inputs) and cast to the logits' dtype. Cost: O(B·H·Tq·Tk) time and memory, like the
logits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rl_transformers.backbone.position.base import NoOptions, Position, heads_first, relative
from rl_transformers.backbone.position.relative import distinct_distances
from rl_transformers.backbone.registry import register


def alibi_slopes(n_heads: int) -> list[float]:
    """ALiBi's fixed per-head slopes 2^(-8h/H), with the paper's rule when H is not a power of two."""

    def geometric(n: int) -> list[float]:
        return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]

    if n_heads & (n_heads - 1) == 0:
        return geometric(n_heads)
    closest = 2 ** math.floor(math.log2(n_heads))
    return geometric(closest) + geometric(2 * closest)[0::2][: n_heads - closest]


def t5_bucket(rel: Tensor, bidirectional: bool, n_buckets: int, max_distance: int) -> Tensor:
    """Bucket index in [0, n_buckets) of the distances ``rel`` = query pos - key pos (T5's bucketing)."""
    n = n_buckets
    if bidirectional:
        n //= 2
        offset = (rel < 0).long() * n  # keys after the query use the upper half of the buckets
        dist = rel.abs()
    else:
        offset = torch.zeros_like(rel)
        dist = rel.clamp_min(0)
    exact = n // 2
    # Distances in [exact, max_distance) are spread over the n - exact remaining buckets on a log scale.
    ratio = torch.log(dist.double().clamp_min(1) / exact) / math.log(max_distance / exact)
    large = (exact + (ratio * (n - exact)).long()).clamp_max(n - 1)
    return offset + torch.where(dist < exact, dist, large)


def heads_view(values: Tensor, dist: Tensor) -> Tensor:
    """Per-head values (H,) shaped (1, H, 1, ...) to broadcast against ``dist.unsqueeze(1)``."""
    return values.view((1, -1) + (1,) * (dist.dim() - 1))


def inverse_softplus(x: Tensor) -> Tensor:
    """ρ with softplus(ρ) = x (x > 0)."""
    return x + torch.log(-torch.expm1(-x))


class DistanceBias(Position):
    """Shared plumbing of the "bias" schemes: logits = q·k/sqrt(D) + bias computed in a safe dtype."""

    kind = "bias"

    def bias(self, q_pos: Tensor, k_pos: Tensor, layer: int, dtype: torch.dtype | None = None) -> Tensor:
        """(B, H, *, Tq, Tk) bias in ``dtype`` (default float32)."""
        return self.distance_bias(relative(q_pos, k_pos), layer, dtype or torch.float32)

    def distance_bias(self, rel: Tensor, layer: int, dtype: torch.dtype) -> Tensor:
        """Bias (B, H, *, Tq, Tk) from the distances rel = q_pos - k_pos (B, *, Tq, Tk)."""
        raise NotImplementedError

    def logits(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        logits = torch.matmul(q, k.transpose(-1, -2)) * self.scale
        dtype = torch.promote_types(q.dtype, torch.float32)
        return logits + self.bias(q_pos, k_pos, layer, dtype).to(logits.dtype)


# -- T5 ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class T5Options:
    n_buckets: int = 32
    """Number of distance buckets (split in two halves, past / future, when causal=False)."""
    max_distance: int = 128
    """Distances >= max_distance share the last bucket."""

    def __post_init__(self) -> None:
        if self.n_buckets < 4:
            raise ValueError(f"t5 n_buckets must be >= 4, got {self.n_buckets!r}")
        if self.max_distance <= self.n_buckets // 2:
            raise ValueError(
                f"t5 max_distance must exceed n_buckets // 2 = {self.n_buckets // 2} (where the "
                f"log-spaced buckets start), got {self.max_distance!r}"
            )


@register("position", "t5", options=T5Options)
class T5Bias(DistanceBias):
    def __init__(self, cfg: Any, options: T5Options) -> None:
        super().__init__(cfg, options)
        self.table = nn.Parameter(torch.randn(options.n_buckets, cfg.n_heads) * 0.02)
        """(n_buckets, H) learned bias per bucket and head, shared by all layers."""

    def buckets(self, rel: Tensor) -> Tensor:
        opts = self.options
        return t5_bucket(rel, not self.cfg.causal, opts.n_buckets, opts.max_distance)

    def distance_bias(self, rel: Tensor, layer: int, dtype: torch.dtype) -> Tensor:
        return heads_first(self.table.to(dtype)[self.buckets(rel)])


# -- ALiBi ---------------------------------------------------------------------------------------------------
@register("position", "alibi", options=NoOptions)
class ALiBiBias(DistanceBias):
    def __init__(self, cfg: Any, options: NoOptions) -> None:
        super().__init__(cfg, options)
        self.slopes = alibi_slopes(cfg.n_heads)

    def distance_bias(self, rel: Tensor, layer: int, dtype: torch.dtype) -> Tensor:
        slopes = torch.tensor(self.slopes, dtype=dtype, device=rel.device)
        return -heads_view(slopes, rel) * rel.abs().to(dtype).unsqueeze(1)


# -- KERPLE --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class KerplePowerOptions:
    r1_init: float | None = None
    """Initial r1 > 0 of every head; None = the ALiBi slopes (so the scheme starts as ALiBi)."""
    r2_init: float = 1.0
    """Initial exponent r2 in (0, 2)."""

    def __post_init__(self) -> None:
        if self.r1_init is not None and self.r1_init <= 0:
            raise ValueError(f"kerple_power r1_init must be > 0 or None, got {self.r1_init!r}")
        if not 0 < self.r2_init < 2:
            raise ValueError(f"kerple_power r2_init must be in (0, 2), got {self.r2_init!r}")


@dataclass(frozen=True)
class KerpleLogOptions:
    r1_init: float = 1.0
    """Initial r1 > 0 of every head."""
    r2_init: float = 1.0
    """Initial r2 > 0 of every head."""

    def __post_init__(self) -> None:
        for name in ("r1_init", "r2_init"):
            if getattr(self, name) <= 0:
                raise ValueError(f"kerple_log {name} must be > 0, got {getattr(self, name)!r}")


class KerpleBias(DistanceBias):
    """r1, r2 learned per layer and head through unconstrained ρ1, ρ2 (n_layers, H)."""

    def __init__(self, cfg: Any, options: Any, r1: Tensor, rho2: Tensor) -> None:
        super().__init__(cfg, options)
        self.rho1 = nn.Parameter(inverse_softplus(r1.double()).float().expand(cfg.n_layers, -1).clone())
        self.rho2 = nn.Parameter(rho2.float().expand(cfg.n_layers, -1).clone())

    def r1(self, layer: int) -> Tensor:
        """(H,) r1 > 0 of ``layer``."""
        return F.softplus(self.rho1[layer])

    def r2(self, layer: int) -> Tensor:
        raise NotImplementedError


@register("position", "kerple_power", options=KerplePowerOptions)
class KerplePowerBias(KerpleBias):
    def __init__(self, cfg: Any, options: KerplePowerOptions) -> None:
        h = cfg.n_heads
        r1 = torch.tensor(alibi_slopes(h)) if options.r1_init is None else torch.full((h,), options.r1_init)
        rho2 = torch.full((h,), math.log(options.r2_init / (2 - options.r2_init)))  # 2·sigmoid(ρ2) = r2
        super().__init__(cfg, options, r1, rho2)

    def r2(self, layer: int) -> Tensor:
        """(H,) exponent in (0, 2)."""
        return 2 * torch.sigmoid(self.rho2[layer])

    def distance_bias(self, rel: Tensor, layer: int, dtype: torch.dtype) -> Tensor:
        dist = rel.abs().to(dtype).unsqueeze(1)
        r1, r2 = heads_view(self.r1(layer).to(dtype), rel), heads_view(self.r2(layer).to(dtype), rel)
        # d^r2 with d >= 1 where it is used, so the gradient d^r2·log d w.r.t. r2 stays finite at d = 0.
        powered = torch.where(
            dist > 0, dist.clamp_min(1) ** r2, torch.zeros((), dtype=dtype, device=rel.device)
        )
        return -r1 * powered


@register("position", "kerple_log", options=KerpleLogOptions)
class KerpleLogBias(KerpleBias):
    def __init__(self, cfg: Any, options: KerpleLogOptions) -> None:
        h = cfg.n_heads
        rho2 = inverse_softplus(torch.full((h,), options.r2_init, dtype=torch.float64))
        super().__init__(cfg, options, torch.full((h,), options.r1_init), rho2)

    def r2(self, layer: int) -> Tensor:
        """(H,) r2 > 0."""
        return F.softplus(self.rho2[layer])

    def distance_bias(self, rel: Tensor, layer: int, dtype: torch.dtype) -> Tensor:
        dist = rel.abs().to(dtype).unsqueeze(1)
        r1, r2 = heads_view(self.r1(layer).to(dtype), rel), heads_view(self.r2(layer).to(dtype), rel)
        return -r1 * torch.log1p(r2 * dist)


# -- Sandwich ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SandwichOptions:
    lam: float = 1.0
    """λ > 0: overall scale of the sinusoid inner-product bias."""
    dim: int = 128
    """d': width of the sinusoidal embeddings whose inner product gives the bias (even)."""
    head_scales: bool = True
    """Head h (1..H) uses λ·H/(8h), so heads attend over different ranges; False: every head uses λ."""
    base: float = 10000.0
    """Wavelength base of the sinusoids: ω_k = base^(-2k/d')."""

    def __post_init__(self) -> None:
        if self.lam <= 0:
            raise ValueError(f"sandwich lam must be > 0, got {self.lam!r}")
        if self.dim < 2 or self.dim % 2:
            raise ValueError(f"sandwich dim must be an even int >= 2, got {self.dim!r}")
        if self.base <= 1:
            raise ValueError(f"sandwich base must be > 1, got {self.base!r}")


def sandwich_profile(dist: Tensor, dim: int, base: float) -> Tensor:
    """Σ_{k<dim/2} cos(dist·ω_k) - dim/2 in float64 for integer distances (any shape)."""
    omega = base ** (-torch.arange(0, dim, 2, dtype=torch.float64, device=dist.device) / dim)
    return torch.cos(dist.double().unsqueeze(-1) * omega).sum(-1) - dim / 2


@register("position", "sandwich", options=SandwichOptions)
class SandwichBias(DistanceBias):
    def __init__(self, cfg: Any, options: SandwichOptions) -> None:
        super().__init__(cfg, options)
        h = cfg.n_heads
        self.lams = [
            options.lam * h / (8 * (i + 1)) if options.head_scales else options.lam for i in range(h)
        ]

    def distance_bias(self, rel: Tensor, layer: int, dtype: torch.dtype) -> Tensor:
        # The profile needs d'/2 cosines per distance: evaluate it once per distinct distance, then gather.
        distinct, index = distinct_distances(rel)
        profile = sandwich_profile(distinct, self.options.dim, self.options.base).to(dtype)[index]
        lams = torch.tensor(self.lams, dtype=dtype, device=rel.device)
        return heads_view(lams, rel) * profile.unsqueeze(1)
