"""Blocked / banded building blocks shared by the fixed sparse patterns (local, sparse, global_local).

A sparse pattern is computed as a few *parts*, each a softmax over a small gathered key set, and the parts are
merged exactly with their log-sum-exp (softmax over a disjoint union of key sets):

- :func:`gathered_part` - queries cut into compute blocks of ``c`` consecutive tokens (B, H, N, c, D); every
  block attends a gathered key set (B, H, N, K, D) given by key indices (a band around the block, a few
  bands, per-row global / summary / random keys). An explicit (B, H|1, N, c, K) sub-mask, built from the
  absolute positions of the queries and keys, selects the pattern inside the gathered set. Cost O(T·K·D).
- :func:`residue_part` - keys with (i - j) mod l == 0: the sequence is reshaped into l residue classes and
  attention runs inside each class (B, H, l, T/l, S/l). Cost O(T·S/l·D).
- :func:`global_rows` - the few rows of global queries, dense over all keys. Cost O(G·S·D).

Every part calls ``position.logits`` on its blocks with the gathered positions, so "bias" / "scores" schemes
work unchanged, and adds ``position.value_term``. Nothing of size T x S is ever created. Patterns are defined on
absolute positions (q_pos, k_pos) so chunked runs with a KV cache equal full runs; key indices only choose which
keys are gathered (valid keys of a row satisfy k_pos = index + offset). Parts must be disjoint: each pattern
assigns every (query, key) pair to one part; the query's own key is always attended, by the band part.

Shapes: q (B, H, T, D); k, v (B, H, S, D) with the T queries being the last T keys; q_pos (B, T); k_pos,
k_valid (B, S).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

Allow = Callable[[Tensor, Tensor], Tensor]
"""(q_pos (B, 1, N, c, 1), k_pos (B, 1, N, 1, K)) -> bool mask broadcastable to (B, H, N, c, K)."""


@dataclass
class Part:
    """Attention of the T queries over one disjoint key set."""

    out: Tensor
    """(B, H, T, D) output normalised within the part."""
    lse: Tensor
    """(B, H, T) log-sum-exp of the part's logits (-inf where the query has no key in this part)."""


def merge_parts(parts: list[Part]) -> Tensor:
    """Exact softmax over the union of the parts' key sets: (B, H, T, D)."""
    if len(parts) == 1:
        return parts[0].out
    lse = torch.logsumexp(torch.stack([p.lse for p in parts]), dim=0)
    out = torch.zeros_like(parts[0].out)
    for p in parts:
        out = out + torch.exp(p.lse - lse).unsqueeze(-1) * p.out
    return out


def softmax_part(
    logits: Tensor,
    mask: Tensor,
    v: Tensor,
    att: Any,
    q_pos: Tensor,
    k_pos: Tensor,
) -> tuple[Tensor, Tensor]:
    """Masked softmax of ``logits`` (..., Tq, K) applied to v (..., K, D); returns (out, lse).

    Rows without any allowed key give out = 0 and lse = -inf, with finite gradients.
    """
    logits = logits.masked_fill(~mask, float("-inf"))
    top = logits.amax(dim=-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top)).detach()
    e = torch.exp(logits - top)
    total = e.sum(dim=-1, keepdim=True)
    has = total > 0
    safe = torch.where(has, total, torch.ones_like(total))
    probs = e / safe
    lse = torch.where(has, top + safe.log(), torch.full_like(total, float("-inf"))).squeeze(-1)
    if att.training and att.attn_dropout.p > 0:
        probs = att.attn_dropout(probs)  # elementwise, so dropping inside each part == dropping the union
    out = torch.matmul(probs, v)
    extra = att.position.value_term(probs, q_pos, k_pos, att.layer)
    return (out if extra is None else out + extra), lse


def row_offsets(q_pos: Tensor, s: int) -> Tensor:
    """(B,) offset such that a valid key at index j of a row has position j + offset."""
    return q_pos[:, -1] - (s - 1)


