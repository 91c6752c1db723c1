"""Exact dense and fused-kernel forms of the sparse patterns (``_banded`` holds the blocked form).

The blocked parts of ``_banded`` keep memory O(T·K) but pay a fixed cost per part (gathers, masks, a
hand-written softmax); two other exact forms of the same patterns are faster where they apply:

- :func:`dense_pattern` - few keys in all (RL streaming steps and training windows): one T x S mask, one
  fused SDPA call (:func:`prefer_dense` decides);
- :func:`prefix_columns_attention` - long causal calls whose pattern is "columns every later block sees + a
  pattern inside the blocks" (fixed's summary columns): query chunks, each one SDPA call over the columns
  before it and its own block keys with an additive float mask (:func:`prefer_fused` decides);
- :func:`residue_classes_attention` - long causal "same residue class ∪ band" (strided): chunk u of every
  class batched into one SDPA call over the class prefix and the band keys.

``memory_compressed`` and ``routing`` use the same chunked-SDPA idea on their own blocks (``FUSED_*``). On CPU
(torch 2.13, 1 thread) SDPA was fastest with 4-D inputs and an additive float mask - a boolean mask of the same
shape measured ~2x slower, a 5-D call ~1.3x - hence the float masks and the merged head dimensions.

Every form computes the softmax over the same key sets (padding, causality by position, the always-attended
own key), so they agree to rounding; the tests run every pattern on all of them (``DENSE_PATH``,
``FUSED_MIN_LEN``, ``FUSED_CHUNK``). Shapes as in ``_banded``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from rl_transformers.backbone.attention._banded import Allow, band_part
from rl_transformers.backbone.attention._residue_flash import ResidueCausal, residue_fast_form
from rl_transformers.backbone.attention.base import dense_attention

DENSE_MAX_KEYS = 256
"""Patterns over at most this many keys run as one dense masked softmax (see :func:`prefer_dense`)."""
DENSE_PATH = "auto"
""""auto" (by :func:`prefer_dense`), "always" or "never": tests set it to check both exact forms."""


def prefer_dense(s: int, keys_per_query: int) -> bool:
    """Whether the T x S dense form is the cheaper exact form: few keys in all (streaming steps, RL training
    windows), or a sparse key set that is not much smaller than S (the blocked parts' fixed cost dominates)."""
    if DENSE_PATH != "auto":
        return DENSE_PATH == "always"
    return s <= max(DENSE_MAX_KEYS, 2 * keys_per_query)


def dense_pattern(
    att: Any,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_pos: Tensor,
    k_pos: Tensor,
    k_valid: Tensor,
    allow: Allow | None,
    ctx: Any = None,
    key: tuple[Any, ...] | None = None,
    window: int | None = None,
    aligned: bool | None = None,
) -> Tensor:
    """The whole pattern as one masked softmax of the T queries over all S keys: (B, H, T, D).

    ``allow`` is called on one block holding every query and key, q_pos (B, 1, 1, T, 1) and k_pos
    (B, 1, 1, 1, S); padding, causality (by position) and the always-attended own key are added as in
    :func:`gathered_part`, so this equals the merged parts of the blocked form (softmax over the union).
    Plain position schemes use the fused SDPA kernel. Time and memory O(T·S) per head.

    With ``ctx`` (the forward's context) and ``key`` (everything besides the positions that the pattern
    depends on, e.g. the attention's name, options and layer parity), the mask is built once per forward and
    reused by every layer that sees the same ``q_pos`` / ``k_pos`` / ``k_valid`` tensors (by identity).
    ``window``: see :func:`pattern_mask`. ``aligned`` (default: ``ctx.aligned``, False without ``ctx``): the
    positions are column-aligned (``ForwardContext.aligned``).
    """
    if ctx is None or key is None:
        mask = pattern_mask(q_pos, k_pos, k_valid, allow, att.causal, window)
    else:
        masks = ctx.extras.setdefault("_pattern_masks", {})
        key = (*key, window)
        cached = masks.get(key)
        if cached is not None and cached[0] is q_pos and cached[1] is k_pos and cached[2] is k_valid:
            mask = cached[3]
        else:
            mask = pattern_mask(q_pos, k_pos, k_valid, allow, att.causal, window)
            masks[key] = (q_pos, k_pos, k_valid, mask)
    dropout = att.attn_dropout if att.training and att.attn_dropout.p > 0 else None
    if not att.position.modifies_scores:
        p = dropout.p if dropout is not None else 0.0
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, scale=att.position.scale)
    if aligned is None:
        aligned = ctx is not None and bool(ctx.aligned)
    out, _ = dense_attention(q, k, v, mask, att.position, q_pos, k_pos, att.layer, dropout, aligned)
    return out


