"""``gaussian_prior``: dense softmax attention with a Gaussian locality prior on the logits.

Multiplying the attention distribution by a Gaussian density over positions and renormalising is the same as
adding G_ij = -(i - j)² / (2 σ_h²) to the logits (Lin et al. 2021 survey, arXiv 2106.04554, §"attention with
prior / prior that models locality"; Yang et al. 2018, "Modeling Localness for Self-Attention Networks",
arXiv 1810.10182; Guo et al. 2019, Gaussian Transformer, AAAI). Here the Gaussian is centred on the query
(i, j are positions since reset) with one width per head, σ_h = softplus(ρ_h), learned (``learn_sigma``) or
fixed at ``sigma``; Yang et al. additionally predict the centre and width from each query, which this entry
does not. The prior is added to whatever the positional scheme computes (``position.logits``), so it composes
with every scheme, and it is a relative bias, so the default KV cache streams exactly; ``max_cache`` bounds
the cache (keys more than max_cache steps back are ignored in full runs too), natural here since keys a few σ
away get negligible weight. Exact with respect to its own bias. Time O(T·S·D), memory O(T·S).
Shapes: q (B, H, T, D), k, v (B, H, S, D), bias (B, H, T, S).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rl_transformers.backbone.attention.base import Attention, attention_entropy, visible_mask
from rl_transformers.backbone.attention.full import window_limit
from rl_transformers.backbone.context import ForwardContext
from rl_transformers.backbone.registry import Capabilities, register


@dataclass(frozen=True)
class GaussianPriorOptions:
    sigma: float = 8.0
    """Width σ of the prior in positions (the initial value when learned), the same for every head."""
    learn_sigma: bool = True
    """Learn one σ_h per head (softplus parametrisation); False keeps σ fixed."""
    max_cache: int | None = None
    """Keep at most this many past keys (sliding window of max_cache + 1 keys incl. self); None = unbounded."""

    def __post_init__(self) -> None:
        if not (isinstance(self.sigma, (int, float)) and math.isfinite(self.sigma) and self.sigma > 0):
            raise ValueError(f"gaussian_prior sigma must be a finite number > 0, got {self.sigma!r}")
        if self.max_cache is not None and self.max_cache < 1:
            raise ValueError(f"max_cache must be >= 1 or None, got {self.max_cache!r}")


def inverse_softplus(x: float) -> float:
    """ρ with softplus(ρ) = x."""
    return x + math.log(-math.expm1(-x))


@register(
    "attention",
    "gaussian_prior",
    options=GaussianPriorOptions,
    capabilities=Capabilities(causal=True, exact=True, streaming="exact", noncausal=True),
)
class GaussianPriorAttention(Attention):
    rho: Tensor
    """(H,) σ_h = softplus(ρ_h): a parameter when learned, a buffer when fixed."""

    def __init__(self, cfg: Any, options: GaussianPriorOptions, position: Any, layer: int) -> None:
        super().__init__(cfg, options, position, layer)
        rho = torch.full((cfg.n_heads,), inverse_softplus(float(options.sigma)))
        if options.learn_sigma:
            self.rho = nn.Parameter(rho)
        else:
            self.register_buffer("rho", rho)

    @property
    def sigma(self) -> Tensor:
        """(H,) current widths σ_h."""
        return F.softplus(self.rho)

    def prior(self, q_pos: Tensor, k_pos: Tensor, dtype: torch.dtype) -> Tensor:
        """G (B, H, Tq, Tk) = -(i - j)² / (2 σ_h²)."""
        dist = (q_pos.unsqueeze(-1) - k_pos.unsqueeze(-2)).to(dtype).unsqueeze(1)
        sigma = self.sigma.to(dtype).view(1, -1, 1, 1)
        return -dist.pow(2) / (2 * sigma.pow(2))

    def attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        q_pos: Tensor,
        k_pos: Tensor,
        k_valid: Tensor,
        ctx: ForwardContext,
    ) -> Tensor:
        t = q.shape[2]
        mask = window_limit(visible_mask(t, k_valid, self.causal), t, self.options.max_cache)
        logits = self.position.logits(q, k, q_pos, k_pos, self.layer)
        dtype = torch.promote_types(logits.dtype, torch.float32)
        logits = logits + self.prior(q_pos, k_pos, dtype).to(logits.dtype)
        probs = torch.softmax(logits.masked_fill(~mask, float("-inf")), dim=-1)
        dropped = self.attn_dropout(probs) if self.training else probs
        out = torch.matmul(dropped, v)
        extra = self.position.value_term(dropped, q_pos, k_pos, self.layer)
        if ctx.collect_info:
            ctx.add_info(f"backbone/attention_entropy/layer{self.layer}", attention_entropy(probs).detach())
            ctx.add_info(f"backbone/gaussian_sigma/layer{self.layer}", self.sigma.mean().detach())
        return out if extra is None else out + extra
