"""The flash form of strided's long causal calls: residue classes as one causal flash call + band windows.

Strided's pattern (Child et al. 2019, arXiv 1904.10509) under causality is "same residue class ((i - j) mod l
== 0) ∪ the band 0 <= i - j <= l". Each residue class r (indices r, r + l, ...) is plain causal attention over
its own members, so all classes of all heads run as **one** causal SDPA flash call on a (B, H·l, T/l, D) copy
(no mask tensor); the band keys that are not in the class (i - l + 1 .. i - 1) are small blocked windows; the
two parts are merged exactly by log-sum-exp. The backward calls the CPU flash backward with the merged output
and log-sum-exp, which gives exactly the class keys' share of the gradient of the softmax over the union, and
adds the band share by hand. It applies on CPU, with every key valid, no attention dropout and all heads alike
(:func:`residue_fast_form`); everything else takes :func:`~rl_transformers.backbone.attention._dense.
residue_classes_attention`'s chunked form. Tested against the explicit float64 masks and dense gradients
(tests/backbone/test_sparse.py).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

HAS_CPU_FLASH = hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")
"""The CPU flash kernel (with its log-sum-exp) this form calls; without it the chunked form runs."""

RESIDUE_FLASH = True
"""Let :func:`residue_classes_attention` take the flash form (:class:`ResidueCausal`) where it applies."""
RESIDUE_BAND_BLOCK = 32
"""Queries per block of the band keys in :class:`ResidueCausal`."""


def _to_classes(x: Tensor, stride: int) -> Tensor:
    """(B, H, T, *) -> (B, H·stride, ceil(T / stride), *): residue class r (indices r, r + l, ...) of every head
    made contiguous, the end zero-padded to a multiple of ``stride``."""
    b, h, t = x.shape[:3]
    rest = x.shape[3:]
    pad = (-t) % stride
    if pad:
        x = torch.cat([x, x.new_zeros(b, h, pad, *rest)], dim=2)
    return x.view(b, h, -1, stride, *rest).transpose(2, 3).reshape(b, h * stride, -1, *rest)


def _from_classes(x: Tensor, h: int, t: int, stride: int) -> Tensor:
    """Inverse of :func:`_to_classes`: (B, H·stride, n, *) -> (B, H, T, *)."""
    b, _, n = x.shape[:3]
    rest = x.shape[3:]
    return x.view(b, h, stride, n, *rest).transpose(2, 3).reshape(b, h, stride * n, *rest)[:, :, :t]


class _BandWindows:
    """The band-only keys i - l + 1 .. i - 1 of every query i in blocks of c queries: block n (queries
    n·c .. n·c + c - 1) sees the window of W = c + l - 2 keys n·c - l + 1 .. n·c + c - 2 (copied once, shared by
    the forward and backward; keys before index 0 are masked). O(T·(c + l)) logits per head."""

    def __init__(self, q: Tensor, k: Tensor, v: Tensor, stride: int, c: int) -> None:
        b, h, t, d = q.shape
        self.b, self.h, self.t, self.d, self.l, self.c = b, h, t, d, stride, c
        self.n = -(-t // c)
        self.w = c + stride - 2
        tp = self.n * c
        self.q = F.pad(q, (0, 0, 0, tp - t)).view(b, h, self.n, c, d)
        kp = F.pad(k, (0, 0, stride - 1, tp - t))  # (B, H, tp + l - 1, D); front padding = keys before 0
        vp = F.pad(v, (0, 0, stride - 1, tp - t))
        # contiguous windows: a strided view would make the batched matmuls copy block by block
        self.k_t = kp.unfold(2, self.w, c)[:, :, : self.n].transpose(-1, -2).contiguous().transpose(-1, -2)
        self.v = vp.unfold(2, self.w, c)[:, :, : self.n].transpose(-1, -2).contiguous()  # (B, H, N, W, D)
        a = torch.arange(c, device=q.device)[:, None]
        w = torch.arange(self.w, device=q.device)
        delta = a - w + (stride - 1)  # i - j of query a and window key w
        neg = torch.full((), float("-inf"), dtype=q.dtype, device=q.device)
        zero = torch.zeros((), dtype=q.dtype, device=q.device)
        self.bias = torch.where((delta >= 1) & (delta <= stride - 1), zero, neg)  # (c, W)
        self.n0 = min(self.n, -(-(stride - 1) // c))  # the first blocks' windows reach before key 0
        j = (torch.arange(self.n0, device=q.device) * c)[:, None, None] + w - (stride - 1)
        self.first = torch.where(j >= 0, zero, neg).expand(self.n0, c, self.w)  # (n0, c, W)

    def logits(self, scale: float) -> Tensor:
        s = torch.matmul(self.q, self.k_t).mul_(scale).add_(self.bias)  # (B, H, N, c, W)
        s[:, :, : self.n0].add_(self.first)
        return s

    def blocks(self, x: Tensor) -> Tensor:
        """(B, H, T, *) -> (B, H, N, c, *) (end zero-padded)."""
        pad = self.n * self.c - self.t
        if pad:
            x = torch.cat([x, x.new_zeros(*x.shape[:2], pad, *x.shape[3:])], dim=2)
        return x.reshape(self.b, self.h, self.n, self.c, *x.shape[3:])

    def unblock(self, x: Tensor) -> Tensor:
        return x.reshape(self.b, self.h, self.n * self.c, *x.shape[4:])[:, :, : self.t]

    def fold(self, x: Tensor) -> Tensor:
        """Sum per-window key gradients (B, H, N, W, D) back onto the keys: (B, H, T, D)."""
        c, pieces = self.c, -(-self.w // self.c)  # window n covers padded keys n·c .. n·c + W - 1
        full = x.new_zeros(self.b, self.h, self.n + pieces, c, self.d)
        for m in range(pieces):  # piece m of every window lands on key block n + m
            part = x[:, :, :, m * c : (m + 1) * c]
            full[:, :, m : m + self.n, : part.shape[3]] += part
        return full.view(self.b, self.h, -1, self.d)[:, :, self.l - 1 : self.l - 1 + self.t]


class ResidueCausal(torch.autograd.Function):
    """Causal "same residue class ∪ band" attention (every key valid): the classes as one causal flash call,
    the band-only keys as blocked windows, merged by log-sum-exp; the backward reuses the flash backward with
    the merged output and log-sum-exp (the gradient of the softmax over the union, restricted to each part)."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, stride: int, band: bool, scale: float) -> Tensor:
        h, t = q.shape[1], q.shape[2]
        qc, kc, vc = (_to_classes(x, stride) for x in (q, k, v))
        out_c, lse_c = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            qc, kc, vc, 0.0, True, scale=scale
        )
        out = _from_classes(out_c, h, t, stride)
        lse = _from_classes(lse_c, h, t, stride)
        win = None
        if band and stride > 1:
            win = _BandWindows(q, k, v, stride, RESIDUE_BAND_BLOCK)
            s = win.logits(scale)
            top = s.amax(dim=-1, keepdim=True).clamp_min_(torch.finfo(s.dtype).min)  # query 0: no band key
            e = s.sub_(top).exp_()
            top = win.unblock(top[..., 0])
            total = torch.logaddexp(lse, top + win.unblock(e.sum(dim=-1)).log())  # band lse: -inf if none
            pv = torch.matmul(e, win.v).mul_(win.blocks((top - total).exp())[..., None])
            out = out * torch.exp(lse - total)[..., None] + win.unblock(pv)
            lse = total
        else:
            out = out.contiguous()
        ctx.save_for_backward(qc, kc, vc, out, lse)
        ctx.stride, ctx.scale, ctx.win = stride, scale, win  # the class copies and windows serve the backward
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        qc, kc, vc, out, lse = ctx.saved_tensors
        stride, scale, win = ctx.stride, ctx.scale, ctx.win
        h, t = out.shape[1], out.shape[2]
        oc, gc, lc = (_to_classes(x, stride) for x in (out, grad, lse))
        dqc, dkc, dvc = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            gc, qc, kc, vc, oc, lc, 0.0, True, scale=scale
        )
        dq, dk, dv = (_from_classes(x, h, t, stride) for x in (dqc, dkc, dvc))
        if win is not None:
            g = win.blocks(grad)
            p = win.logits(scale).sub_(win.blocks(lse)[..., None]).exp_()  # (B, H, N, c, W)
            dv = dv + win.fold(torch.matmul(p.transpose(-1, -2), g))
            delta = win.blocks((grad * out).sum(-1))[..., None]
            ds = torch.matmul(g, win.v.transpose(-1, -2)).sub_(delta).mul_(p).mul_(scale)
            dq = dq + win.unblock(torch.matmul(ds, win.k_t.transpose(-1, -2)))
            dk = dk + win.fold(torch.matmul(ds.transpose(-1, -2), win.q))
        return dq, dk, dv, None, None, None


def residue_fast_form(
    att: Any, q: Tensor, k_valid: Tensor, class_heads: Tensor, band_heads: Tensor
) -> bool | None:
    """Whether :func:`~rl_transformers.backbone.attention._dense.residue_classes_attention` can take the flash form (:class:`ResidueCausal`): on CPU, every
    key valid, no attention dropout, every head attending its residue class and either every head or none the
    band (``union`` / an A(2) layer of ``alternate``). Returns whether the band is attended, None = not."""
    if (
        not RESIDUE_FLASH
        or q.device.type != "cpu"
        or not HAS_CPU_FLASH
        or (att.training and att.attn_dropout.p > 0)
    ):
        return None
    if not bool(class_heads.all()) or not bool(k_valid.all()):
        return None
    if bool(band_heads.all()):
        return True
    return False if not bool(band_heads.any()) else None
