"""Dense float64 reference attention: the ground truth every variant is tested against.

Shapes: q (..., Tq, D), k (..., Tk, D), v (..., Tk, Dv); ``mask`` bool broadcastable to (..., Tq, Tk), True =
may attend; ``bias`` additive on the logits; ``weight`` multiplies the logits before the bias (DA-Transformer
style). Rows with no allowed key return zeros. Everything is computed in float64 and returned in float64.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def reference_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    weight: Tensor | None = None,
    scale: float | None = None,
    return_probs: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """softmax(mask(weight * (q k^T) * scale + bias)) v in float64."""
    q, k, v = q.double(), k.double(), v.double()
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    logits = torch.matmul(q, k.transpose(-1, -2)) * scale
    if weight is not None:
        logits = logits * weight.double()
    if bias is not None:
        logits = logits + bias.double()
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    probs = torch.nan_to_num(probs, nan=0.0)  # rows with no allowed key
    out = torch.matmul(probs, v)
    return (out, probs) if return_probs else out


def causal_mask(tq: int, tk: int | None = None, device: torch.device | None = None) -> Tensor:
    """(Tq, Tk) bool; queries are the last Tq of the Tk keys (key j visible from query i iff j <= Tk - Tq + i)."""
    tk = tq if tk is None else tk
    i = torch.arange(tq, device=device)[:, None]
    j = torch.arange(tk, device=device)[None, :]
    return j <= (tk - tq) + i


def relative_positions(tq: int, tk: int | None = None, device: torch.device | None = None) -> Tensor:
    """(Tq, Tk) long matrix of i - j with the same bottom-right alignment as :func:`causal_mask`."""
    tk = tq if tk is None else tk
    i = torch.arange(tq, device=device)[:, None] + (tk - tq)
    j = torch.arange(tk, device=device)[None, :]
    return i - j
