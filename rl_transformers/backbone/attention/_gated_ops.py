"""Chunked operators of the recurrent matrix-state mixers (``retnet``, ``gla``, ``mamba2``, ``mlstm``,
``deltanet``, ``gated_deltanet``), with restarts inside a window.

Shapes: q, k (..., T, K), v (..., T, V), a state S (..., K, V) read as out_t = q_t^T S_t. Decays are given as
log-decays ``log_a`` (..., T, K) (a diagonal decay on the key dimension, GLA) or (..., T, 1) (a scalar per head).
``segment`` (..., T) long (broadcastable to q's leading dimensions), or None: the stream segment of each token
(``ForwardContext.segment``): a token whose segment differs from the one before it restarts the recurrence (the
state before it is the empty state), and the carried state S0 belongs to segment 0.

- :func:`gated_chunked`: S_t = diag(a_t) S_{t-1} + k_t v_t^T (Yang et al. 2023, arXiv 2312.06635, eq. 2).
  Inside a chunk of C tokens with cumulative log-decays L_i = Σ_{l≤i} log a_l (from the chunk start):
  out_i = [carried_i] (q_i ⊙ e^{L_i})^T S_prev + Σ_{j≤i, same segment} (Σ_d q_id k_jd e^{L_id - L_jd}) v_j,
  S_next = [kept] e^{L_C} ⊙ S_prev + Σ_{j in the last segment} (k_j ⊙ e^{L_C - L_j}) v_j^T.
  Only non-positive exponents are formed (masked pairs are set to -inf before exp), so nothing overflows; the
  key-dimension decay forms a (C, C, K) tensor per chunk, memory O(T·C·K) (the scalar decay: O(T·C)).
- :func:`delta_chunked`: the (gated) delta rule S_t = a_t (I - β_t k_t k_t^T) S_{t-1} + β_t k_t v_t^T
  (Schlag et al. 2021, arXiv 2102.11174; Yang et al. 2024, arXiv 2412.06464). Rewritten as
  S_t = a_t S_{t-1} + k_t u_t^T with u_t = β_t (v_t - a_t S_{t-1}^T k_t); inside a chunk the u solve the unit
  lower-triangular system (I + A) U = β ⊙ (V - [carried] e^{L} ⊙ K S_prev), A_ij = β_i e^{L_i - L_j} k_i·k_j for
  j < i in the same segment (the UT form of the WY representation, Yang et al. 2024, arXiv 2406.06484), then the
  chunk is a gated linear-attention chunk with values U.
- :func:`mlstm_chunked`: xLSTM's matrix memory (Beck et al. 2024, arXiv 2405.04517) C_t = f_t C_{t-1} +
  i_t k_t v_t^T, n_t = f_t n_{t-1} + i_t k_t, h_t = C_t^T q_t / max(|n_t·q_t|, 1), with i_t = exp(ĩ_t) and
  stabiliser m: the state holds C̃ = e^{-m} C, ñ = e^{-m} n. The output does not depend on m (h = C̃^T q /
  max(|ñ·q|, e^{-m})), so each query takes m_i = the largest log-weight it sums (and 0 where it has no carried
  state), m is detached, and different chunkings agree up to rounding.

Resets are masks, not -inf decays: inside a chunk the pair (i, j) needs the same segment, a query reads the
carried state only while it is in the segment of the token before the chunk, and the state at the chunk end
keeps only the last segment's keys (and the carried state when that segment is the carried one).
"""

from __future__ import annotations

import torch
from torch import Tensor

Masks = tuple[Tensor, Tensor | None, Tensor | None, Tensor | None]


def _masks(
    seg: Tensor | None, prev: Tensor | None, c: int, device: torch.device, strict: bool = False
) -> Masks:
    """(pairs (..., C, C) or (C, C) bool, carried (..., C, 1) or None, tail (..., C, 1) or None, kept (..., 1, 1)
    or None) for one chunk; None where every entry is True (no restart)."""
    lower = torch.ones(c, c, dtype=torch.bool, device=device).tril(-1 if strict else 0)
    if seg is None or prev is None:
        return lower, None, None, None
    pairs = lower & (seg[..., :, None] == seg[..., None, :])
    carried = (seg == prev)[..., None]
    tail = (seg == seg[..., -1:])[..., None]
    return pairs, carried, tail, carried[..., -1:, :]


