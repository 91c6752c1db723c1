"""``full``: dense softmax attention (Vaswani et al. 2017, arXiv 1706.03762).

Uses ``torch.nn.functional.scaled_dot_product_attention`` (FlashAttention / memory-efficient kernels on GPU)
whenever the positional scheme does not touch the logits, and an explicit dense path with the scheme's bias /
scores otherwise. Streaming keeps an exact KV cache; ``max_cache`` bounds it, which turns the layer into a
sliding window in which each query sees itself and the ``max_cache`` keys before it (in chunked and full runs
alike). Cost: O(T·S·D) time, O(T·S) memory on the dense path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from rl_transformers.backbone.attention.base import (
    Attention,
    attention_entropy,
    dense_attention,
    same_segment,
    shared_mask,
    visible_mask,
)
from rl_transformers.backbone.context import ForwardContext
from rl_transformers.backbone.registry import Capabilities, register


@dataclass(frozen=True)
class FullOptions:
    max_cache: int | None = None
    """Keep at most this many past keys (sliding window of max_cache + 1 keys incl. self); None = unbounded."""
    force_dense: bool = False
    """Always use the explicit dense path (never SDPA), e.g. for debugging or diagnostics."""

    def __post_init__(self) -> None:
        if self.max_cache is not None and self.max_cache < 1:
            raise ValueError(f"max_cache must be >= 1 or None, got {self.max_cache!r}")


def window_limit(mask: Tensor, t: int, window: int | None) -> Tensor:
    """Restrict a (B, 1, T, S) bottom-right aligned mask to keys at most ``window`` steps before the query."""
    s = mask.shape[-1]
    if window is None or window >= s - 1:  # every key is within the window (i - j <= S - 1)
        return mask
    i = torch.arange(t, device=mask.device)[:, None] + (s - t)
    j = torch.arange(s, device=mask.device)[None, :]
    return mask & (i - j <= window)


def _segmented(mask: Tensor, ctx: ForwardContext, s: int) -> Tensor:
    """``mask`` restricted to keys of the query's own segment when rows restart inside the chunk."""
    same = same_segment(ctx, s)
    return mask if same is None else mask & same


@register(
    "attention",
    "full",
    options=FullOptions,
    capabilities=Capabilities(causal=True, exact=True, streaming="exact"),
)
class FullAttention(Attention):
    segment_masks = True
    drops_invalid_keys = True

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
        dropout_p = self.attn_dropout.p if self.training else 0.0
        plain = not (self.position.modifies_scores or self.options.force_dense or ctx.collect_info)
        unsegmented = ctx.segment is None
        if (
            plain
            and unsegmented
            and t == s
            and self.max_cache is None
            and (ctx.all_valid or bool(k_valid.all()))
        ):
            # No padding, no cache: the fused causal kernel (FlashAttention on GPU).
            return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, dropout_p=dropout_p)
        causal, window = self.causal, self.max_cache
        mask = shared_mask(
            ctx,
            ("full", t, causal, window),
            k_valid,
            lambda: _segmented(window_limit(visible_mask(t, k_valid, causal), t, window), ctx, s),
        )
        if plain:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
        out, probs = dense_attention(
            q,
            k,
            v,
            mask,
            self.position,
            q_pos,
            k_pos,
            self.layer,
            self.attn_dropout if self.training else None,
            aligned=ctx.aligned,
        )
        if ctx.collect_info:
            ctx.add_info(f"backbone/attention_entropy/layer{self.layer}", attention_entropy(probs).detach())
        return out
