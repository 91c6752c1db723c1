"""Causal linear-attention operators shared by ``linear``, ``rfa`` and ``performer``.

With feature maps already applied, q (..., T, F) = φ(Q), k (..., T, F) = φ(K), values v (..., T, E) and a carried
state S0 (..., F, E), the causal product is

    out_i = q_i^T (S0 + Σ_{j≤i} k_j v_j^T),      S_T = S0 + Σ_j k_j v_j^T

(Katharopoulos et al. 2020, arXiv 2006.16236, eqs. 5-6). Callers get the normaliser φ(q_i)·z_i from the same
operator by appending a column of ones to v (and z to S0), so one call yields numerator and denominator.

Three forms compute the same thing and are tested against each other:

- :func:`causal_linear_quadratic` - the "parallel" form: a masked (T, T) score matrix, O(T² F) (reference);
- :class:`CausalLinearFn` / :func:`causal_linear_chunked` - chunks of C tokens: masked quadratic inside a chunk
  plus the state carried between chunks. Only chunk-boundary states (T/C of them) exist transiently; nothing
  per step is stored, and backward recomputes them and applies the cumulative-sum gradients of Katharopoulos
  eqs. 8-10 chunk-wise: ∇q_i = ∇out_i S_i^T, ∇k_i = R_i v_i, ∇v_i = R_i^T k_i with R_i = G + Σ_{j≥i} q_j ∇out_j^T
  (G = gradient of the final state), i.e. a forward prefix sum for queries and a reverse one for keys/values;
- :func:`causal_linear_recurrent` - the RNN form, one step at a time with a constant-size state.

Gated variants (RFA-Gate, Peng et al. 2021, arXiv 2103.02143) decay the state by a scalar g_t per step:
S_t = g_t S_{t-1} + k_t v_t^T, the caller having weighted k_t by (1 - g_t). ``log_g`` (..., T) holds log g_t.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable


def _to_chunks(x: Tensor, chunk: int) -> Tensor:
    """(..., T, F) -> (..., N, C, F), zero-padding T up to a multiple of C."""
    t = x.shape[-2]
    n = -(-t // chunk)
    if n * chunk != t:
        x = F.pad(x, (0, 0, 0, n * chunk - t))
    return x.unflatten(-2, (n, chunk))


def _from_chunks(x: Tensor, t: int) -> Tensor:
    """(..., N, C, F) -> (..., T, F), dropping the padding."""
    return x.flatten(-3, -2)[..., :t, :]


def _exclusive_cumsum(x: Tensor, dim: int) -> Tensor:
    """Σ_{m<n} x_m along ``dim`` (zero for the first entry)."""
    total = torch.cumsum(x, dim)
    n = x.shape[dim]
    return torch.cat([torch.zeros_like(total.narrow(dim, 0, 1)), total.narrow(dim, 0, n - 1)], dim)


def _reverse_exclusive_cumsum(x: Tensor, dim: int) -> Tensor:
    """Σ_{m>n} x_m along ``dim`` (zero for the last entry)."""
    suffix = torch.flip(torch.cumsum(torch.flip(x, [dim]), dim), [dim])
    n = x.shape[dim]
    return torch.cat([suffix.narrow(dim, 1, n - 1), torch.zeros_like(suffix.narrow(dim, 0, 1))], dim)


def _lower(chunk: int, device: torch.device) -> Tensor:
    """(C, C) bool, True where key j <= query i."""
    return torch.ones(chunk, chunk, dtype=torch.bool, device=device).tril()


def _chunk_states(kc: Tensor, vc: Tensor, s0: Tensor) -> tuple[Tensor, Tensor]:
    """Per-chunk sums k^T v (..., N, F, E) and the state before each chunk S0 + Σ_{m<n} (..., N, F, E)."""
    kv = kc.transpose(-1, -2) @ vc
    return kv, s0.unsqueeze(-3) + _exclusive_cumsum(kv, -3)


class CausalLinearFn(torch.autograd.Function):
    """(q, k, v, S0, chunk) -> (out (..., T, E), S_T (..., F, E)) with the memory-efficient causal gradient.

    Saves only its inputs for backward; per-step states S_i (..., T, F, E) are never formed, in forward or in
    backward (chunk-boundary states, T/C of them, are recomputed when needed).
    """

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, s0: Tensor, chunk: int) -> tuple[Tensor, Tensor]:
        t = q.shape[-2]
        qc, kc, vc = _to_chunks(q, chunk), _to_chunks(k, chunk), _to_chunks(v, chunk)
        kv, before = _chunk_states(kc, vc, s0)
        lower = _lower(qc.shape[-2], q.device)
        scores = (qc @ kc.transpose(-1, -2)).masked_fill(~lower, 0.0)
        out = _from_chunks(qc @ before + scores @ vc, t)
        s_end = before[..., -1, :, :] + kv[..., -1, :, :]
        ctx.save_for_backward(q, k, v, s0)
        ctx.chunk = chunk
        return out, s_end

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g_out: Tensor, g_state: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, None]:
        q, k, v, s0 = ctx.saved_tensors
        t, chunk = q.shape[-2], ctx.chunk
        qc, kc, vc, gc = (_to_chunks(x, chunk) for x in (q, k, v, g_out))
        lower = _lower(qc.shape[-2], q.device)
        upper = lower.transpose(0, 1)
        # eq. 8: ∇q_i = ∇out_i S_i^T, S_i = state before the chunk + the chunk's keys up to i.
        _, before = _chunk_states(kc, vc, s0)
        gq = gc @ before.transpose(-1, -2) + (gc @ vc.transpose(-1, -2)).masked_fill(~lower, 0.0) @ kc
        # eqs. 9-10: R_i = G + Σ_{j≥i} q_j ∇out_j^T, a reverse cumulative sum (chunk sums + in-chunk terms).
        qg = qc.transpose(-1, -2) @ gc
        after = g_state.unsqueeze(-3) + _reverse_exclusive_cumsum(qg, -3)
        gk = vc @ after.transpose(-1, -2) + (vc @ gc.transpose(-1, -2)).masked_fill(~upper, 0.0) @ qc
        gv = kc @ after + (kc @ qc.transpose(-1, -2)).masked_fill(~upper, 0.0) @ gc
        gs0 = g_state + qg.sum(-3)
        return _from_chunks(gq, t), _from_chunks(gk, t), _from_chunks(gv, t), gs0, None


def causal_linear_chunked(q: Tensor, k: Tensor, v: Tensor, s0: Tensor, chunk: int) -> tuple[Tensor, Tensor]:
    """Chunked causal product (custom backward); chunks of ``min(chunk, T)`` tokens."""
    return CausalLinearFn.apply(q, k, v, s0, max(1, min(chunk, q.shape[-2])))


def causal_linear_recurrent(q: Tensor, k: Tensor, v: Tensor, s0: Tensor) -> tuple[Tensor, Tensor]:
    """RNN form: S_i = S_{i-1} + k_i v_i^T, out_i = q_i^T S_i, one token at a time (plain autograd)."""
    s, outs = s0, []
    for i in range(q.shape[-2]):
        s = s + k[..., i, :, None] * v[..., i, None, :]
        outs.append((q[..., i, None, :] @ s).squeeze(-2))
    return torch.stack(outs, dim=-2), s


def causal_linear_quadratic(q: Tensor, k: Tensor, v: Tensor, s0: Tensor) -> tuple[Tensor, Tensor]:
    """Parallel form: (q k^T ⊙ lower-triangular) v + q S0, O(T² F) (reference)."""
    lower = _lower(q.shape[-2], q.device)
    scores = (q @ k.transpose(-1, -2)).masked_fill(~lower, 0.0)
    return q @ s0 + scores @ v, s0 + k.transpose(-1, -2) @ v


def causal_linear(q: Tensor, k: Tensor, v: Tensor, s0: Tensor, chunk: int) -> tuple[Tensor, Tensor]:
    """Dispatch: a single token is one recurrent step, longer inputs use the chunked custom op."""
    if q.shape[-2] == 1:
        return causal_linear_recurrent(q, k, v, s0)
    return causal_linear_chunked(q, k, v, s0, chunk)


def segmented_linear(
    q: Tensor, k: Tensor, v: Tensor, s0: Tensor, seen: Tensor, carried: Tensor
) -> tuple[Tensor, Tensor]:
    """Rows restarting inside the chunk (``Backbone.forward(starts=...)``), in the parallel form, O(T² F).

    ``seen`` (B, 1, T, T) bool: new key j is visible to query i (same segment, and j ≤ i when causal);
    ``carried`` (B, 1, T, 1) bool: query i is in segment 0, the one that continues the carried state S0.
    out_i = [carried_i] q_i^T S0 + Σ_j [seen_ij] (q_i·k_j) v_j. The returned state is what the last query sees,
    as a stream would hold it after its last token: S0 unless the row restarted, plus the keys of its last
    segment.
    """
    scores = (q @ k.transpose(-1, -2)).masked_fill(~seen, 0.0)
    out = torch.where(carried, q @ s0, 0.0) + scores @ v
    last = seen[..., -1, :].to(k.dtype)  # (B, 1, T): keys of the last query's segment
    s_end = torch.where(carried[..., -1:, :], s0, 0.0) + (k * last[..., None]).transpose(-1, -2) @ v
    return out, s_end


def noncausal_linear(q: Tensor, k: Tensor, v: Tensor, s0: Tensor) -> tuple[Tensor, Tensor]:
    """Every query sees every key: q (S0 + k^T v) (Katharopoulos eq. 3)."""
    s = s0 + k.transpose(-1, -2) @ v
    return q @ s, s


# -- gated (RFA-Gate) -----------------------------------------------------------------------------------------
def gated_causal_chunked(
    q: Tensor, k: Tensor, v: Tensor, log_g: Tensor, s0: Tensor, chunk: int
) -> tuple[Tensor, Tensor]:
    """S_t = g_t S_{t-1} + k_t v_t^T, out_t = q_t^T S_t, chunk by chunk (plain autograd, T/C carried states).

    Inside a chunk with cumulative log-decay L_i = Σ_{l≤i} log g_l: out_i = e^{L_i} q_i S_prev +
    Σ_{j≤i} e^{L_i - L_j} (q_i·k_j) v_j. Only non-positive exponents are ever formed, so nothing overflows.
    """
    t = q.shape[-2]
    chunk = max(1, min(chunk, t))
    s, outs = s0, []
    for start in range(0, t, chunk):
        sl = slice(start, min(start + chunk, t))
        qc, kc, vc, lg = q[..., sl, :], k[..., sl, :], v[..., sl, :], log_g[..., sl]
        cum = torch.cumsum(lg, dim=-1)
        lower = _lower(qc.shape[-2], q.device)
        decay = torch.exp((cum[..., :, None] - cum[..., None, :]).masked_fill(~lower, float("-inf")))
        outs.append(cum.exp()[..., None] * (qc @ s) + ((qc @ kc.transpose(-1, -2)) * decay) @ vc)
        tail = torch.exp(cum[..., -1:] - cum)  # decay from each token to the end of the chunk
        s = cum[..., -1].exp()[..., None, None] * s + (kc * tail[..., None]).transpose(-1, -2) @ vc
    return torch.cat(outs, dim=-2), s


def gated_causal_recurrent(
    q: Tensor, k: Tensor, v: Tensor, log_g: Tensor, s0: Tensor
) -> tuple[Tensor, Tensor]:
    """RNN form of the gated recurrence, one token at a time."""
    s, outs = s0, []
    for i in range(q.shape[-2]):
        s = log_g[..., i].exp()[..., None, None] * s + k[..., i, :, None] * v[..., i, None, :]
        outs.append((q[..., i, None, :] @ s).squeeze(-2))
    return torch.stack(outs, dim=-2), s


def fold(k: Tensor, v: Tensor, s0: Tensor, log_g: Tensor | None = None) -> Tensor:
    """The state after absorbing keys/values (..., M, F/E) that no query of this call precedes (XL prefix)."""
    if log_g is None:
        return s0 + k.transpose(-1, -2) @ v
    cum = torch.cumsum(log_g, dim=-1)
    tail = torch.exp(cum[..., -1:] - cum)
    return cum[..., -1].exp()[..., None, None] * s0 + (k * tail[..., None]).transpose(-1, -2) @ v
