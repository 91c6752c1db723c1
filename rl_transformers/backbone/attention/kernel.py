"""Random-feature attention: ``rfa`` (Peng et al. 2021, arXiv 2103.02143) and ``performer`` (FAVOR+,
Choromanski et al. 2021, arXiv 2009.14794).

Both approximate the softmax kernel exp(q·k/√D) by φ(q)·φ(k) with m random vectors w_r (a per-layer buffer
``features`` (H, m, D), drawn from a generator seeded by (seed, layer, draw number), optionally redrawn every
``redraw_every`` training-mode forwards; redraws change the module's buffer, never a streaming state, so states
built before a redraw are stale and callers should reset them). They then run the shared linear-attention
machinery of ``linear.py`` (chunked causal product, constant-size (S, z) streaming state, XL prefix folding).

- ``rfa``: trigonometric features φ(x) = m^{-1/2} [sin(W x'), cos(W x')], E[φ(x)·φ(y)] = exp(-|x'-y'|²/2).
  With ``normalize`` (the paper's choice) q and k are ℓ2-normalised and scaled by τ^{-1/2}, so the norm factors
  exp(|x'|²/2) are constants that cancel: the estimated kernel is exp(q̂·k̂/τ) (τ learned per head by default).
  Without it, x' = x/(τ^{1/2} D^{1/4}) and keys carry the factor exp(|k'|²/2) (unbounded for large keys), which
  estimates softmax(q·k/(τ√D)) itself. Trig features are sign-indefinite, so the estimated normaliser
  φ(q)·z can vanish or turn negative with few features. With ``normalize`` every true kernel value
  exp(-|q'-k'|²/2) lies in [exp(-2/τ), 1], so the normaliser is clipped to [exp(-2/τ) n, n], n = the
  (gate-weighted) number of keys seen, which keeps |y| <= exp(2/τ) max|v|; n rides along as one extra key
  feature equal to 1 (query feature 0), so F = 2m + 1. Without ``normalize`` it is clamped at ``eps``.
  Accuracy falls quickly as τ shrinks (kernel values down to exp(-2/τ) need many more features).
  ``gate`` (RFA-Gate): S_t = g_t S_{t-1} + (1 - g_t) φ(k_t) v_t^T, z likewise, g_t = σ(w_g·x_t + b_g) per head
  from the layer input x_t. The gate biases attention towards recent tokens: gated RFA is a different model, not
  an approximation of softmax attention. Causal only.
- ``performer``: positive features φ(x) = m^{-1/2} exp(W x' - |x'|²/2), x' = x/D^{1/4}; rows of W are
  orthogonal within blocks of D (QR of Gaussian blocks, rows rescaled to chi-distributed norms) or iid Gaussian.
  Stabilisation that never looks at other tokens: every term exp(w_r·q' - |q'|²/2)·exp(w_r·k' - |k'|²/2) is
  rewritten exactly as [exp(w_r·q' - |q'|²/2 + |w_r|²/2)]·[exp(-|k' - w_r|²/2)]; the key factor lies in (0, 1]
  with a data-independent offset, and each query's factors are divided by their own maximum over r (a per-query
  constant, cancelled by the normaliser). Chunked, streaming and full runs therefore see identical features.

Shapes: q, k (B, H, T/S, D), W (H, m, D), φ (B, H, T, F) with F = 2m (+1) (rfa) or m (performer); state S
(B, H, F, D), z (B, H, F). Cost O(T·F·D) per head; error ∝ m^{-1/2} (tested).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rl_transformers.backbone.attention.linear import FeatureMapAttention, check_chunk_size, work_dtype
from rl_transformers.backbone.context import ForwardContext
from rl_transformers.backbone.registry import Capabilities, register


def gaussian_features(gen: torch.Generator, n_heads: int, m: int, d: int) -> Tensor:
    """(H, m, D) iid N(0, I) rows (float64)."""
    return torch.randn(n_heads, m, d, generator=gen, dtype=torch.float64)


def orthogonal_features(gen: torch.Generator, n_heads: int, m: int, d: int) -> Tensor:
    """(H, m, D) rows orthogonal within each block of D rows, norms distributed like those of N(0, I_D)."""
    n_blocks = -(-m // d)
    g = torch.randn(n_heads, n_blocks, d, d, generator=gen, dtype=torch.float64)
    qm, r = torch.linalg.qr(g)
    qm = qm * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))[..., None, :]  # Haar-distributed
    w = qm.transpose(-1, -2).reshape(n_heads, n_blocks * d, d)[:, :m]  # rows of each block orthonormal
    norms = torch.randn(n_heads, m, d, generator=gen, dtype=torch.float64).norm(dim=-1)
    return w * norms[..., None]


def feature_seed(seed: int, layer: int, draw: int) -> int:
    """Deterministic generator seed of one draw of one layer."""
    return (seed * 1_000_003 + layer * 10_007 + draw * 101) % (2**63 - 1)


def _check_common(name: str, n_features: int, redraw_every: int, chunk_size: int) -> None:
    if not isinstance(n_features, int) or n_features < 1:
        raise ValueError(f"{name} n_features must be a positive int, got {n_features!r}")
    if not isinstance(redraw_every, int) or redraw_every < 0:
        raise ValueError(f"{name} redraw_every must be an int >= 0 (0 = never), got {redraw_every!r}")
    check_chunk_size(chunk_size)


class RandomFeatureAttention(FeatureMapAttention):
    """Owns the random matrix buffer ``features`` (H, m, D) and its seeded (re)draws."""

    features: Tensor
    """(H, m, D) random vectors w_r (a buffer: saved in checkpoints, moved with the module)."""
    n_draws: Tensor
    """() long: how many redraws happened (the draw number seeds the next one)."""
    train_calls: Tensor
    """() long: training-mode forwards seen (drives ``redraw_every``)."""

    def __init__(self, cfg: Any, options: Any, position: Any, layer: int) -> None:
        super().__init__(cfg, options, position, layer)
        self.register_buffer("features", self.draw_features(0).to(torch.get_default_dtype()))
        self.register_buffer("n_draws", torch.zeros((), dtype=torch.long))
        self.register_buffer("train_calls", torch.zeros((), dtype=torch.long))

    def sample(self, gen: torch.Generator) -> Tensor:
        """(H, m, D) float64 random vectors."""
        return gaussian_features(gen, self.n_heads, self.options.n_features, self.d_head)

    def draw_features(self, draw: int) -> Tensor:
        gen = torch.Generator().manual_seed(feature_seed(self.options.seed, self.layer, draw))
        return self.sample(gen)

    @torch.no_grad()
    def redraw_features(self) -> None:
        """Replace ``features`` by the next seeded draw (a buffer update; streaming states are not touched)."""
        self.n_draws.add_(1)
        self.features.copy_(self.draw_features(int(self.n_draws)))

    def forward(self, x: Tensor, ctx: ForwardContext, state: Any = None) -> tuple[Tensor, Any]:
        every = self.options.redraw_every
        if self.training and every > 0:
            with torch.no_grad():
                self.train_calls.add_(1)
            if int(self.train_calls) % every == 0:
                self.redraw_features()
        return super().forward(x, ctx, state)

    def project(self, x: Tensor) -> Tensor:
        """W x per head: (B, H, T, D) -> (B, H, T, m)."""
        return torch.einsum("bhtd,hmd->bhtm", x, self.features.to(x.dtype))


# -- rfa ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RFAOptions:
    n_features: int = 32
    """m: random frequencies; φ(x) has 2m entries (sin and cos)."""
    normalize: bool = True
    """ℓ2-normalise q and k (Peng 2021): kernel exp(q̂·k̂/τ). False: kernel exp(q·k/(τ√D)) with key norm factors."""
    temperature: float = 1.0
    """τ at initialisation (per head)."""
    learn_temperature: bool = True
    """Learn log τ per head (else τ stays fixed)."""
    gate: bool = False
    """RFA-Gate: S_t = g_t S_{t-1} + (1 - g_t) φ(k_t) v_t^T with g_t = σ(w_g·x_t + b_g) (causal only)."""
    gate_bias: float = 2.0
    """b_g at initialisation (σ(2) ≈ 0.88: a memory of roughly eight steps at start)."""
    redraw_every: int = 0
    """Redraw the random frequencies every this many training-mode forwards (0 = never)."""
    seed: int = 0
    """Seed of the random frequencies (combined with the layer index and the draw number)."""
    eps: float = 1e-6
    """Lower clamp of the normaliser φ(q)·z (trig features can make it vanish or turn negative)."""
    chunk_size: int = 64
    """C: tokens per chunk of the causal computation."""

    def __post_init__(self) -> None:
        _check_common("rfa", self.n_features, self.redraw_every, self.chunk_size)
        if not self.temperature > 0:
            raise ValueError(f"rfa temperature must be > 0, got {self.temperature!r}")
        if not self.eps > 0:
            raise ValueError(f"rfa eps must be > 0, got {self.eps!r}")


@register(
    "attention",
    "rfa",
    options=RFAOptions,
    capabilities=Capabilities(causal=True, exact=False, streaming="exact", noncausal=True),
)
class RFAAttention(RandomFeatureAttention):
    def __init__(self, cfg: Any, options: RFAOptions, position: Any, layer: int) -> None:
        super().__init__(cfg, options, position, layer)
        log_tau = torch.full((cfg.n_heads,), math.log(options.temperature))
        if options.learn_temperature:
            self.log_temperature = nn.Parameter(log_tau)
        else:
            self.register_buffer("log_temperature", log_tau)
        if options.gate:
            self.gate_proj = nn.Linear(cfg.d_model, cfg.n_heads)
            nn.init.constant_(self.gate_proj.bias, options.gate_bias)

    @classmethod
    def check_config(cls, cfg: Any, options: Any) -> None:
        super().check_config(cfg, options)
        if options.gate and not cfg.causal:
            raise ValueError("rfa gate=True is a causal recurrence; use causal=True or gate=False")

    @property
    def n_features(self) -> int:
        return 2 * self.options.n_features + int(self.count_feature)

    @property
    def count_feature(self) -> bool:  # type: ignore[override]
        return self.options.normalize

    def scaled(self, x: Tensor) -> Tensor:
        """x' = x̂ τ^{-1/2} (normalize) or x τ^{-1/2} D^{-1/4}."""
        scale = torch.exp(-0.5 * self.log_temperature).to(x.dtype)[None, :, None, None]
        if self.options.normalize:
            return F.normalize(x, dim=-1) * scale
        return x * scale * self.d_head**-0.25

    def trig(self, x: Tensor) -> Tensor:
        proj = self.project(x)
        return torch.cat([torch.sin(proj), torch.cos(proj)], dim=-1) / math.sqrt(self.options.n_features)

    def query_features(self, q: Tensor) -> Tensor:
        phi = self.trig(self.scaled(q))  # the query norm factor cancels in the ratio
        return F.pad(phi, (0, 1), value=0.0) if self.count_feature else phi

    def key_features(self, k: Tensor) -> Tensor:
        x = self.scaled(k)
        phi = self.trig(x)
        if self.options.normalize:  # |k'|² = 1/τ for every key: a common factor; last entry counts keys
            return F.pad(phi, (0, 1), value=1.0)
        return phi * torch.exp(0.5 * x.pow(2).sum(-1, keepdim=True))

    def gates(self, ctx: ForwardContext, k_valid: Tensor) -> tuple[Tensor, Tensor] | None:
        if not self.options.gate:
            return None
        # The gate reads the layer input of every key token: this forward's x and any memory prefix.
        x = ctx.attention_inputs[-1]
        mem = ctx.memory_for(len(ctx.attention_inputs) - 1)
        kv_in = x if mem is None else torch.cat([mem.h.to(x.dtype), x], dim=1)
        a = self.gate_proj(kv_in).transpose(1, 2)
        a = a.to(work_dtype(a.dtype))
        valid = k_valid[:, None, :]
        if ctx.collect_info:
            g = torch.sigmoid(a)[valid.expand_as(a)]
            ctx.add_info(f"backbone/rfa_gate/layer{self.layer}", g.mean().detach())
        # Padded tokens leave the state untouched: g = 1 and key weight 1 - g = 0.
        return torch.where(valid, F.logsigmoid(a), 0.0), torch.where(valid, torch.sigmoid(-a), 0.0)

    def safe_denominator(self, den: Tensor, count: Tensor | None) -> Tensor:
        if count is None:
            return den.clamp_min(self.options.eps)
        # With unit q̂, k̂ every true kernel value exp(-|q'-k'|²/2) lies in [exp(-2/τ), 1], so the true normaliser
        # lies in [exp(-2/τ) c, c] for c the (gate-weighted) key count: clip the estimate to that interval.
        low = torch.exp(-2.0 / self.log_temperature.detach().exp()).to(den.dtype)[None, :, None, None]
        return torch.minimum(torch.maximum(den, low * count), count).clamp_min(torch.finfo(den.dtype).tiny)


