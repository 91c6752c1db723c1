"""The positional-scheme interface every ``position`` entry implements.

A scheme acts at one of four places, declared by ``kind``:

- ``"input"``: adds a vector to the hidden states before a layer (sinusoidal, learned);
- ``"qk"``: transforms queries and keys by their positions (RoPE) - works with every attention, including the
  kernel / linear family;
- ``"bias"``: adds a bias that depends only on q_pos - k_pos to the logits (ALiBi, T5, KERPLE, Sandwich);
- ``"scores"``: computes the logits itself and may add a value term (Shaw, Transformer-XL, DA, and XPOS, whose
  exponential scale is applied relative to the query block so long streams never overflow).

Attention kernels call :meth:`Position.logits` on any sub-blocks of queries and keys, passing the absolute
positions of those queries and keys, so banded / blocked kernels get every "bias"/"scores" scheme for free.

Shapes: q (B, H, *, Tq, D), k (B, H, *, Tk, D), q_pos (B, *, Tq), k_pos (B, *, Tk) long, where * is any number
of extra block dimensions. Logits are (B, H, *, Tq, Tk) and already include the 1/sqrt(D) scale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

KINDS = ("none", "input", "qk", "bias", "scores")


@dataclass(frozen=True)
class NoOptions:
    """This entry takes no options."""


def relative(q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """(B, *, Tq, Tk) matrix of q_pos - k_pos (positive = key in the past)."""
    return q_pos.unsqueeze(-1) - k_pos.unsqueeze(-2)


def heads_first(t: Tensor) -> Tensor:
    """(B, *, Tq, Tk, H) -> (B, H, *, Tq, Tk)."""
    return t.movedim(-1, 1)


class Position(nn.Module):
    """Base class: the identity scheme. Subclasses override the hooks of their ``kind``."""

    kind: ClassVar[str] = "none"
    shift_invariant: ClassVar[bool] = True
    """True when logits depend on positions only through q_pos - k_pos (tested)."""

    def __init__(self, cfg: Any, options: Any) -> None:
        super().__init__()
        self.cfg = cfg
        self.options = options
        self.n_heads: int = cfg.n_heads
        self.d_head: int = cfg.d_head
        self.scale = 1.0 / math.sqrt(cfg.d_head)

    # -- "input" ---------------------------------------------------------------------------------------------
    def embed(self, x: Tensor, pos: Tensor, layer: int) -> Tensor:
        """Hidden states (B, T, d) entering ``layer``; pos (B, T)."""
        return x

    # -- "qk" ------------------------------------------------------------------------------------------------
    def transform_q(self, q: Tensor, pos: Tensor, layer: int) -> Tensor:
        """q (B, H, T, D), pos (B, T)."""
        return q

    def transform_k(self, k: Tensor, pos: Tensor, layer: int) -> Tensor:
        """k (B, H, T, D), pos (B, T)."""
        return k

    # -- "bias" / "scores" -----------------------------------------------------------------------------------
    def bias(self, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor | None:
        """Additive logit bias broadcastable to (B, H, *, Tq, Tk), or None."""
        return None

    def logits(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        """Attention logits (B, H, *, Tq, Tk) including the scale."""
        logits = torch.matmul(q, k.transpose(-1, -2)) * self.scale
        bias = self.bias(q_pos, k_pos, layer)
        return logits if bias is None else logits + bias.to(logits.dtype)

    def logits_aligned(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        """:meth:`logits` when the caller guarantees column-aligned keys: q and k are the full bottom-right
        aligned call (no block dims) and every pair the mask lets through has q_pos - k_pos == Tk - Tq + i - j
        (the Backbone's positions with KV-cache or XL memory; ``ForwardContext.aligned``). Pairs the mask
        removes may hold anything. A scheme may then skip analysing the positions (xl_relative); the default is
        :meth:`logits`."""
        return self.logits(q, k, q_pos, k_pos, layer)

    def value_term(self, probs: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor | None:
        """Extra term added to probs @ v (Shaw's relative values), (B, H, *, Tq, D), or None."""
        return None

    @property
    def modifies_scores(self) -> bool:
        """True when the kernel must build logits with :meth:`logits` (no plain SDPA fast path)."""
        return self.kind in ("bias", "scores")