def _cumulative(log_a: Tensor, pairs: Tensor, restarts: bool) -> Tensor:
    """L_i = Σ log a_l over the tokens l ≤ i of the chunk in i's segment (..., C, K'). With restarts, a masked
    product rather than a cumulative sum: a token of an earlier segment then gets an exactly zero gradient (a
    difference of cumulative sums would leave rounding residue)."""
    if not restarts:
        return log_a.cumsum(-2)
    return pairs.to(log_a.dtype) @ log_a


def _scores(q: Tensor, k: Tensor, cum: Tensor, pairs: Tensor) -> Tensor:
    """(..., C, C): Σ_d q_id k_jd e^{L_id - L_jd} where ``pairs``, else 0. cum (..., C, K) or (..., C, 1)."""
    diff = cum[..., :, None, :] - cum[..., None, :, :]
    decay = torch.exp(diff.masked_fill(~pairs[..., None], float("-inf")))
    if cum.shape[-1] == 1:
        return (q @ k.transpose(-1, -2)) * decay[..., 0]
    return torch.einsum("...id,...jd,...ijd->...ij", q, k, decay)


def _gated_step(
    q: Tensor, k: Tensor, v: Tensor, cum: Tensor, s: Tensor, masks: Masks
) -> tuple[Tensor, Tensor]:
    """One chunk of the gated recurrence: (out (..., C, V), state after the chunk (..., K, V))."""
    pairs, carried, tail, kept = masks
    inter = (q * cum.exp()) @ s
    if carried is not None:
        inter = torch.where(carried, inter, 0.0)
    out = inter + _scores(q, k, cum, pairs) @ v
    k_end = k * torch.exp(cum[..., -1:, :] - cum)
    if tail is not None:
        k_end = torch.where(tail, k_end, 0.0)
    s_prev = cum[..., -1, :, None].exp() * s
    if kept is not None:
        s_prev = torch.where(kept, s_prev, 0.0)
    return out, s_prev + k_end.transpose(-1, -2) @ v


def _chunks(t: int, chunk: int) -> list[slice]:
    return [slice(a, min(a + chunk, t)) for a in range(0, t, max(1, chunk))]


def _prev(seg: Tensor | None, sl: slice) -> Tensor | None:
    """Segment of the token before the chunk (0 before the first one)."""
    if seg is None:
        return None
    return seg[..., sl.start - 1 : sl.start] if sl.start > 0 else torch.zeros_like(seg[..., :1])