# -- performer ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PerformerOptions:
    n_features: int = 64
    """m: positive random features per head."""
    orthogonal: bool = True
    """Orthogonal random blocks (lower variance) instead of iid Gaussian rows."""
    redraw_every: int = 0
    """Redraw the random features every this many training-mode forwards (0 = never)."""
    seed: int = 0
    """Seed of the random features (combined with the layer index and the draw number)."""
    chunk_size: int = 64
    """C: tokens per chunk of the causal computation."""

    def __post_init__(self) -> None:
        _check_common("performer", self.n_features, self.redraw_every, self.chunk_size)


@register(
    "attention",
    "performer",
    options=PerformerOptions,
    capabilities=Capabilities(causal=True, exact=False, streaming="exact", noncausal=True),
)
class PerformerAttention(RandomFeatureAttention):
    def sample(self, gen: torch.Generator) -> Tensor:
        h, m, d = self.n_heads, self.options.n_features, self.d_head
        return (
            orthogonal_features(gen, h, m, d) if self.options.orthogonal else gaussian_features(gen, h, m, d)
        )

    @property
    def n_features(self) -> int:
        return self.options.n_features

    def _exponent(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(w_r·x' - |x'|²/2 (B, H, T, m), |w_r|²/2 (1, H, 1, m)) with x' = x / D^{1/4}."""
        x = x * self.d_head**-0.25
        half_w2 = 0.5 * self.features.to(x.dtype).pow(2).sum(-1)[None, :, None, :]
        return self.project(x) - 0.5 * x.pow(2).sum(-1, keepdim=True), half_w2

    def query_features(self, q: Tensor) -> Tensor:
        a, half_w2 = self._exponent(q)
        a = a + half_w2
        return torch.exp(a - a.amax(-1, keepdim=True).detach()) / math.sqrt(self.n_features)

    def key_features(self, k: Tensor) -> Tensor:
        a, half_w2 = self._exponent(k)
        return torch.exp(a - half_w2) / math.sqrt(self.n_features)  # = exp(-|k' - w_r|²/2) / √m <= 1/√m
