"""Shared machinery of the elementwise recurrent mixers (``lru``, ``mingru``, ``mamba``, ``ffm``).

Each of them is a diagonal linear recurrence h_t = a_t ⊙ h_{t-1} + b_t over the time axis, with a_t, b_t
computed from the inputs (real or complex). :func:`linear_scan` evaluates it for a whole window in parallel:
the window is cut into chunks of C tokens; inside a chunk an associative (Hillis-Steele) scan combines
(a, b) pairs with (a_1, b_1) ∘ (a_2, b_2) = (a_1 a_2, a_2 b_1 + b_2) in ⌈log2 C⌉ vectorised steps, and the
chunks are chained by h_t = h_t^{chunk} + A_t ⊙ h_{start-1} with A_t the running product of a inside the chunk.
The scan multiplies and adds only (no logarithm, no division), so it stays finite for any |a| ≤ 1, including
the a_t = 0 that cuts the recurrence at an episode start: the gradient of every later h with respect to
anything before the start is then exactly zero. Cost: O(T·log C) elementwise work, one Python step per chunk.

:func:`restarts` turns ``ForwardContext.segment`` (rows restarting inside the window) into the tokens at which
the recurrence restarts, and :class:`RecurrentMixer` is the base class of the mixers: no q / k / v projections
(each mixer builds its own layers), causal only, no XL-type memory (the recurrent state is the memory), state
kept in at least float32.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from rl_transformers.backbone.attention.base import Attention
from rl_transformers.backbone.context import ForwardContext
from rl_transformers.backbone.position.base import Position


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half-precision inputs are scanned (and their states kept) in float32."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def check_positive(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def _scan_chunk(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """Inclusive scan of one chunk along dim 1: (running product of a, h with zero initial state)."""
    n = a.shape[1]
    step = 1
    while step < n:
        a_prev, b_prev = a[:, :-step], b[:, :-step]
        b = torch.cat([b[:, :step], b[:, step:] + a[:, step:] * b_prev], dim=1)
        a = torch.cat([a[:, :step], a[:, step:] * a_prev], dim=1)
        step *= 2
    return a, b


def linear_scan(a: Tensor, b: Tensor, h0: Tensor | None, chunk_size: int) -> Tensor:
    """h_t = a_t ⊙ h_{t-1} + b_t for t = 0 … T-1 with h_{-1} = ``h0``.

    a, b: (B, T, *N) real or complex (a broadcastable to b); h0: (B, *N) or None (zeros). Returns h (B, T, *N).
    ``chunk_size`` only schedules the work (memory O(B·C·N·log C) per chunk); the result does not depend on it
    beyond rounding.
    """
    a = a.expand_as(b)
    outs = []
    h = h0
    for start in range(0, b.shape[1], chunk_size):
        prod, hc = _scan_chunk(a[:, start : start + chunk_size], b[:, start : start + chunk_size])
        if h is not None:
            hc = hc + prod * h[:, None]
        outs.append(hc)
        h = hc[:, -1]
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)


def restarts(ctx: ForwardContext) -> Tensor | None:
    """(B, T) bool: the recurrence restarts at this token (a row's episode starts inside the window), or None.

    The first token's restart is a ``reset`` of the carried state (``Backbone.forward``); restarting there
    again changes nothing."""
    seg = ctx.segment
    if seg is None:
        return None
    return torch.diff(seg, dim=1, prepend=torch.zeros_like(seg[:, :1])) > 0


def gate_inputs(a: Tensor, b: Tensor, ctx: ForwardContext) -> tuple[Tensor, Tensor]:
    """(a, b) of the scan with restarts (a = 0) and padding (a = 1, b = 0: a padded token leaves the state as
    it is). a, b: (B, T, *N)."""
    shape = (b.shape[0], b.shape[1]) + (1,) * (b.dim() - 2)
    a = a.expand_as(b)
    if not ctx.all_valid:
        valid = ctx.valid.view(shape)
        a = torch.where(valid, a, torch.ones_like(a))
        b = torch.where(valid, b, torch.zeros_like(b))
    cut = restarts(ctx)
    if cut is not None:
        a = torch.where(cut.view(shape), torch.zeros_like(a), a)
    return a, b


class RecurrentMixer(Attention):
    """Base of the elementwise recurrent mixers: the ``Attention`` interface without its q / k / v / o
    projections. Subclasses build their own layers in ``__init__`` (after calling this one) and implement
    ``forward(x, ctx, state) -> (y (B, T, d), state)`` and ``init_state``.
    """

    position_kinds: ClassVar[frozenset[str]] = frozenset({"none", "input"})
    segment_masks: ClassVar[bool] = True

    def __init__(self, cfg: Any, options: Any, position: Position, layer: int) -> None:
        nn.Module.__init__(self)
        self.cfg = cfg
        self.options = options
        object.__setattr__(self, "position", position)  # owned by the Backbone (input schemes act there)
        self.layer = layer
        self.n_heads = cfg.n_heads
        self.d_head = cfg.d_head
        self.causal = cfg.causal

    @classmethod
    def check_config(cls, cfg: Any, options: Any) -> None:
        super().check_config(cfg, options)
        if cfg.memory is not None:
            raise ValueError(
                f"attention {cls.registry_name!r} is a recurrent mixer whose state is its memory; it takes no "
                f"memory module, got memory={cfg.memory!r}: set memory=None (--backbone.memory None)"
            )

    def enter(self, x: Tensor, ctx: ForwardContext) -> None:
        """Record the input of this application (memory modules and depth controllers count them)."""
        ctx.attention_inputs.append(x)
