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
``truncate_sigmas`` (off by default) selects the windowed form: keys further than w = ceil(m·max σ) are dropped,
an error bounded by :func:`truncation_bound` (prior weight exp(-w²/2σ²)-small), at O(T·(w + C)) time.
Shapes: q (B, H, T, D), k, v (B, H, S, D), bias (B, H, T, S).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rl_transformers.backbone.attention._flex import flex_pattern, use_flex
from rl_transformers.backbone.attention.base import Attention, attention_entropy, same_segment, visible_mask
from rl_transformers.backbone.attention.full import window_limit
from rl_transformers.backbone.context import ForwardContext
from rl_transformers.backbone.registry import Capabilities, register

WINDOW_CHUNK = 256
"""Queries per chunk of the windowed form."""


@dataclass(frozen=True)
class GaussianPriorOptions:
    sigma: float = 8.0
    """Width σ of the prior in positions (the initial value when learned), the same for every head."""
    learn_sigma: bool = True
    """Learn one σ_h per head (softplus parametrisation); False keeps σ fixed."""
    max_cache: int | None = None
    """Keep at most this many past keys (sliding window of max_cache + 1 keys incl. self); None = unbounded."""
    truncate_sigmas: float | None = None
    """Windowed form: drop keys further than w = ceil(truncate_sigmas · max_h σ_h) positions (their prior
    weight is below exp(-w²/2σ²), see :func:`truncation_bound`) and run in O(T·(w + C)) by query chunks;
    None (default) = the exact dense form. 6 gives w = 48 for σ = 8 and a relative weight below ~1e-8."""

    def __post_init__(self) -> None:
        if not (isinstance(self.sigma, (int, float)) and math.isfinite(self.sigma) and self.sigma > 0):
            raise ValueError(f"gaussian_prior sigma must be a finite number > 0, got {self.sigma!r}")
        t = self.truncate_sigmas
        if t is not None and not (isinstance(t, (int, float)) and math.isfinite(t) and t > 0):
            raise ValueError(f"gaussian_prior truncate_sigmas must be a finite number > 0 or None, got {t!r}")
        if self.max_cache is not None and self.max_cache < 1:
            raise ValueError(f"max_cache must be >= 1 or None, got {self.max_cache!r}")


