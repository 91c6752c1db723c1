"""``adaptive_span``: adaptive attention span (Sukhbaatar et al. 2019, arXiv 1905.07799).

Each head h learns a span z_h ∈ [0, max_span]; attention weights are multiplied by the soft ramp
m_z(x) = clamp((R + z − x) / R, 0, 1) of the distance x = i − j, i.e. softmax(s + log m_z), so keys further
than z + R get exactly zero weight. Those keys are not computed at all: queries are processed in blocks that
only gather the keys inside the current largest span, so time and memory fall as spans shrink
(``info["backbone/adaptive_span/scores/layer<l>"]`` counts the computed scores). The L1 penalty
``l1_weight``·mean_h(z_h), z in tokens, goes to ``aux_losses["adaptive_span_l1"]`` (the reference
implementation's ``--adapt-span-loss`` coefficient, 2e-6 for its small models, so it trims spans without
outweighing the task). With ``dynamic=True`` the span is a function of the query, z_t = max_span·σ(v·x_t + b)
(the paper's "dynamic attention span"). Streaming keeps a KV cache of max_span + R keys, which is exact because no
query can see further. Causal; O(T·(z+R)) time/memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rl_transformers.backbone.attention._flex import flex_pattern, use_flex
from rl_transformers.backbone.attention.base import Attention, visible_mask
from rl_transformers.backbone.context import ForwardContext
from rl_transformers.backbone.options import check_number
from rl_transformers.backbone.registry import Capabilities, register


@dataclass(frozen=True)
class AdaptiveSpanOptions:
    max_span: int = 256
    """S: the largest span a head may learn."""
    ramp: int = 32
    """R: width of the soft ramp."""
    init_span: float = 0.5
    """Initial span as a fraction of max_span."""
    dynamic: bool = False
    """Span predicted per query, z_t = S·σ(v·x_t + b), instead of one learned span per head."""
    query_block: int = 64
    """Queries processed per block (each block gathers only the keys inside the span)."""
    l1_weight: float = 2e-6
    """Weight of the L1 penalty per token of mean span (facebookresearch/adaptive-span's --adapt-span-loss for its
    small models). It was mean span / max_span at weight 1, about 2,000x heavier: ~0.5 per layer against a PPO
    loss of ~0.01-0.1."""

    def __post_init__(self) -> None:
        if self.max_span < 1 or self.ramp < 1 or self.query_block < 1:
            raise ValueError(
                f"max_span, ramp and query_block must be >= 1, got {self.max_span}, {self.ramp}, {self.query_block}"
            )
        if not 0.0 <= self.init_span <= 1.0:
            raise ValueError(f"init_span is a fraction of max_span in [0, 1], got {self.init_span!r}")
        check_number("l1_weight", self.l1_weight, low=0.0)


def span_ramp(distance: Tensor, span: Tensor, ramp: int) -> Tensor:
    """m_z(x) = clamp((R + z − x) / R, 0, 1)."""
    return ((ramp + span - distance) / ramp).clamp(0.0, 1.0)


@register(
    "attention",
    "adaptive_span",
    options=AdaptiveSpanOptions,
    capabilities=Capabilities(causal=True, exact=True, streaming="exact", noncausal=False),
)
class AdaptiveSpanAttention(Attention):
    aux_losses = ("adaptive_span_l1",)  # names this entry adds to BackboneOutput.aux_losses

    def __init__(self, cfg: Any, options: AdaptiveSpanOptions, position: Any, layer: int) -> None:
        super().__init__(cfg, options, position, layer)
        if options.dynamic:
            self.span_proj = nn.Linear(cfg.d_head, 1)  # per-head v, b on the query
            nn.init.zeros_(self.span_proj.weight)
            p = min(max(options.init_span, 1e-4), 1 - 1e-4)
            nn.init.constant_(self.span_proj.bias, math.log(p / (1 - p)))
            self.span_frac = None
        else:
            self.span_frac = nn.Parameter(torch.full((cfg.n_heads,), float(options.init_span)))

    @property
    def max_cache(self) -> int | None:
        return self.options.max_span + self.options.ramp

    def spans(self, q: Tensor) -> Tensor:
        """(B, H, T) spans in positions (static spans broadcast over batch and time)."""
        s = self.options.max_span
        if self.span_frac is not None:
            return (self.span_frac.clamp(0.0, 1.0) * s).view(1, -1, 1).expand(q.shape[0], -1, q.shape[2])
        return s * torch.sigmoid(self.span_proj(q)).squeeze(-1)

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
        t, s = q.shape[2], k.shape[2]
        spans = self.spans(q)
        ctx.add_aux("adaptive_span_l1", self.options.l1_weight * spans.mean())
        reach = math.ceil(float(spans.detach().max()) + self.options.ramp)  # no key further than this counts
        mask = visible_mask(t, k_valid, causal=True)
        if not self.position.modifies_scores and float(spans.detach().min()) > float(
            q_pos.max() - k_pos.min()
        ):
            # Every key is nearer than every span: the ramp is 1 (clamped, so it has no gradient either) and the
            # layer is plain causal attention - one fused kernel (the usual case for short RL contexts).
            if ctx.collect_info:
                ctx.add_info(f"backbone/adaptive_span/scores/layer{self.layer}", t * s)
            p = self.attn_dropout.p if self.training else 0.0
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=p, scale=self.position.scale
            )
        if use_flex(self, q):
            return self.attend_flex(q, k, v, q_pos, k_pos, k_valid, ctx, spans)
        outs, n_scores = [], 0
        blk = self.options.query_block
        for start in range(0, t, blk):
            stop = min(t, start + blk)
            k_hi = s - t + stop  # last key visible to this block (exclusive)
            k_lo = max(0, s - t + start - reach)
            qb, kb, vb = q[:, :, start:stop], k[:, :, k_lo:k_hi], v[:, :, k_lo:k_hi]
            qp, kp = q_pos[:, start:stop], k_pos[:, k_lo:k_hi]
            dist = (qp.unsqueeze(-1) - kp.unsqueeze(-2)).unsqueeze(1).to(q.dtype)  # (B, 1, tb, kb)
            ramp = span_ramp(dist, spans[:, :, start:stop].unsqueeze(-1), self.options.ramp)
            allowed = mask[:, :, start:stop, k_lo:k_hi] & (ramp > 0)
            n_scores += qb.shape[2] * kb.shape[2]
            if not self.position.modifies_scores:
                # softmax(s + log m_z) as one fused kernel with an additive mask (-inf outside the span);
                # every row keeps its own key (distance 0, ramp 1).
                bias = torch.where(allowed, ramp.clamp_min(1e-30).log(), torch.full_like(ramp, float("-inf")))
                p = self.attn_dropout.p if self.training else 0.0
                outs.append(
                    F.scaled_dot_product_attention(
                        qb, kb, vb, attn_mask=bias, dropout_p=p, scale=self.position.scale
                    )
                )
                continue
            logits = self.position.logits(qb, kb, qp, kp, self.layer)
            logits = logits + torch.where(allowed, ramp.clamp_min(1e-30).log(), torch.zeros_like(ramp))
            logits = logits.masked_fill(~allowed, float("-inf"))
            probs = torch.nan_to_num(torch.softmax(logits, dim=-1), nan=0.0)
            dropped = self.attn_dropout(probs) if self.training else probs
            out = torch.matmul(dropped, vb)
            extra = self.position.value_term(dropped, qp, kp, self.layer)
            outs.append(out if extra is None else out + extra)
        if ctx.collect_info:
            ctx.add_info(f"backbone/adaptive_span/scores/layer{self.layer}", n_scores)
            ctx.add_info(f"backbone/adaptive_span/span/layer{self.layer}", spans.detach().mean())
        return torch.cat(outs, dim=2)

    def attend_flex(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        q_pos: Tensor,
        k_pos: Tensor,
        k_valid: Tensor,
        ctx: ForwardContext,
        spans: Tensor,
    ) -> Tensor:
        """softmax(s + log m_z) as one FlexAttention call (``_flex``): keys with m_z = 0 are masked (and their
        tiles skipped), log m_z is the score modifier. spans (B, H, T)."""
        ramp_width = self.options.ramp
        fixed = spans.detach()

        def inside(b: Tensor, h: Tensor, qi: Tensor, qp: Tensor, kp: Tensor) -> Tensor:  # m_z > 0
            return span_ramp((qp - kp).to(fixed.dtype), fixed[b, h, qi], ramp_width) > 0

        def log_ramp(b: Tensor, h: Tensor, qi: Tensor, qp: Tensor, kp: Tensor) -> Tensor:
            ramp = span_ramp((qp - kp).to(spans.dtype), spans[b, h, qi], ramp_width)
            return ramp.clamp_min(1e-30).log()

        out = flex_pattern(
            self, q, k, v, q_pos, k_pos, k_valid, None, causal_by_index=True, keep=inside, score=log_ramp
        )
        if ctx.collect_info:
            ctx.add_info(f"backbone/adaptive_span/span/layer{self.layer}", fixed.mean())
        return out