def pattern_mask(
    q_pos: Tensor,
    k_pos: Tensor,
    k_valid: Tensor,
    allow: Allow | None,
    causal: bool,
    window: int | None = None,
) -> Tensor:
    """(B, H|1, T, S) bool: ``allow`` + padding + causality (by position) + the always-attended own key.

    ``window`` (the attention's ``max_cache``): only keys at most ``window`` columns before the query (both
    sides when not causal), counted by index as the KV cache is trimmed, so a bounded streaming cache and a
    one-pass training window see the same keys (the convention of ``full``'s ``max_cache``).
    """
    t, s = q_pos.shape[1], k_pos.shape[1]
    qp = q_pos[:, None, None, :, None]
    kp = k_pos[:, None, None, None, :]
    mask = k_valid[:, None, None, None, :]
    if allow is not None:
        mask = mask & allow(qp, kp)
    if causal:
        mask = mask & (kp <= qp)
    qi = torch.arange(t, device=k_pos.device)[:, None] + (s - t)
    kj = torch.arange(s, device=k_pos.device)
    if window is not None and window < s - 1:
        mask = mask & ((qi - kj).abs() <= window)
    return (mask | (kj == qi)).squeeze(2)


def windowed_pattern(
    att: Any,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_pos: Tensor,
    k_pos: Tensor,
    k_valid: Tensor,
    allow: Allow,
    window: int,
    ctx: Any = None,
    key: tuple[Any, ...] | None = None,
) -> Tensor:
    """A pattern bounded by ``max_cache = window``: ``allow`` over the keys at most ``window`` columns back.

    Few keys: the dense form with the window in its mask (by index, as the cache is trimmed); else one band of
    ``window`` keys (both sides when not causal) under ``allow`` and the same window by position - equal to the
    index window wherever a row's positions are consecutive; O(T·window) per head, whatever the pattern
    reached beyond the window.
    """
    if prefer_dense(k.shape[2], 2 * window + 1):
        return dense_pattern(att, q, k, v, q_pos, k_pos, k_valid, allow, ctx, key, window)

    def near(qp: Tensor, kp: Tensor) -> Tensor:  # the band gathers whole blocks: the window is kept here
        return allow(qp, kp) & ((qp - kp).abs() <= window)

    span = [(-window, 0 if att.causal else window)]
    return band_part(att, q, k, v, q_pos, k_pos, k_valid, span, near).out


FUSED_MIN_LEN = 1024
"""Calls of at least this many queries take the chunked fused-kernel forms (tests lower it)."""
FUSED_CHUNK = 512
"""Queries per chunk of the fused forms."""


def prefer_fused(t: int) -> bool:
    """Long calls run the chunked fused-kernel forms (:func:`prefix_columns_attention`)."""
    return DENSE_PATH != "always" and t >= FUSED_MIN_LEN


def shared_positions(k_pos: Tensor) -> bool:
    """Every row holds the same consecutive positions (no reset inside the call): key index = position - p0."""
    p = k_pos[0]
    return bool(torch.equal(k_pos, p.expand_as(k_pos))) and bool((p[1:] - p[:-1] == 1).all())