def truncation_bound(window: int, sigma: float, logit_range: float, causal: bool) -> float:
    """Bound on the attention weight the windowed form drops for one query (derivation below).

    With content logits s_j (spread max_j s_j - s_self <= ``logit_range``) and prior g_d = -d²/(2σ²), the own
    key (d = 0) is always kept, so Z >= exp(s_self), and the dropped weight is
    ε <= Σ_{d > w} c·exp(s_j - s_self - d²/(2σ²)) <= c·exp(logit_range)·Σ_{k >= 0} exp(-(w + 1 + k)²/(2σ²)),
    c = 1 causal, 2 bidirectional (keys on both sides). With (w + 1 + k)² >= (w + 1)² + 2(w + 1)k the tail is a
    geometric series: ε <= c·exp(logit_range)·exp(-(w + 1)²/(2σ²)) / (1 - exp(-(w + 1)/σ²)). The output moves by
    ε·(o_kept - o_dropped), so its error is at most ε·max_{j,j'} |v_j - v_j'|.
    """
    w1 = window + 1
    tail = math.exp(-(w1**2) / (2 * sigma**2)) / -math.expm1(-w1 / sigma**2)
    return (1 if causal else 2) * math.exp(logit_range) * tail


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

    segment_masks = True
    """The dense form masks keys of other segments; the windowed form (``truncate_sigmas``) does not."""

    @classmethod
    def masks_segments(cls, options: Any) -> bool:
        return options.truncate_sigmas is None

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
        if use_flex(self, q):
            return self.attend_flex(q, k, v, q_pos, k_pos, k_valid, ctx)
        if self.options.truncate_sigmas is not None:
            return self.attend_windowed(q, k, v, q_pos, k_pos, k_valid, ctx)
        t = q.shape[2]
        mask = window_limit(visible_mask(t, k_valid, self.causal), t, self.options.max_cache)
        same = same_segment(
            ctx, k.shape[2]
        )  # rows restarting inside the chunk (Backbone.forward(starts=...))
        if same is not None:
            mask = mask & same
        scores = self.position.logits_aligned if ctx.aligned else self.position.logits
        logits = scores(q, k, q_pos, k_pos, self.layer)
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

    def attend_flex(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        q_pos: Tensor,
        k_pos: Tensor,
        k_valid: Tensor,
        ctx: ForwardContext,
    ) -> Tensor:
        """Either form as one FlexAttention call (``_flex``): the prior as a score modifier; the windowed form
        keeps |i - j| <= w in the mask, the dense form masks other segments."""
        inv_two_var = 0.5 / self.sigma.to(torch.promote_types(q.dtype, torch.float32)).pow(2)

        def prior(b: Tensor, h: Tensor, qi: Tensor, qp: Tensor, kp: Tensor) -> Tensor:
            return -(qp - kp).to(inv_two_var.dtype).pow(2) * inv_two_var[h]

        dense = self.options.truncate_sigmas is None
        w = 0 if dense else self.window()
        out = flex_pattern(
            self, q, k, v, q_pos, k_pos, k_valid, None if dense else lambda qp, kp: (qp - kp).abs() <= w,
            window=self.options.max_cache, past_window=True, causal_by_index=True, ctx=ctx if dense else None,
            score=prior,
        )  # fmt: skip
        if ctx.collect_info:
            ctx.add_info(f"backbone/gaussian_sigma/layer{self.layer}", self.sigma.mean().detach())
        return out

    def window(self) -> int:
        """w = ceil(truncate_sigmas · max_h σ_h): the windowed form keeps keys with |i - j| <= w."""
        return math.ceil(float(self.options.truncate_sigmas) * float(self.sigma.detach().max()))

    def attend_windowed(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        q_pos: Tensor,
        k_pos: Tensor,
        k_valid: Tensor,
        ctx: ForwardContext,
    ) -> Tensor:
        """The prior truncated at |i - j| <= w: query chunks of C, each over the key indices within w of it
        (valid keys have position = index + offset), one SDPA call with the prior as an additive mask (the
        scheme's logits on the explicit path). O(T·(C + w)) time and memory."""
        t, s = q.shape[2], k.shape[2]
        w, off = self.window(), s - t
        chunk = WINDOW_CHUNK
        outs = []
        p = self.attn_dropout.p if self.training else 0.0
        for a in range(0, t, chunk):
            z = min(t, a + chunk)
            lo, hi = max(0, a + off - w), (z + off if self.causal else min(s, z + off + w))
            qp, kp = q_pos[:, a:z], k_pos[:, lo:hi]
            i = torch.arange(a, z, device=q.device)[:, None] + off
            j = torch.arange(lo, hi, device=q.device)[None, :]
            mask = k_valid[:, None, None, lo:hi] & ((qp[:, :, None] - kp[:, None, :]).abs() <= w)[:, None]
            if self.causal:
                mask = mask & (j <= i)
            if self.options.max_cache is not None:
                mask = mask & (i - j <= self.options.max_cache)
            mask = mask | (j == i)
            dtype = torch.promote_types(q.dtype, torch.float32)
            prior = self.prior(qp, kp, dtype).to(q.dtype)
            if not self.position.modifies_scores:
                bias = prior.masked_fill(~mask, float("-inf"))
                kv = (k[:, :, lo:hi], v[:, :, lo:hi])
                out = F.scaled_dot_product_attention(
                    q[:, :, a:z], *kv, attn_mask=bias, dropout_p=p, scale=self.position.scale
                )
                outs.append(out)
                continue
            logits = self.position.logits(q[:, :, a:z], k[:, :, lo:hi], qp, kp, self.layer) + prior
            probs = torch.softmax(logits.masked_fill(~mask, float("-inf")), dim=-1)
            dropped = self.attn_dropout(probs) if self.training else probs
            out = torch.matmul(dropped, v[:, :, lo:hi])
            extra = self.position.value_term(dropped, qp, kp, self.layer)
            outs.append(out if extra is None else out + extra)
        if ctx.collect_info:
            ctx.add_info(f"backbone/gaussian_sigma/layer{self.layer}", self.sigma.mean().detach())
        return torch.cat(outs, dim=2)
