"""Row gathers for :mod:`lsh`'s sorted chunks: flat ``index_select`` of whole D-rows instead of ``gather`` on
R-fold expanded copies, and the chunk neighbourhoods gathered in one go (no concatenation of float tensors).

Same values as ``expand(...).gather(...)`` followed by :func:`neighbours`, except that the (masked) keys
outside a row's chunks are not zeros, so the layer's maths is unchanged; only the memory traffic drops.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def flat_rows(order: Tensor, sp: int) -> Tensor:
    """order (B, H, R, Sp) token indices -> indices into the (B·H·Sp) rows of a (B, H, Sp, D) tensor."""
    b, h = order.shape[:2]
    base = torch.arange(b * h, device=order.device, dtype=order.dtype).view(b, h, 1, 1) * sp
    return order + base


def take_rows(x: Tensor, index: Tensor) -> Tensor:
    """x (B, H, Sp, D), index (...) into its B·H·Sp rows -> (..., D)."""
    d = x.shape[-1]
    return x.reshape(-1, d).index_select(0, index.reshape(-1)).view(*index.shape, d)


def unsort_rows(out: Tensor, rank: Tensor) -> Tensor:
    """out (B, H, R, Sp, D) in sorted order, rank (B, H, R, Sp) sorted place of each token -> token order."""
    b, h, r, sp, d = out.shape
    base = torch.arange(b * h * r, device=rank.device, dtype=rank.dtype).view(b, h, r, 1) * sp
    return out.reshape(-1, d).index_select(0, (rank + base).reshape(-1)).view(b, h, r, sp, d)


def chunk_windows(x: Tensor, rows: Tensor, offsets: list[int]) -> Tensor:
    """The sorted chunks n+o, o in ``offsets`` (consecutive), of x (B, H, Sp, D) given rows (B, H, R, n, m).

    Returns a (B, H, R, n, W·m, D) *overlapping view* (an ``unfold``, no W-fold copy): the sorted rows of all
    (B, H, R) are laid end to end between -offsets[0] leading and offsets[-1] trailing filler chunks (copies of
    row 0), and window g starts at chunk g. Chunks outside a (b, h, r) row thus hold the neighbouring row's keys
    or filler instead of zeros: the caller must mask them (logits -inf: weight exactly 0, no gradient). A masked
    weight of 0 times a NaN or inf is NaN, so when x is not all finite the windows are the zero-filled copy of
    :func:`neighbours` instead (a NaN in one batch element must not reach another); the uniform layout keeps the
    batched matmuls on strided views, which separators between rows would break.
    """
    b, h, r, n, m = rows.shape
    d = x.shape[-1]
    if offsets == [0]:
        return take_rows(x, rows).view(b, h, r, n, m, d)
    # A finite sum implies finite entries (about 20x cheaper than isfinite().all() on one CPU thread).
    if not bool(torch.isfinite(x.sum())):
        return neighbours(take_rows(x, rows).view(b, h, r, n, m, d), offsets, 0.0)
    lo, hi = -offsets[0], offsets[-1]
    width = len(offsets) * m
    index = rows.reshape(-1)
    if lo or hi:  # any row will do (masked): row 0, no zero row to append
        index = torch.cat([index.new_zeros(lo * m), index, index.new_zeros(hi * m)])
    flat = take_rows(x, index).reshape(-1)
    return flat.unfold(0, width * d, m * d).view(b, h, r, n, width, d)


def neighbours(x: Tensor, offsets: list[int], fill: float | int | bool) -> Tensor:
    """x (B, H, R, n, m, *) -> (B, H, R, n, len(offsets)·m, *): chunks n+o for each offset (``fill`` outside)."""
    n = x.shape[3]
    parts = []
    for o in offsets:
        if o == 0:
            parts.append(x)
            continue
        pad = torch.full_like(x[:, :, :, : abs(o)], fill)
        parts.append(
            torch.cat([pad, x[:, :, :, : n + o]], 3) if o < 0 else torch.cat([x[:, :, :, o:], pad], 3)
        )
    return torch.cat(parts, dim=4)


def minus_log_count(logits: Tensor, count: Tensor, r: int) -> Tensor:
    """logits - log N_ij for the round counts N_ij (1..r where it matters; N = 0 pairs are masked later).

    For r <= 3 the log is telescoped, sum over 2 <= c <= N_ij of log(c / (c - 1)), as r - 1 ``where`` passes
    (``log`` is a slow pass on CPU); otherwise one ``log``.
    """
    if r <= 3:
        for c in range(2, r + 1):
            logits = torch.where(count >= c, logits - math.log(c / (c - 1)), logits)
        return logits
    return logits - count.to(logits.dtype).clamp_min(1.0).log()
