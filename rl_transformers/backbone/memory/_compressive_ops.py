"""Column bookkeeping of the ``compressive`` memory: per-row gathers and compaction without host syncs, the
longest piece of a chunk with restarts, and the content attention of its reconstruction loss."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def _expand_index(index: Tensor, like: Tensor, dim: int) -> Tensor:
    """(B, n) index shaped to gather / scatter ``like`` along ``dim`` (all other dims broadcast)."""
    shape = [index.shape[0]] + [1] * (like.dim() - 1)
    shape[dim] = index.shape[1]
    sizes = list(like.shape)
    sizes[dim] = index.shape[1]
    return index.view(shape).expand(sizes)


def gather_columns(x: Tensor, index: Tensor, dim: int) -> Tensor:
    """Per row b, the columns ``index[b]`` of x along ``dim``."""
    return x.gather(dim, _expand_index(index, x, dim))


def keep_last_filled(fill: Tensor, width: int) -> Tensor:
    """Target slot of every column: each row's last ``width`` filled columns go, in order, right-aligned to slots
    0..width-1; all other columns go to the dump slot ``width``."""
    rank = fill.long().flip(1).cumsum(1).flip(1)  # filled columns at or after this one (1 = the newest)
    keep = fill & (rank <= width)
    return torch.where(keep, width - rank, torch.full_like(rank, width))


def scatter_columns(x: Tensor, target: Tensor, width: int, dim: int) -> Tensor:
    """Place column j of x at slot target[b, j] (slot ``width`` is dropped) of a zero tensor of ``width`` slots."""
    sizes = list(x.shape)
    sizes[dim] = width + 1
    out = x.new_zeros(sizes)
    return out.scatter(dim, _expand_index(target, x, dim), x).narrow(dim, 0, width)


def longest_piece(seg: Tensor) -> Tensor:
    """0-dim: the most tokens any row's segment has in a chunk with restarts (``ctx.segment`` (B, T)), the width
    cutting and packing would pad its pieces to; no host sync."""
    counts = torch.zeros(seg.shape[0], seg.shape[1] + 1, dtype=torch.long, device=seg.device)
    return counts.scatter_add_(1, seg, torch.ones_like(seg)).max()


def content_attention(q: Tensor, k: Tensor, v: Tensor, valid: Tensor) -> Tensor:
    """softmax(q k^T / sqrt(D)) v over valid keys only; q (B, H, T, D), k/v (B, H, S, D), valid (B, S)."""
    logits = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    logits = logits.masked_fill(~valid[:, None, None, :], float("-inf"))
    return torch.matmul(torch.nan_to_num(torch.softmax(logits, -1), nan=0.0), v)
