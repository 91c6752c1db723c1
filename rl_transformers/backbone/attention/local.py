"""Local patterns: ``local`` (sliding window), ``block_local`` (1D) and ``block_local_2d`` (Image Transformer).

``local``: each query attends the keys at most ``window`` positions away - causal: itself and the w keys before
it (w + 1 keys, the same convention as FlashAttention's ``window_size=(w, 0)`` and ``full``'s ``max_cache``);
bidirectional: |i - j| <= w (2w + 1 keys). Trained and run with the same window it is the length-extrapolation
"super-baseline" (Su 2023, see seeds/004). The KV cache keeps only the last w keys, so streaming is exact with
a bounded state.

``block_local`` (Parmar et al. 2018, arXiv 1802.05751, 1D local attention): positions are cut into query blocks
of ``block`` tokens (block b = positions [b·l, (b+1)·l)); a query of block b attends its own block and a memory
flange of ``flange`` positions before it (bidirectional: also ``flange`` positions after it); causal: only keys
j <= i. Blocks are defined on absolute positions since reset, so chunked runs with a cache of
``block - 1 + flange`` keys are exact.

``block_local_2d`` (Parmar et al. 2018, 2D local attention): tokens are pixels of H x W images in raster order
(position p is image p // (H·W), row and column divmod(p mod H·W, W)); queries in the same (qh x qw) query block
attend the keys of their image inside the rectangle that extends the query block by ``flange = (fh, fw)``
rows above / below and columns left / right; causal: only raster-earlier keys (j <= i). ``image_shape=None``
infers a single square-ish image from the number of keys of the call (W = ceil(sqrt(S))); that form has no
streaming (it raises when a cache is non-empty).

All three run as bands over the key sequence (queries in blocks of c tokens, keys gathered per block, explicit
sub-mask per block, see ``_banded``): time and memory O(T·(c + span)) per head, never T x S. Shapes: q (B, H, T, D),
k, v (B, H, S, D).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import Tensor

from rl_transformers.backbone.attention._banded import band_part, block_size
from rl_transformers.backbone.attention._dense import dense_pattern, prefer_dense
from rl_transformers.backbone.attention._flex import flex_pattern, use_flex
from rl_transformers.backbone.attention.base import Attention
from rl_transformers.backbone.context import ForwardContext
from rl_transformers.backbone.options import check_int, check_pair
from rl_transformers.backbone.registry import Capabilities, register


# ----------------------------------------------------------------------------------------------------- local
@dataclass(frozen=True)
class LocalOptions:
    window: int = 64
    """w: keys before the query it attends besides itself (w + 1 keys causal, 2w + 1 bidirectional)."""
    block: int | None = None
    """Compute-block length c (queries per block); None = about w (in [16, 256]). Speed knob only."""

    def __post_init__(self) -> None:
        check_int("local window", self.window, 0)
        check_int("local block", self.block, 1, optional=True)


@register(
    "attention",
    "local",
    options=LocalOptions,
    capabilities=Capabilities(causal=True, exact=True, streaming="exact"),
)
class LocalAttention(Attention):
    @property
    def max_cache(self) -> int | None:
        return self.options.window

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
        w = self.options.window
        if use_flex(self, q):
            return flex_pattern(self, q, k, v, q_pos, k_pos, k_valid, lambda qp, kp: (qp - kp).abs() <= w)
        if prefer_dense(k.shape[2], 2 * w + 1):
            return dense_pattern(self, q, k, v, q_pos, k_pos, k_valid, lambda qp, kp: (qp - kp).abs() <= w)
        windows = [(-w, 0 if self.causal else w)]
        part = band_part(
            self,
            q,
            k,
            v,
            q_pos,
            k_pos,
            k_valid,
            windows,
            lambda qp, kp: (qp - kp).abs() <= w,
            self.options.block,
        )
        return part.out


# ----------------------------------------------------------------------------------------------- block_local
@dataclass(frozen=True)
class BlockLocalOptions:
    block: int = 32
    """l_q: query block length in positions (block b = positions [b·l_q, (b+1)·l_q))."""
    flange: int = 32
    """l_m: memory flange, positions before the block (bidirectional: also after it) that its queries see."""

    def __post_init__(self) -> None:
        check_int("block_local block", self.block, 1)
        check_int("block_local flange", self.flange, 0)


@register(
    "attention",
    "block_local",
    options=BlockLocalOptions,
    capabilities=Capabilities(causal=True, exact=True, streaming="exact"),
)
class BlockLocalAttention(Attention):
    @property
    def max_cache(self) -> int | None:
        return self.options.block - 1 + self.options.flange

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
        lq, lm = self.options.block, self.options.flange
        span = lq - 1 + lm

        def allow(qp: Tensor, kp: Tensor) -> Tensor:
            start = qp.div(lq, rounding_mode="floor") * lq
            return (kp >= start - lm) & (kp <= start + lq - 1 + lm)

        if use_flex(self, q):
            return flex_pattern(self, q, k, v, q_pos, k_pos, k_valid, allow)
        if prefer_dense(k.shape[2], 2 * span + 1):
            return dense_pattern(self, q, k, v, q_pos, k_pos, k_valid, allow)
        windows = [(-span, 0 if self.causal else span)]
        return band_part(self, q, k, v, q_pos, k_pos, k_valid, windows, allow, block_size(q.shape[2], lq)).out


# -------------------------------------------------------------------------------------------- block_local_2d
@dataclass(frozen=True)
class BlockLocal2DOptions:
    image_shape: tuple[int, int] | None = (8, 8)
    """(H, W) of the images in raster order (position p: image p // (H·W)); None = one image per call with
    W = ceil(sqrt(S)) (no streaming)."""
    query_shape: tuple[int, int] = (4, 4)
    """(qh, qw): query block of qh rows x qw columns (blocks tile each image from its top-left corner)."""
    flange: tuple[int, int] = (2, 2)
    """(fh, fw): rows above/below and columns left/right of the query block its queries also see."""

    def __post_init__(self) -> None:
        if self.image_shape is not None:
            check_pair("block_local_2d image_shape", self.image_shape, 1)
        check_pair("block_local_2d query_shape", self.query_shape, 1)
        check_pair("block_local_2d flange", self.flange, 0)


@register(
    "attention",
    "block_local_2d",
    options=BlockLocal2DOptions,
    capabilities=Capabilities(causal=True, exact=True, streaming="exact"),
)
class BlockLocal2DAttention(Attention):
    def _reach(self, width: int) -> tuple[int, int]:
        """(row reach, column reach) of the memory rectangle around a query."""
        (qh, qw), (fh, fw) = self.options.query_shape, self.options.flange
        return qh - 1 + fh, min(qw - 1 + fw, width - 1)

    @property
    def max_cache(self) -> int | None:
        if self.options.image_shape is None:
            return None
        width = self.options.image_shape[1]
        rows, cols = self._reach(width)
        return rows * width + cols

    @property
    def cannot_stream(self) -> str | None:
        if self.options.image_shape is None:
            return (
                "block_local_2d with image_shape=None infers the image from each call and cannot stream; "
                "set image_shape=(H, W)"
            )
        return None

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
        s = k.shape[2]
        if self.options.image_shape is None:
            width = max(1, math.ceil(math.sqrt(s)))
            height = math.ceil(s / width)
        else:
            height, width = self.options.image_shape
        (qh, qw), (fh, fw) = self.options.query_shape, self.options.flange
        rows, cols = self._reach(width)
        pixels = height * width

        def coords(p: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            image = p.div(pixels, rounding_mode="floor")
            r = (p - image * pixels).div(width, rounding_mode="floor")
            return image, r, p - image * pixels - r * width

        def allow(qp: Tensor, kp: Tensor) -> Tensor:
            qi, qr, qc = coords(qp)
            ki, kr, kc = coords(kp)
            r0 = qr.div(qh, rounding_mode="floor") * qh
            c0 = qc.div(qw, rounding_mode="floor") * qw
            return (
                (ki == qi)
                & (kr >= r0 - fh)
                & (kr <= r0 + qh - 1 + fh)
                & (kc >= c0 - fw)
                & (kc <= c0 + qw - 1 + fw)
            )

        if use_flex(self, q):
            return flex_pattern(self, q, k, v, q_pos, k_pos, k_valid, allow)
        if prefer_dense(s, (2 * rows + 1) * (2 * cols + 1)):
            return dense_pattern(self, q, k, v, q_pos, k_pos, k_valid, allow, aligned=ctx.aligned)
        # One band per row offset: key j = i + dr·W + dc with |dr| <= rows, |dc| <= cols (merged if overlapping).
        last = 0 if self.causal else rows
        windows = [
            (dr * width - cols, dr * width + (0 if self.causal and dr == 0 else cols))
            for dr in range(-rows, last + 1)
        ]
        # c >= 16 keeps the gathered keys (c + 2·cols per row offset, D values each) below the logits' size
        c = min(q.shape[2], max(16, 2 * cols + 1), max(16, width))
        return band_part(self, q, k, v, q_pos, k_pos, k_valid, windows, allow, c).out
