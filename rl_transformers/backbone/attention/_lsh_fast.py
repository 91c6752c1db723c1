"""Row gathers for :mod:`lsh`'s sorted chunks: flat ``index_select`` of whole D-rows instead of ``gather`` on
R-fold expanded copies, and the chunk neighbourhoods gathered in one go (no concatenation of float tensors).

Same values as ``expand(...).gather(...)`` followed by :func:`neighbours` (zeros outside a row's chunks), so
the layer's maths is unchanged; only the memory traffic drops.
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

    Returns a (B, H, R, n, W·m, D) *overlapping view* (an ``unfold``, no W-fold copy): each (b, h, r) row's sorted
    chunks lie between -offsets[0] leading and offsets[-1] trailing zero chunks, the rows end to end, and window g
    of a row starts at its chunk g. Chunks outside a row are therefore zeros, as with :func:`neighbours`, never
    another row's keys (a NaN in one batch element cannot reach another through a masked 0 weight); the caller
    masks them (logits -inf: weight exactly 0, no gradient).
    """
    b, h, r, n, m = rows.shape
    d = x.shape[-1]
    lo, hi = -offsets[0], offsets[-1]
    n_windows = len(offsets)
    if not (lo or hi):
        return take_rows(x, rows).view(b, h, r, n, m, d)
    span = lo + n + hi  # chunks per row in the laid-out buffer
    # One extra row of filler at the end so every row has `span` window starts (only the first n are used).
    buf = x.new_zeros(b * h * r + 1, span, m, d)
    buf[:-1, lo : lo + n] = take_rows(x, rows).view(b * h * r, n, m, d)
    flat = buf.view(-1)
    windows = flat.unfold(0, n_windows * m * d, m * d)  # window g starts at chunk g of the buffer
    return windows[: b * h * r * span].view(b * h * r, span, n_windows * m * d)[:, :n].reshape(
        b, h, r, n, n_windows * m, d
    )


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