def prefix_columns_attention(
    att: Any,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_pos: Tensor,
    k_pos: Tensor,
    k_valid: Tensor,
    columns: Tensor,
    column_heads: Tensor,
    align: int,
    allow: Allow,
) -> Tensor:
    """Causal pattern = columns every later block sees + a pattern inside the blocks, with a fused kernel.

    For T == S and positions shared by all rows (:func:`shared_positions`). ``columns`` (G,) sorted key indices
    that every query of a later ``align``-block of positions attends in the heads ``column_heads`` (1, H|1, 1, 1)
    (e.g. fixed's summary columns). Queries run in chunks [a, a + C): their keys are the columns before a0 (a
    rounded down to its block start; an additive mask of zeros, or -inf in other heads / for padding) followed
    by the keys a0 .. a + C - 1 under ``allow`` + causality + self (as in :func:`dense_pattern`). Each chunk is
    one SDPA call with a float mask, so the work is O(T·(G + C)) per head with no T x S mask.
    """
    t, chunk = q.shape[2], FUSED_CHUNK
    p0 = int(k_pos[0, 0])
    outs = []
    neg = torch.tensor(float("-inf"), dtype=q.dtype, device=q.device)
    zero = torch.zeros((), dtype=q.dtype, device=q.device)
    for a in range(0, t, chunk):
        z = min(t, a + chunk)
        a0 = max(0, a - (p0 + a) % align)
        n_col = int(torch.searchsorted(columns, torch.tensor(a0, device=columns.device)))
        col = columns[:n_col]
        keys = torch.cat([k.index_select(2, col), k[:, :, a0:z]], dim=2)
        vals = torch.cat([v.index_select(2, col), v[:, :, a0:z]], dim=2)
        col_ok = column_heads & k_valid.index_select(1, col)[:, None, None, :]  # (B, H|1, 1, G_a)
        qp = q_pos[:, None, None, a:z, None]
        kp = k_pos[:, None, None, None, a0:z]
        inner = k_valid[:, None, None, None, a0:z] & allow(qp, kp) & (kp <= qp)
        own = torch.arange(a0, z, device=q.device) == torch.arange(a, z, device=q.device)[:, None]
        inner = (inner | own).squeeze(2)  # (B, H|1, C, z - a0)
        hb = max(col_ok.shape[1], inner.shape[1])
        mask = torch.cat(
            [
                torch.where(col_ok, zero, neg).expand(q.shape[0], hb, z - a, n_col),
                torch.where(inner, zero, neg).expand(q.shape[0], hb, z - a, z - a0),
            ],
            dim=-1,
        )
        p = att.attn_dropout.p if att.training else 0.0
        outs.append(
            F.scaled_dot_product_attention(
                q[:, :, a:z], keys, vals, attn_mask=mask, dropout_p=p, scale=att.position.scale
            )
        )
    return torch.cat(outs, dim=2)


RESIDUE_CHUNK = 64
"""Queries of one residue class per chunk in :func:`residue_classes_attention` (each sees ~chunk·stride band keys)."""
RESIDUE_BAND = 512
"""Bound on chunk·stride, the band keys a chunk's queries gather."""


def _residue_chunk(
    members: list[Tensor], u0: int, chunk: int, n_before: int, stride: int
) -> tuple[Tensor, Tensor]:
    """Query and key positions of chunk ``u0`` of every residue class (``members``: each class's positions):
    (N, C) queries and (N, K) keys (the class's first ``n_before`` members, then the band from ``stride`` before
    the chunk to its end), -1 where a shorter class has none."""
    q_rows, k_rows = [], []
    for m in members:
        qi = m[u0 : u0 + chunk]
        if qi.numel() == 0:
            continue
        q_rows.append(qi)
        band = torch.arange(max(0, int(qi[0]) - stride), int(qi[-1]) + 1, device=m.device)
        k_rows.append(torch.cat([m[:n_before], band]))
    n_q, n_k = max(len(r) for r in q_rows), max(len(r) for r in k_rows)
    qidx = torch.stack([F.pad(r, (0, n_q - len(r)), value=-1) for r in q_rows])
    kidx = torch.stack([F.pad(r, (0, n_k - len(r)), value=-1) for r in k_rows])
    return qidx, kidx


def _residue_chunk_mask(
    qidx: Tensor,
    kidx: Tensor,
    n_before: int,
    k_valid: Tensor,
    q_pos: Tensor,
    k_pos: Tensor,
    class_heads: Tensor,
    allow: Allow,
) -> Tensor:
    """Boolean mask (B, H|1, classes, C, keys; True: attend) of one chunk of :func:`residue_classes_attention`: the
    ``n_before`` class members before the band (valid keys, in ``class_heads``), then the band keys under
    ``allow``, causality and validity, each query always seeing itself; padded indices (-1) are masked."""
    b = k_valid.shape[0]
    n, n_q = qidx.shape
    n_k = kidx.shape[1]
    valid = (
        k_valid.index_select(1, kidx.clamp_min(0).flatten()).view(b, 1, n, 1, n_k)
        & (kidx >= 0)[None, None, :, None, :]
    )
    band = kidx[:, n_before:]
    qp = q_pos.index_select(1, qidx.clamp_min(0).flatten()).view(b, 1, n, n_q, 1)
    kp = k_pos.index_select(1, band.clamp_min(0).flatten()).view(b, 1, n, 1, n_k - n_before)
    ok_band = (valid[..., n_before:] & allow(qp, kp) & (kp <= qp)) | (band[:, None, :] == qidx[:, :, None])
    ok_before = (class_heads[..., None] & valid[..., :n_before]).expand(-1, -1, -1, n_q, -1)
    hb = max(ok_band.shape[1], ok_before.shape[1])
    return torch.cat(
        [ok_before.expand(b, hb, n, n_q, n_before), ok_band.expand(b, hb, n, n_q, n_k - n_before)], dim=-1
    )