def gated_chunked(
    q: Tensor, k: Tensor, v: Tensor, log_a: Tensor, s0: Tensor, chunk: int, segment: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """S_t = diag(a_t) S_{t-1} + k_t v_t^T, out_t = q_t^T S_t, chunk by chunk: (out (..., T, V), S_T)."""
    if q.shape[-2] == 1 and segment is None:  # one acting step: the recurrence itself
        s = log_a[..., 0, :, None].exp() * s0 + k[..., 0, :, None] * v[..., 0, None, :]
        return q @ s, s
    s, outs = s0, []
    for sl in _chunks(q.shape[-2], chunk):
        seg = None if segment is None else segment[..., sl]
        masks = _masks(seg, _prev(segment, sl), sl.stop - sl.start, q.device)
        cum = _cumulative(log_a[..., sl, :], masks[0], seg is not None)
        out, s = _gated_step(q[..., sl, :], k[..., sl, :], v[..., sl, :], cum, s, masks)
        outs.append(out)
    return torch.cat(outs, dim=-2), s


def delta_chunked(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    log_a: Tensor | None,
    s0: Tensor,
    chunk: int,
    segment: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """S_t = a_t (I - β_t k_t k_t^T) S_{t-1} + β_t k_t v_t^T, out_t = q_t^T S_t: (out (..., T, V), S_T).

    beta (..., T, 1); log_a (..., T, 1) or None (a_t = 1, plain DeltaNet).
    """
    if q.shape[-2] == 1 and segment is None:  # one acting step: the recurrence itself
        s = s0 if log_a is None else log_a[..., 0, :, None].exp() * s0
        u = beta[..., 0, :, None] * (v - k @ s)  # (..., 1, V): β (v - a S^T k)
        s = s + k.transpose(-1, -2) @ u
        return q @ s, s
    s, outs = s0, []
    for sl in _chunks(q.shape[-2], chunk):
        qc, kc, vc, bc = q[..., sl, :], k[..., sl, :], v[..., sl, :], beta[..., sl, :]
        c = sl.stop - sl.start
        seg, prev = (None, None) if segment is None else (segment[..., sl], _prev(segment, sl))
        masks = _masks(seg, prev, c, q.device)
        cum = (
            torch.zeros_like(bc)
            if log_a is None
            else _cumulative(log_a[..., sl, :], masks[0], seg is not None)
        )
        strict = _masks(seg, prev, c, q.device, strict=True)[0]
        seen = (kc * cum.exp()) @ s  # e^{L_i} k_i^T S_prev
        if masks[1] is not None:
            seen = torch.where(masks[1], seen, 0.0)
        a = bc * _scores(kc, kc, cum, strict)
        u = torch.linalg.solve_triangular(a, bc * (vc - seen), upper=False, unitriangular=True)
        out, s = _gated_step(qc, kc, u, cum, s, masks)
        outs.append(out)
    return torch.cat(outs, dim=-2), s


def _stabilised(logw: Tensor, base: Tensor) -> Tensor:
    """Row maximum of the log-weights ``logw`` (..., R, C) and ``base`` (..., R), detached."""
    return torch.maximum(logw.amax(-1), base).detach()


def mlstm_chunked(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    log_f: Tensor,
    log_i: Tensor,
    state: tuple[Tensor, Tensor, Tensor],
    chunk: int,
    segment: Tensor | None = None,
) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor]]:
    """xLSTM mLSTM cell: h (..., T, V) and the state (C̃ (..., K, V), ñ (..., K), m (...)).

    log_f, log_i (..., T): log forget gate (log σ(f̃) or f̃) and log input gate ĩ (-inf: no input).
    """
    c_s, n_s, m_s = state
    if q.shape[-2] == 1 and segment is None:  # one acting step: eqs. 15-17 of the paper
        lf, li = log_f[..., 0], log_i[..., 0]
        m = torch.maximum(lf + m_s, li).detach()
        f, i = torch.exp(lf + m_s - m), torch.exp(li - m)
        c = f[..., None, None] * c_s + i[..., None, None] * k.transpose(-1, -2) @ v
        n = f[..., None] * n_s + i[..., None] * k[..., 0, :]
        den = torch.maximum((q[..., 0, :] * n).sum(-1).abs(), torch.exp(-m))
        return (q @ c) / den[..., None, None], (c, n, m)
    s = torch.cat([c_s, n_s[..., None]], dim=-1)  # the normaliser rides as an extra value column
    v1 = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)
    d = v.shape[-1]
    m, outs = m_s, []
    for sl in _chunks(q.shape[-2], chunk):
        qc, kc, vc, ic = q[..., sl, :], k[..., sl, :], v1[..., sl, :], log_i[..., sl]
        seg, prev = (None, None) if segment is None else (segment[..., sl], _prev(segment, sl))
        pairs, carried, tail, kept = _masks(seg, prev, sl.stop - sl.start, q.device)
        cum = _cumulative(log_f[..., sl, None], pairs, seg is not None)[..., 0]
        logw = (cum[..., :, None] - cum[..., None, :] + ic[..., None, :]).masked_fill(~pairs, float("-inf"))
        base = cum + m[..., None]  # log-weight of the carried state
        if carried is not None:
            base = torch.where(carried[..., 0], base, 0.0)
        m_q = _stabilised(logw, base)
        w = torch.exp(logw - m_q[..., None]) * (qc @ kc.transpose(-1, -2))
        inter = torch.exp(base - m_q)[..., None] * (qc @ s)
        if carried is not None:
            inter = torch.where(carried, inter, 0.0)
        out = inter + w @ vc
        floor = torch.exp(-m_q)[..., None]
        outs.append(out[..., :d] / torch.maximum(out[..., d:].abs(), floor))
        # state at the chunk end, stabilised by its own maximum
        tail_w = cum[..., -1:] - cum + ic
        if tail is not None:
            tail_w = tail_w.masked_fill(~tail[..., 0], float("-inf"))
        base_end = base[..., -1] if kept is None else torch.where(kept[..., 0, 0], cum[..., -1] + m, 0.0)
        m_end = _stabilised(tail_w[..., None, :], base_end[..., None])[..., 0]
        carry_end = cum[..., -1] + m - m_end  # <= 0 where kept; masked before exp (no inf * 0 in backward)
        if kept is not None:
            carry_end = carry_end.masked_fill(~kept[..., 0, 0], float("-inf"))
        s_prev = torch.exp(carry_end)[..., None, None] * s
        k_end = kc * torch.exp(tail_w - m_end[..., None])[..., None]
        s, m = s_prev + k_end.transpose(-1, -2) @ vc, m_end
    return torch.cat(outs, dim=-2), (s[..., :d], s[..., d], m)
