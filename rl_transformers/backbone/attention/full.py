"""``full``: dense softmax attention (Vaswani et al. 2017, arXiv 1706.03762).

Uses ``torch.nn.functional.scaled_dot_product_attention`` (FlashAttention / memory-efficient kernels on GPU)
whenever the positional scheme does not touch the logits, and an explicit dense path with the scheme's bias /
scores otherwise. Streaming keeps an exact KV cache; ``max_cache`` bounds it, which turns the layer into a
sliding window in which each query sees itself and the ``max_cache`` keys before it (in chunked and full runs
alike). Cost: O(T·S·D) time, O(T·S) memory on the dense path.

``sink`` = n > 0 adds n learned key / value slots per head that every query may attend to besides its keys
(attention sinks, as ReLIC, Elawady et al. 2024, arXiv 2410.02751): with s_i = q_i K_sink^T / √D,
y_i = softmax([s_i, logits_i]) [V_sink; V]. The slots carry no position (neither rotated nor biased) and are
never cached; a query whose keys say little can put its weight there instead of on an arbitrary key. Off by
default (no parameters, the outputs of ``full`` unchanged); with sinks the dense path is used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rl_transformers.backbone.attention.base import (
    Attention,
    attention_entropy,
    dense_attention,
    same_segment,
    shared_mask,
    visible_mask,
)
from rl_transformers.backbone.context import ForwardContext
from rl_transformers.backbone.position.base import Position
from rl_transformers.backbone.registry import Capabilities, register


@dataclass(frozen=True)
class FullOptions:
    max_cache: int | None = None
    """Keep at most this many past keys (sliding window of max_cache + 1 keys incl. self); None = unbounded."""
    force_dense: bool = False
    """Always use the explicit dense path (never SDPA), e.g. for debugging or diagnostics."""
    sink: int = 0
    """Learned sink key / value slots per head that every query may attend to (0 = none)."""

    def __post_init__(self) -> None:
        if self.max_cache is not None and self.max_cache < 1:
            raise ValueError(f"max_cache must be >= 1 or None, got {self.max_cache!r}")
        check_sink(self.sink)


def check_sink(sink: Any) -> None:
    if not isinstance(sink, int) or isinstance(sink, bool) or sink < 0:
        raise ValueError(f"sink must be a non-negative int (number of sink slots per head), got {sink!r}")


class SinkSlots(nn.Module):
    """n learned key / value slots per head: k, v (H, n, D), initialised N(0, 0.02²)."""

    def __init__(self, n_heads: int, n: int, d_head: int) -> None:
        super().__init__()
        self.k = nn.Parameter(torch.randn(n_heads, n, d_head) * 0.02)
        self.v = nn.Parameter(torch.randn(n_heads, n, d_head) * 0.02)
        self.scale = 1.0 / math.sqrt(d_head)

    def softmax(self, q: Tensor, logits: Tensor) -> tuple[Tensor, Tensor]:
        """Softmax over the slots and the keys together: (probs of the keys (B, H, T, S), slot term (B, H, T, D))
        for queries q (B, H, T, D) with (masked, -inf) key logits (B, H, T, S)."""
        sink_logits = torch.matmul(q, self.k.to(q.dtype).transpose(-1, -2)) * self.scale  # (B, H, T, n)
        n = sink_logits.shape[-1]
        probs = torch.softmax(torch.cat([sink_logits, logits.to(q.dtype)], dim=-1), dim=-1)
        return probs[..., n:], torch.matmul(probs[..., :n], self.v.to(q.dtype))


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

    def __init__(self, cfg: Any, options: FullOptions, position: Position, layer: int) -> None:
        super().__init__(cfg, options, position, layer)
        self.sinks = SinkSlots(cfg.n_heads, options.sink, cfg.d_head) if options.sink else None

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
        dense = self.position.modifies_scores or self.options.force_dense or self.sinks is not None
        plain = not (dense or ctx.collect_info)
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
        if self.sinks is not None:
            return self._attend_with_sinks(self.sinks, q, k, v, q_pos, k_pos, mask, ctx)
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

    def _attend_with_sinks(
        self,
        sinks: SinkSlots,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        q_pos: Tensor,
        k_pos: Tensor,
        mask: Tensor,
        ctx: ForwardContext,
    ) -> Tensor:
        """The dense path with the sink slots in the softmax (see the module docstring)."""
        scores = self.position.logits_aligned if ctx.aligned else self.position.logits
        logits = scores(q, k, q_pos, k_pos, self.layer).masked_fill(~mask, float("-inf"))
        probs, from_sinks = sinks.softmax(q, logits)
        dropped = self.attn_dropout(probs) if self.training else probs
        out = torch.matmul(dropped, v) + from_sinks
        extra = self.position.value_term(dropped, q_pos, k_pos, self.layer)
        if ctx.collect_info:
            ctx.add_info(f"backbone/attention_entropy/layer{self.layer}", attention_entropy(probs).detach())
        return out if extra is None else out + extra
