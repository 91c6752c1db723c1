"""The flash form of ``routing``'s long calls: every cluster as one sequence of time-ordered slots, all clusters
of all heads in **one** CPU flash call (no T x S mask), the own key merged by log-sum-exp.

Query i (key index i + off) of cluster c attends the valid keys j <= i + off of cluster c (causal) plus always
its own key. Walk the events "key j of cluster c" and "query i of cluster c" in time order (a key before a query
at the same time): a query sees exactly the cluster's keys before it in that order. Each event takes a slot of
its cluster's sequence, except that a query directly after a key shares that key's slot; then a query in slot p
sees, under plain causal attention over the slots, exactly the keys in slots <= p. Slots without a key are
masked by a (B, H·k, 1, M) key mask (a large finite negative, so no row is empty); slots without a query are
dropped (their gradient is zero). The own key, when it is not already one of the cluster's keys (another
cluster or padding), is merged exactly by log-sum-exp; the backward calls the CPU flash backward with the merged
output and log-sum-exp (the cluster keys' share of the gradient of the softmax over the union) and adds the own
key's share by hand. Non-causal calls run the same slots with is_causal=False (every key of the cluster).

Work per cluster ~ (its slots)² / 2: for independent query / key clusters of k balanced clusters about
((2 - 1/k)·T / k)² / 2 each (fewer with the shared slots), vs T² / 2 for full causal attention. Applies on CPU
with plain positions (no score bias), no attention dropout and no ``max_cache`` (:func:`routing_flash_applies`);
tested against the explicit float64 masks and dense gradients (tests/backbone/test_routing.py).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

HAS_CPU_FLASH = hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")
ROUTING_FLASH = True
"""Let :func:`~rl_transformers.backbone.attention._routing_kernels.cluster_attention` take this form."""
_MASKED = -1e30
"""Key-mask value of slots without a key: finite, so a row that sees none gets a finite log-sum-exp (its weight
after the merge with the own key is exactly 0)."""


def routing_flash_applies(att: Any, q: Tensor, max_cache: int | None) -> bool:
    """Whether :class:`RoutingFlash` can run this call (CPU, plain scores, no dropout, no ``max_cache``)."""
    return (
        ROUTING_FLASH
        and HAS_CPU_FLASH
        and q.device.type == "cpu"
        and max_cache is None
        and not att.position.modifies_scores
        and not (att.training and att.attn_dropout.p > 0)
    )


@torch.no_grad()
def cluster_slots(
    cq: Tensor, ck: Tensor, k_valid: Tensor, n_clusters: int
) -> tuple[Tensor, Tensor, Tensor, Tensor, int]:
    """Slot layout of the clusters (see the module docstring).

    cq (B, h, T), ck (B, h, S) cluster ids, k_valid (B, S). Returns src_q (B, h, k·M): query index of each slot
    (T = none), src_k (B, h, k·M): key index of each slot (S = none), slot_q (B, h, T): slot of each query,
    own (B, h, T) bool: the own key is not among the cluster's keys (merge it), and M (slots per cluster).
    """
    b, h, t = cq.shape
    s = ck.shape[2]
    off = s - t
    dev = cq.device
    kc = torch.where(k_valid[:, None, :], ck, torch.full_like(ck, n_clusters))  # padding: an extra cluster
    # events: keys (time j, type 0) then queries (time i + off, type 1); sorted by (cluster, time, type)
    cluster = torch.cat([kc, cq], dim=2)  # (B, h, S + T)
    time = torch.cat([torch.arange(s, device=dev), torch.arange(t, device=dev) + off])
    kind = torch.cat(
        [torch.zeros(s, dtype=torch.long, device=dev), torch.ones(t, dtype=torch.long, device=dev)]
    )
    order = torch.argsort(cluster * (2 * s) + (2 * time + kind), dim=-1)
    c_sorted = cluster.gather(2, order)
    k_sorted = kind.expand_as(cluster).gather(2, order)
    pair = torch.zeros_like(c_sorted, dtype=torch.bool)
    pair[..., 1:] = (
        (k_sorted[..., 1:] == 1) & (k_sorted[..., :-1] == 0) & (c_sorted[..., 1:] == c_sorted[..., :-1])
    )
    new = (~pair).long()
    count = torch.zeros(b, h, n_clusters + 1, dtype=torch.long, device=dev).scatter_add_(2, c_sorted, new)
    base = count.cumsum(-1) - count
    slot = new.cumsum(-1) - 1 - base.gather(2, c_sorted)  # slot of each event inside its cluster
    m = max(1, int(count[..., :n_clusters].max()))
    # events of the padding cluster go to a dropped extra slot k·M
    flat = torch.where(c_sorted < n_clusters, c_sorted * m + slot, torch.full_like(slot, n_clusters * m))
    is_q = k_sorted == 1
    token = torch.where(is_q, order - s, order)
    src_q = torch.full((b, h, n_clusters * m + 1), t, dtype=torch.long, device=dev)
    src_q.scatter_(2, torch.where(is_q, flat, n_clusters * m), torch.where(is_q, token, t))
    src_k = torch.full((b, h, n_clusters * m + 1), s, dtype=torch.long, device=dev)
    src_k.scatter_(2, torch.where(is_q, n_clusters * m, flat), torch.where(is_q, s, token))
    src_q, src_k = src_q[..., :-1], src_k[..., :-1]
    slot_q = torch.zeros(b, h, t + 1, dtype=torch.long, device=dev)
    slot_q.scatter_(2, torch.where(is_q, token, t), flat)
    slot_q = slot_q[..., :t]
    own = ~(k_valid[:, None, off:] & (ck[..., off:] == cq))
    return src_q, src_k, slot_q, own, m


def _flat(x: Tensor) -> tuple[Tensor, list[int]]:
    """x (..., D) as a 2-D view of rows (R, D) over its storage and the row strides of its other dimensions (no
    copy when every stride is a multiple of D, e.g. a transposed (B, T, H, D) layout)."""
    d = x.shape[-1]
    if x.stride(-1) != 1 or any(
        st % d for sz, st in zip(x.shape[:-1], x.stride()[:-1], strict=True) if sz > 1
    ):
        x = x.contiguous()
    strides = [st // d if sz > 1 else 0 for sz, st in zip(x.shape[:-1], x.stride()[:-1], strict=True)]
    rows = sum((sz - 1) * st for sz, st in zip(x.shape[:-1], strides, strict=True)) + 1
    return x.as_strided((rows, d), (d, 1)), strides


def _row_ids(x: Tensor, index: Tensor, groups: int = 1) -> tuple[Tensor, Tensor]:
    """Rows of x (B, G·groups... see below) picked by ``index`` (B, h, I), as (2-D rows view, flat row ids).

    x is (B, h, N, D) (groups = 1) or (B, h·n, m, D) with N = n·m (groups = n): index i of head r is row
    (r·n + i // m, i % m)."""
    flat, (s0, s1, s2) = _flat(x)
    b, h = index.shape[:2]
    bi = torch.arange(b, device=x.device).view(b, 1, 1) * s0
    if groups == 1:
        ids = bi + torch.arange(h, device=x.device).view(1, h, 1) * s1 + index * s2
    else:
        m = x.shape[2]
        g = torch.arange(h, device=x.device).view(1, h, 1) * groups + index // m
        ids = bi + g * s1 + (index % m) * s2
    return flat, ids.flatten()


def _take(x: Tensor, index: Tensor, groups: int = 1) -> Tensor:
    """(B, h, I, D): the rows of x at ``index`` (B, h, I) (see :func:`_row_ids`)."""
    flat, ids = _row_ids(x, index, groups)
    return flat.index_select(0, ids).view(*index.shape, x.shape[-1])


def _add_slots(grad_slots: Tensor, src: Tensor, b: int, h: int, s: int) -> Tensor:
    """Sum the slot gradients (B, h·n, m, D) (any dense layout) onto the keys: (B, h, S, D); ``src`` (B, h, n·m)
    is the key of each slot (slots without a key carry an exactly zero gradient, added to a clamped key)."""
    d = grad_slots.shape[-1]
    flat, strides = _flat(grad_slots)
    target = torch.arange(b, device=src.device).view(b, 1, 1) * h + torch.arange(h, device=src.device).view(
        1, h, 1
    )
    target = (target * s + src).view(grad_slots.shape[:3])
    order = torch.empty_strided(target.shape, strides, dtype=target.dtype, device=target.device)
    order.copy_(target)  # the target row of every row of ``flat`` in its memory order
    ids = order.as_strided((flat.shape[0],), (1,))
    return grad_slots.new_zeros(b * h * s, d).index_add_(0, ids, flat).view(b, h, s, d)


class RoutingFlash(torch.autograd.Function):
    """Cluster attention as one flash call over the slots + the own key by log-sum-exp (see the module
    docstring). q (B, h, T, D); k, v (B, h, S, D); returns (B, h, T, D)."""

    @staticmethod
    def forward(
        ctx: Any,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        slots: tuple[Tensor, Tensor, Tensor, Tensor, int],
        causal: bool,
        scale: float,
    ) -> Tensor:
        src_q, src_k, slot_q, own, m = slots
        b, h, t, d = q.shape
        s = k.shape[2]
        off = s - t
        n = src_q.shape[2] // m
        # slots without a query / key take a clamped real one: the query's output is dropped (zero gradient),
        # the key is masked
        q_ok = src_q < t
        src_qc, src_kc = src_q.clamp_max(t - 1), src_k.clamp_max(s - 1)
        qs = _take(q, src_qc).view(b, h * n, m, d)
        ks = _take(k, src_kc).view(b, h * n, m, d)
        vs = _take(v, src_kc).view(b, h * n, m, d)
        zero = torch.zeros((), dtype=q.dtype, device=q.device)
        mask = torch.where(src_k < s, zero, torch.full_like(zero, _MASKED)).view(b, h * n, 1, m)
        out_s, lse_s = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            qs, ks, vs, 0.0, causal, attn_mask=mask, scale=scale
        )
        out = _take(out_s, slot_q, n)
        lse_s = lse_s.reshape(b, h, n * m)
        lse = lse_s.gather(2, slot_q)
        k_own, v_own = k[:, :, off:], v[:, :, off:]
        own_logit = (q * k_own).sum(-1) * scale
        total = torch.where(own, torch.logaddexp(lse, own_logit), lse)
        w_own = torch.where(own, (own_logit - total).exp(), zero)
        out = out.mul_((lse - total).exp().unsqueeze(-1)).addcmul_(w_own.unsqueeze(-1), v_own)
        lse_m = lse_s.scatter(2, slot_q, total).view(b, h * n, m)  # slots without a query: their own
        ctx.save_for_backward(q, k, v, qs, ks, vs, mask, out, lse_m, w_own, src_qc, q_ok, src_kc, slot_q)
        ctx.causal, ctx.scale = causal, scale
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, qs, ks, vs, mask, out, lse_m, w_own, src_qc, q_ok, src_kc, slot_q = ctx.saved_tensors
        b, h, t = q.shape[:3]
        s = k.shape[2]
        off = s - t
        n = qs.shape[1] // h
        g_s = _take(grad, src_qc).mul_(q_ok.unsqueeze(-1)).view(qs.shape)  # slots without a query: zero
        o_s = _take(out, src_qc).view(qs.shape)
        dqs, dks, dvs = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            g_s, qs, ks, vs, o_s, lse_m, 0.0, ctx.causal, attn_mask=mask, scale=ctx.scale
        )
        dq = _take(dqs, slot_q, n)
        dk = _add_slots(dks, src_kc, b, h, s)
        dv = _add_slots(dvs, src_kc, b, h, s)
        # the own key's share: p = w_own, ds = p (g·v_own - g·out) scale
        k_own, v_own = k[:, :, off:], v[:, :, off:]
        ds = w_own * ((grad * v_own).sum(-1) - (grad * out).sum(-1)) * ctx.scale
        dq = dq.addcmul_(ds.unsqueeze(-1), k_own)
        dk[:, :, off:].addcmul_(ds.unsqueeze(-1), q)
        dv[:, :, off:].addcmul_(w_own.unsqueeze(-1), grad)
        return dq, dk, dv, None, None, None


def routing_flash(
    q: Tensor, k: Tensor, v: Tensor, k_valid: Tensor, cq: Tensor, ck: Tensor, n_clusters: int, causal: bool,
    scale: float,
) -> Tensor:  # fmt: skip
    """Each query attends the visible keys of its cluster plus its own key, through :class:`RoutingFlash`."""
    slots = cluster_slots(cq, ck, k_valid, n_clusters)
    return RoutingFlash.apply(q, k, v, slots, causal, scale)
