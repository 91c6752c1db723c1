"""Kernels of ``routing`` (see its module docstring): per-cluster blocks (explicit or through the fused kernel),
the dense masked form, and the sliding window of the local heads.

Shapes: q (B, h, T, D); k, v (B, h, S, D) with the new tokens last; cluster ids (B, h, T|S); blocks
(B, h, k, M, D).
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from rl_transformers.backbone.attention import _dense
from rl_transformers.backbone.attention._routing_flash import routing_flash, routing_flash_applies
from rl_transformers.backbone.attention.base import Attention
from rl_transformers.backbone.attention.lsh import per_head_logits, per_head_value_term


class _Operands(NamedTuple):
    """One call's operands: q (B, h, T, D), k, v (B, h, S, D), their positions (B, T) and (B, S), and the
    cluster ids of the queries, cq (B, h, T), and of the keys, kc (B, h, S), where padding joins no cluster."""

    q: Tensor
    k: Tensor
    v: Tensor
    q_pos: Tensor
    k_pos: Tensor
    cq: Tensor
    kc: Tensor


def _masked_softmax(logits: Tensor, allowed: Tensor) -> Tensor:
    """Softmax over allowed entries (every row has at least one)."""
    return torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)


def _gather_rows(x: Tensor, index: Tensor) -> Tensor:
    """x (B, h, N, D), index (B, h, *I) -> (B, h, *I, D)."""
    b, h, _, d = x.shape
    flat = index.reshape(b, h, -1)
    return x.gather(2, flat.unsqueeze(-1).expand(b, h, flat.shape[-1], d)).view(*index.shape, d)


def _gather_pos(pos: Tensor, index: Tensor) -> Tensor:
    """pos (B, N), index (B, h, *I) -> (B, h, *I)."""
    b, h = index.shape[:2]
    flat = index.reshape(b, h, -1)
    return pos[:, None, :].expand(b, h, pos.shape[1]).gather(2, flat).view_as(index)


def cluster_attention(
    att: Attention,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_pos: Tensor,
    k_pos: Tensor,
    k_valid: Tensor,
    cq: Tensor,
    ck: Tensor,
    n_clusters: int,
    heads: list[int],
    max_cache: int | None = None,
    path: Literal["auto", "dense", "blocked", "flash"] = "auto",
) -> Tensor:
    """Each query attends the visible keys of its cluster plus its own key: (B, h, T, D).

    q (B, h, T, D), k, v (B, h, S, D); cq (B, h, T), ck (B, h, S) cluster ids; causal from ``att.causal``.
    ``path``: "blocked" = per-cluster padded blocks, "dense" = masked T x S, "flash" = the clusters' slots as
    one CPU flash call (:mod:`~rl_transformers.backbone.attention._routing_flash`, where it applies, else
    "auto"), "auto" = flash for long calls (``_dense.prefer_fused``) where it applies, else blocked unless the
    padded blocks would be larger than the dense matrix.
    """
    t, s = q.shape[2], k.shape[2]
    if (
        path == "flash" or (path == "auto" and _dense.prefer_fused(t) and not _dense.prefer_dense(s, 0))
    ) and (routing_flash_applies(att, q, max_cache)):
        scale = att.position.scale if att.position.scale is not None else q.shape[-1] ** -0.5
        return routing_flash(q, k, v, k_valid, cq, ck, n_clusters, att.causal, scale)
    if path == "flash":
        path = "auto"
    kc = torch.where(k_valid[:, None, :], ck, torch.full_like(ck, n_clusters))  # padding joins no cluster
    count_q = F.one_hot(cq, n_clusters).sum(2)  # (B, h, k)
    count_k = F.one_hot(kc, n_clusters + 1)[..., :n_clusters].sum(2)
    mq, mk = int(count_q.max()), max(int(count_k.max()), 1)
    ops = _Operands(q, k, v, q_pos, k_pos, cq, kc)
    # streaming steps and RL training windows: the blocks' fixed cost dominates
    short = _dense.prefer_dense(s, 0)
    if path == "dense" or (path == "auto" and (short or n_clusters * mq * (mk + 1) >= t * s)):
        return _dense_clusters(att, ops, heads, max_cache)
    tok_q, ok_q = _slots(cq, count_q, t, mq)
    tok_k, ok_k = _slots(kc, count_k, s, mk)
    return _blocked_clusters(att, ops, (tok_q, ok_q, tok_k, ok_k), heads, max_cache, path)


def _dense_clusters(att: Attention, ops: _Operands, heads: list[int], max_cache: int | None) -> Tensor:
    """The cluster rule as a T x S mask: (B, h, T, D)."""
    q, k, v, q_pos, k_pos, cq, kc = ops
    t, s = q.shape[2], k.shape[2]
    qi = torch.arange(t, device=q.device)[:, None] + (s - t)
    kj = torch.arange(s, device=q.device)[None, :]
    allowed = cq.unsqueeze(-1) == kc.unsqueeze(-2)
    if att.causal:
        allowed = allowed & (kj <= qi)
    if max_cache is not None:
        allowed = allowed & (qi - kj <= max_cache)
    allowed = allowed | (kj == qi)
    if not att.position.modifies_scores:  # fused kernel: masking, softmax and its backward in one op
        p = att.attn_dropout.p if att.training else 0.0
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=allowed, dropout_p=p, scale=att.position.scale
        )
    probs = _masked_softmax(per_head_logits(att, q, k, q_pos, k_pos, heads), allowed)
    probs = att.attn_dropout(probs) if att.training else probs
    out = torch.matmul(probs, v)
    extra = per_head_value_term(att, probs, q_pos, k_pos, heads)
    return out if extra is None else out + extra


def _slots(cluster: Tensor, count: Tensor, length: int, width: int) -> tuple[Tensor, Tensor]:
    """Token index (B, h, k, width) of each cluster's slots (sorted by index) and slot validity.

    cluster (B, h, length) ids; count (B, h, k) tokens per cluster."""
    b, h, n_clusters = count.shape
    order = torch.argsort(cluster * length + torch.arange(length, device=cluster.device), dim=-1)
    start = count.cumsum(-1) - count
    slot = torch.arange(width, device=cluster.device)
    ok = slot < count.unsqueeze(-1)
    where = (start.unsqueeze(-1) + slot).clamp_max(length - 1)
    return order.gather(2, where.flatten(2)).view(b, h, n_clusters, width), ok


def _blocked_clusters(
    att: Attention,
    ops: _Operands,
    slots: tuple[Tensor, Tensor, Tensor, Tensor],
    heads: list[int],
    max_cache: int | None,
    path: str,
) -> Tensor:
    """The cluster rule on per-cluster padded blocks; slots = (tok_q, ok_q, tok_k, ok_k) from :func:`_slots`."""
    q, k, v, q_pos, k_pos, cq, kc = ops
    tok_q, ok_q, tok_k, ok_k = slots
    t, off, mk = q.shape[2], k.shape[2] - q.shape[2], tok_k.shape[-1]
    qb, kb, vb = _gather_rows(q, tok_q), _gather_rows(k, tok_k), _gather_rows(v, tok_k)
    qpos_b, kpos_b = _gather_pos(q_pos, tok_q), _gather_pos(k_pos, tok_k)
    # The own key as an extra column, unless it is already in the cluster's block (then it would count twice);
    # padded slots see only it, so no row is empty.
    own_in_block = (kc[:, :, off:] == cq).gather(2, tok_q.flatten(2)).view_as(tok_q)
    own_ok = ~own_in_block | ~ok_q
    k_own, v_own = _gather_rows(k[:, :, off:], tok_q), _gather_rows(v[:, :, off:], tok_q)
    if path != "dense" and _dense.prefer_fused(t) and not att.position.modifies_scores:
        out = _fused_blocks(att, qb, kb, vb, k_own, v_own, tok_q + off, ok_q, tok_k, ok_k, own_ok, max_cache)
        return _unblock(out, tok_q, ok_q, t)
    iq, ik = (tok_q + off).unsqueeze(-1), tok_k.unsqueeze(-2)
    allowed = ok_q.unsqueeze(-1) & ok_k.unsqueeze(-2)
    if att.causal:
        allowed = allowed & (ik <= iq)
    if max_cache is not None:
        allowed = allowed & (iq - ik <= max_cache)
    logits = per_head_logits(att, qb, kb, qpos_b, kpos_b, heads)  # (B, h, k, mq, mk)
    own_pos = qpos_b.unsqueeze(-1)
    own_logit = per_head_logits(att, qb.unsqueeze(-2), k_own.unsqueeze(-2), own_pos, own_pos, heads)
    probs = _masked_softmax(
        torch.cat([logits, own_logit.squeeze(-1)], dim=-1),
        torch.cat([allowed, own_ok.unsqueeze(-1)], dim=-1),
    )
    probs = att.attn_dropout(probs) if att.training else probs
    p_blk, p_own = probs[..., :mk], probs[..., mk:]
    out = torch.matmul(p_blk, vb) + p_own * v_own
    extra = per_head_value_term(att, p_blk, qpos_b, kpos_b, heads)
    if extra is not None:
        own_extra = per_head_value_term(att, p_own.unsqueeze(-2), own_pos, own_pos, heads)
        out = out + extra + (own_extra.squeeze(-2) if own_extra is not None else 0.0)
    return _unblock(out, tok_q, ok_q, t)


def _unblock(out: Tensor, tok_q: Tensor, ok_q: Tensor, t: int) -> Tensor:
    """(B, h, k, mq, D) cluster slots -> (B, h, T, D): every query sits in exactly one slot; padded slots go to
    a dropped extra row."""
    b, h, d = out.shape[0], out.shape[1], out.shape[-1]
    target = torch.where(ok_q, tok_q, torch.full_like(tok_q, t)).reshape(b, h, -1)
    full = out.new_zeros(b, h, t + 1, d).scatter(
        2, target.unsqueeze(-1).expand(b, h, target.shape[-1], d), out.reshape(b, h, -1, d)
    )
    return full[:, :, :t]


def _fused_blocks(
    att: Attention,
    qb: Tensor,
    kb: Tensor,
    vb: Tensor,
    k_own: Tensor,
    v_own: Tensor,
    iq: Tensor,
    ok_q: Tensor,
    tok_k: Tensor,
    ok_k: Tensor,
    own_ok: Tensor,
    max_cache: int | None,
) -> Tensor:
    """The cluster blocks through the fused kernel (long calls): chunks of C query slots, each one SDPA call over
    the cluster's keys up to the chunk's last query (causal: slots are sorted by index, so a prefix) and the
    chunk's own keys (diagonal), with an additive mask. Same key sets as the explicit blocked path.

    qb (B, h, k, mq, D); kb, vb (B, h, k, mk, D); k_own, v_own (B, h, k, mq, D); iq (B, h, k, mq) key index of
    each query slot; tok_k (B, h, k, mk) key index of each key slot; ok_* slot validity. Returns (B, h, k, mq, D).
    """
    b, h, n, mq, d = qb.shape
    mk = kb.shape[3]
    zero = torch.zeros((), dtype=qb.dtype, device=qb.device)
    neg = torch.full((), float("-inf"), dtype=qb.dtype, device=qb.device)
    p = att.attn_dropout.p if att.training else 0.0
    outs = []
    big = torch.iinfo(tok_k.dtype).max
    key_at = torch.where(ok_k, tok_k, torch.full_like(tok_k, big))  # padded key slots: never visible
    query_at = torch.where(ok_q, iq, torch.full_like(iq, -1))  # padded query slots: only their own key
    if not att.causal:
        query_at = torch.where(ok_q, torch.full_like(iq, big - 1), query_at)
    for a in range(0, mq, _dense.FUSED_CHUNK):
        z = min(mq, a + _dense.FUSED_CHUNK)
        iq_c = query_at[..., a:z]
        nv = mk
        if att.causal:  # key slots are sorted by index: keys after the chunk's last query form a suffix
            nv = max(1, int((key_at <= iq_c.amax(-1, keepdim=True)).sum(-1).max()))
        ik = key_at[..., :nv].unsqueeze(-2)
        allow = ik <= iq_c.unsqueeze(-1)
        if max_cache is not None:
            allow = allow & (iq[..., a:z].unsqueeze(-1) - tok_k[..., :nv].unsqueeze(-2) <= max_cache)
        diag = torch.eye(z - a, dtype=torch.bool, device=qb.device) & own_ok[..., a:z].unsqueeze(-1)
        mask = torch.where(torch.cat([allow, diag], dim=-1), zero, neg)
        keys = torch.cat([kb[..., :nv, :], k_own[..., a:z, :]], dim=-2)
        vals = torch.cat([vb[..., :nv, :], v_own[..., a:z, :]], dim=-2)
        width = nv + z - a
        out = F.scaled_dot_product_attention(  # 4-D keeps the CPU flash kernel
            qb[..., a:z, :].reshape(b, h * n, z - a, d),
            keys.reshape(b, h * n, width, d),
            vals.reshape(b, h * n, width, d),
            attn_mask=mask.reshape(b, h * n, z - a, width),
            dropout_p=p,
            scale=att.position.scale,
        )
        outs.append(out.view(b, h, n, z - a, d))
    return torch.cat(outs, dim=3)


def band_attention(
    att: Attention,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_pos: Tensor,
    k_pos: Tensor,
    k_valid: Tensor,
    window: int,
    heads: list[int],
    max_cache: int | None = None,
) -> Tensor:
    """Sliding window: query i sees keys j with 0 <= i - j <= window (bidirectional |i - j| <= window), always
    itself. Queries in blocks of m, keys unfolded per block: O(T·(m + 2w)). Shapes as in the module docstring."""
    b, h, t, d = q.shape
    s = k.shape[2]
    off = s - t
    m = max(1, min(window, t))
    nblk = math.ceil(t / m)
    back, fwd = window, (0 if att.causal else window)
    span = m + back + fwd
    right = nblk * m - t + fwd
    kw = F.pad(k, (0, 0, back, right))[:, :, off:].unfold(2, span, m).transpose(-1, -2)  # (B, h, n, span, D)
    vw = F.pad(v, (0, 0, back, right))[:, :, off:].unfold(2, span, m).transpose(-1, -2)
    start = torch.arange(nblk, device=q.device) * m + off - back
    kj = start[:, None] + torch.arange(span, device=q.device)  # (n, span) key index
    inside = (kj >= 0) & (kj < s)
    kjc = kj.clamp(0, s - 1)
    kvalid_w = k_valid[:, kjc] & inside  # (B, n, span)
    kpos_w = k_pos[:, kjc]
    qpad = nblk * m - t
    qb = F.pad(q, (0, 0, 0, qpad)).view(b, h, nblk, m, d)
    qpos_b = torch.cat([q_pos, q_pos[:, -1:].expand(b, qpad)], dim=1).view(b, nblk, m)
    qi = (torch.arange(nblk * m, device=q.device) + off).view(nblk, m)
    delta = qi.unsqueeze(-1) - kj.unsqueeze(-2)  # (n, m, span)
    near = (delta >= 0) & (delta <= window) if att.causal else delta.abs() <= window
    if max_cache is not None:
        near = near & (delta <= max_cache)
    allowed = (kvalid_w.unsqueeze(-2) & near) | (delta == 0)  # (B, n, m, span)
    logits = per_head_logits(att, qb, kw, qpos_b, kpos_w, heads)
    probs = _masked_softmax(logits, allowed.unsqueeze(1))
    probs = att.attn_dropout(probs) if att.training else probs
    out = torch.matmul(probs, vw)
    extra = per_head_value_term(att, probs, qpos_b, kpos_w, heads)
    if extra is not None:
        out = out + extra
    return out.reshape(b, h, nblk * m, d)[:, :, :t]