def block_size(t: int, span: int, lo: int = 16, hi: int = 128) -> int:
    """Compute-block length c: a query block gathers c + span keys, so memory is T·(c + span) per head; c about
    span / 2 within [lo, hi] (never more than T) keeps that near 1.5 x the band while blocks stay matmul-sized."""
    return max(1, min(t, max(lo, min(span // 2, hi))))


@dataclass
class QueryBlocks:
    """The T queries cut into N blocks of c consecutive tokens (the last block padded)."""

    q: Tensor
    """(B, H, N, c, D)."""
    pos: Tensor
    """(B, N, c) positions (padding continues the last position)."""
    idx: Tensor
    """(N, c) key index of each query (>= S for padding)."""
    t: int

    @property
    def n(self) -> int:
        return self.q.shape[2]

    @property
    def c(self) -> int:
        return self.q.shape[3]

    def unblock(self, x: Tensor) -> Tensor:
        """(B, H, N, c, *) -> (B, H, T, *)."""
        b, h = x.shape[:2]
        return x.reshape(b, h, self.n * self.c, *x.shape[4:])[:, :, : self.t]


def query_blocks(q: Tensor, q_pos: Tensor, s: int, c: int) -> QueryBlocks:
    b, h, t, d = q.shape
    n = math.ceil(t / c)
    pad = n * c - t
    if pad:
        q = F.pad(q, (0, 0, 0, pad))
        extra = q_pos[:, -1:] + torch.arange(1, pad + 1, device=q_pos.device)
        q_pos = torch.cat([q_pos, extra], dim=1)
    idx = (torch.arange(n * c, device=q.device) + (s - t)).view(n, c)
    return QueryBlocks(q.view(b, h, n, c, d), q_pos.view(b, n, c), idx, t)


def window_index(blocks: QueryBlocks, windows: list[tuple[int, int]]) -> Tensor:
    """(N, K) key indices of a block: for each window (lo, hi), keys i + lo .. i + hi of every query i.

    Overlapping windows are merged so no key is gathered twice.
    """
    c = blocks.c
    spans = sorted((lo, c - 1 + hi) for lo, hi in windows)  # key range relative to the block start
    merged: list[list[int]] = []
    for a, z in spans:
        if merged and a <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], z)
        else:
            merged.append([a, z])
    start = blocks.idx[:, :1]
    device = blocks.idx.device
    rel = torch.cat([torch.arange(a, z + 1, device=device) for a, z in merged])
    return start + rel


@dataclass
class Keys:
    """A gathered key set: k, v (B, H, N, K, D); pos, valid (B, N, K); idx (B|1, N, K) key index (-1: none)."""

    k: Tensor
    v: Tensor
    pos: Tensor
    valid: Tensor
    idx: Tensor


def gather_keys(
    k: Tensor,
    v: Tensor,
    k_pos: Tensor,
    k_valid: Tensor,
    idx: Tensor,
    expected_pos: Tensor | None = None,
) -> Keys:
    """Gather keys by index ``idx`` (N, K) shared by all rows or (B, N, K) per row; out-of-range = absent.

    With ``expected_pos`` (same shape as idx) a gathered key counts only if its position matches.
    """
    b, h, s, d = k.shape
    inside = (idx >= 0) & (idx < s)
    safe = idx.clamp(0, max(s - 1, 0))
    if idx.dim() == 2:
        n, kk = idx.shape
        flat = safe.reshape(-1)
        kb = k.index_select(2, flat).view(b, h, n, kk, d)
        vb = v.index_select(2, flat).view(b, h, n, kk, d)
        pos = k_pos.index_select(1, flat).view(b, n, kk)
        valid = k_valid.index_select(1, flat).view(b, n, kk) & inside
        idx = idx.unsqueeze(0)
        inside = inside.unsqueeze(0)
    else:
        n, kk = idx.shape[1:]
        flat = safe.reshape(b, -1)
        index = flat[:, None, :, None].expand(b, h, flat.shape[1], d)
        kb = torch.gather(k, 2, index).view(b, h, n, kk, d)
        vb = torch.gather(v, 2, index).view(b, h, n, kk, d)
        pos = torch.gather(k_pos, 1, flat).view(b, n, kk)
        valid = torch.gather(k_valid, 1, flat).view(b, n, kk) & inside
    if expected_pos is not None:
        valid = valid & (pos == expected_pos)
    return Keys(kb, vb, pos, valid, torch.where(inside, idx, torch.full_like(idx, -1)))


def gathered_part(
    att: Any,
    blocks: QueryBlocks,
    keys: Keys,
    allow: Allow | None,
    include_self: bool,
) -> Part:
    """Attention of each query block over its gathered keys, under ``allow`` (+ padding, causality, self rule).

    ``include_self``: the query's own key is always attended (band part); otherwise it is excluded (every other
    part, so it is counted once). Keys are matched to queries by index when ``keys.idx`` is given (>= 0).
    """
    qp = blocks.pos[:, None, :, :, None]
    kp = keys.pos[:, None, :, None, :]
    mask = keys.valid[:, None, :, None, :]
    if allow is not None:
        mask = mask & allow(qp, kp)
    if att.causal:
        mask = mask & (kp <= qp)
    is_self = keys.idx[:, None, :, None, :] == blocks.idx[None, None, :, :, None]
    mask = (mask | is_self) if include_self else (mask & ~is_self)
    logits = att.position.logits(blocks.q, keys.k, blocks.pos, keys.pos, att.layer)
    out, lse = softmax_part(logits, mask, keys.v, att, blocks.pos, keys.pos)
    return Part(blocks.unblock(out), blocks.unblock(lse.unsqueeze(-1)).squeeze(-1))


def band_part(
    att: Any,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_pos: Tensor,
    k_pos: Tensor,
    k_valid: Tensor,
    windows: list[tuple[int, int]],
    allow: Allow | None,
    c: int | None = None,
) -> Part:
    """Banded part: query i may see keys i + lo .. i + hi for each (lo, hi) in ``windows``, under ``allow``.

    Always includes the query's own key. Memory O(T·(c + hi - lo)) per head.
    """
    span = max(hi - lo for lo, hi in windows) if windows else 0
    c = block_size(q.shape[2], span) if c is None else min(c, q.shape[2])
    blocks = query_blocks(q, q_pos, k.shape[2], c)
    keys = gather_keys(k, v, k_pos, k_valid, window_index(blocks, windows or [(0, 0)]))
    return gathered_part(att, blocks, keys, allow, include_self=True)


def position_index(q_pos: Tensor, s: int, positions: Tensor) -> Tensor:
    """(B, *P) key index of each absolute position in ``positions`` (B|1, *P) for every row."""
    off = row_offsets(q_pos, s)
    return positions - off.view(-1, *([1] * (positions.dim() - 1)))


def columns_part(
    att: Any,
    q: Tensor,
    q_pos: Tensor,
    s: int,
    keys: Keys,
    allow: Allow | None,
) -> Part:
    """A key set (B, H, 1, G, D) shared by all queries of a row (global / summary keys), own key excluded."""
    blocks = query_blocks(q, q_pos, s, q.shape[2])
    return gathered_part(att, blocks, keys, allow, include_self=False)


def explicit_keys(k: Tensor, v: Tensor, pos: Tensor, valid: Tensor, idx: Tensor | None = None) -> Keys:
    """Wrap a ready key set k, v (B, H, G, D), pos, valid (B, G) as one block of :class:`Keys`."""
    if idx is None:
        idx = torch.full_like(pos, -1)
    return Keys(k.unsqueeze(2), v.unsqueeze(2), pos.unsqueeze(1), valid.unsqueeze(1), idx.unsqueeze(1))


def residue_part(
    att: Any,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_pos: Tensor,
    k_pos: Tensor,
    k_valid: Tensor,
    stride: int,
    allow: Allow | None,
) -> Part:
    """Keys j with (i - j) mod stride == 0 for query i (own key excluded), under ``allow``.

    Keys and queries are front-padded to multiples of ``stride`` and reshaped to (B, H, l, S'/l, D), so the
    keys of a residue class are contiguous; logits are (B, H, l, T'/l, S'/l).
    """
    b, h, t, d = q.shape
    s = k.shape[2]
    pk, pq = (-s) % stride, (-t) % stride
    sp, tp = s + pk, t + pq
    kk = F.pad(k, (0, 0, pk, 0)).view(b, h, sp // stride, stride, d).transpose(2, 3)
    vv = F.pad(v, (0, 0, pk, 0)).view(b, h, sp // stride, stride, d).transpose(2, 3)
    kpos = F.pad(k_pos, (pk, 0)).view(b, sp // stride, stride).transpose(1, 2)
    kval = F.pad(k_valid, (pk, 0)).view(b, sp // stride, stride).transpose(1, 2)
    qq = F.pad(q, (0, 0, pq, 0)).view(b, h, tp // stride, stride, d).transpose(2, 3)
    qpos = F.pad(q_pos, (pq, 0)).view(b, tp // stride, stride).transpose(1, 2)
    # padded-key index of every key / query; the query at padded index i' is the key at sp - tp + i'
    kidx = torch.arange(sp, device=q.device).view(sp // stride, stride).t()
    qidx = (torch.arange(tp, device=q.device) + (sp - tp)).view(tp // stride, stride).t()
    qp, kp = qpos[:, None, :, :, None], kpos[:, None, :, None, :]
    mask = kval[:, None, :, None, :] & ((qp - kp).remainder(stride) == 0)  # by position, not only by index
    if allow is not None:
        mask = mask & allow(qp, kp)
    if att.causal:
        mask = mask & (kp <= qp)
    mask = mask & (kidx[:, None, :] != qidx[:, :, None])
    logits = att.position.logits(qq, kk, qpos, kpos, att.layer)
    out, lse = softmax_part(logits, mask, vv, att, qpos, kpos)
    out = out.transpose(2, 3).reshape(b, h, tp, d)[:, :, pq:]
    lse = lse.transpose(2, 3).reshape(b, h, tp)[:, :, pq:]
    return Part(out, lse)


def global_rows(
    att: Any,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_pos: Tensor,
    k_pos: Tensor,
    k_valid: Tensor,
    positions: Tensor,
    out: Tensor,
) -> Tensor:
    """Replace the outputs of queries at global ``positions`` (G,) by dense attention over all S keys."""
    t, s = q.shape[2], k.shape[2]
    match = q_pos[:, :, None] == positions  # (B, T, G)
    if not bool(match.any()):
        return out
    b, h, _, d = q.shape
    found = match.any(dim=1)  # (B, G)
    t_of = match.to(torch.uint8).argmax(dim=1)  # (B, G) query index of each global position
    qg = torch.gather(q, 2, t_of[:, None, :, None].expand(b, h, -1, d))
    gpos = positions.expand(b, -1)
    kp = k_pos[:, None, None, :]
    mask = k_valid[:, None, None, :] & found[:, None, :, None]
    if att.causal:
        mask = mask & (kp <= gpos[:, None, :, None])
    own = torch.arange(s, device=q.device)[None, None, :] == (t_of + (s - t))[:, :, None]
    mask = mask | own[:, None]
    logits = att.position.logits(qg, k, gpos, k_pos, att.layer)
    g_out, _ = softmax_part(logits, mask, v, att, gpos, k_pos)
    slot = match.to(torch.uint8).argmax(dim=2)  # (B, T)
    picked = torch.gather(g_out, 2, slot[:, None, :, None].expand(b, h, t, d))
    return torch.where(match.any(dim=2)[:, None, :, None], picked, out)