def residue_classes_attention(
    att: Any,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_pos: Tensor,
    k_pos: Tensor,
    k_valid: Tensor,
    stride: int,
    class_heads: Tensor,
    allow: Allow,
    band_heads: Tensor | None = None,
) -> Tensor:
    """Causal pattern inside "same residue class ((i - j) mod stride == 0) ∪ a band of ``stride`` keys" under
    ``allow`` (strided's A(1) ∪ A(2)), with a fused kernel.

    For T == S and positions shared by all rows (:func:`shared_positions`). Chunk u of every residue class
    (C class members, positions p .. p + (C - 1)·stride) sees the class members before p - stride (in the heads
    ``class_heads`` (1, H|1, 1, 1), where ``allow`` must hold for them) and every
    key at positions p - stride .. p + (C - 1)·stride; the ``stride`` classes' chunk u are gathered into one
    batch (keys padded to the longest set, padding masked) and run as one SDPA call with an additive mask
    from ``allow`` + padding + causality + self. O(T·(T/stride + C·stride)) per head; no T x S mask.

    With ``band_heads`` (1, H|1, 1, 1: the heads of the band A(1)) and when :func:`residue_fast_form` allows it
    (CPU, every key valid, no dropout, all heads alike), the flash form :class:`~rl_transformers.backbone.attention._residue_flash.ResidueCausal` runs instead: the
    classes as one causal SDPA flash call on (B, H·stride, T/stride, D) (no mask), the band-only keys
    i - l + 1 .. i - 1 as small blocked windows, merged exactly by log-sum-exp, with its own backward.
    """
    b, h, t, d = q.shape
    band: bool | Tensor | None = (
        None if band_heads is None else residue_fast_form(att, q, k_valid, class_heads, band_heads)
    )
    if band is not None:  # every key valid, heads alike: the classes as one causal flash call + band windows
        scale = att.position.scale if att.position.scale is not None else d**-0.5
        return ResidueCausal.apply(q, k, v, stride, band, scale)
    dev = q.device
    chunk = max(1, min(RESIDUE_CHUNK, FUSED_CHUNK, RESIDUE_BAND // stride))  # band keys per query <= ~512
    n_classes = min(stride, t)
    members = [torch.arange(j0, t, stride, device=dev) for j0 in range(n_classes)]
    zero = torch.zeros((), dtype=q.dtype, device=dev)
    neg = torch.full((), float("-inf"), dtype=q.dtype, device=dev)
    p = att.attn_dropout.p if att.training else 0.0
    # Class-major copies (B, H, stride, ceil(T / stride), D): class prefixes become slices, not gathers.
    pad = (-t) % stride
    km, vm = (F.pad(x, (0, 0, 0, pad)).view(b, h, -1, stride, d).transpose(2, 3) for x in (k, v))
    km, vm = km[:, :, :n_classes].contiguous(), vm[:, :, :n_classes].contiguous()
    outs, order = [], []
    for u0 in range(0, members[0].numel(), chunk):
        n_before = max(0, u0 - 1)  # class members before the band: the same count in every class
        qidx, kidx = _residue_chunk(members, u0, chunk, n_before, stride)
        n, n_q = qidx.shape
        n_k = kidx.shape[1]
        qs, ks = qidx.clamp_min(0), kidx.clamp_min(0)
        qb = q.index_select(2, qs.flatten()).view(b, h, n, n_q, d)
        band_idx = ks[:, n_before:].flatten()
        kb = torch.cat([km[:, :, :n, :n_before], k.index_select(2, band_idx).view(b, h, n, -1, d)], dim=3)
        vb = torch.cat([vm[:, :, :n, :n_before], v.index_select(2, band_idx).view(b, h, n, -1, d)], dim=3)
        ok = _residue_chunk_mask(qidx, kidx, n_before, k_valid, q_pos, k_pos, class_heads, allow)
        mask = torch.where(ok, zero, neg)
        out = F.scaled_dot_product_attention(  # 4-D (heads x classes merged) keeps the CPU flash kernel
            qb.reshape(b, h * n, n_q, d),
            kb.reshape(b, h * n, n_k, d),
            vb.reshape(b, h * n, n_k, d),
            attn_mask=mask.expand(b, h, n, n_q, n_k).reshape(b, h * n, n_q, n_k),
            dropout_p=p,
            scale=att.position.scale,
        )
        real = (qidx >= 0).flatten()
        outs.append(out.reshape(b, h, n * n_q, d)[:, :, real])
        order.append(qidx.flatten()[real])
    perm = torch.cat(order)
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(t, device=dev)
    return torch.cat(outs, dim=2).index_select(2, inverse)
