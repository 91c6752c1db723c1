"""Shared machinery of the elementwise recurrent mixers (``lru``, ``mingru``, ``mamba``, ``ffm``).

Each of them is a diagonal linear recurrence h_t = a_t ⊙ h_{t-1} + b_t over the time axis, with a_t, b_t
computed from the inputs (real or complex). :func:`linear_scan` evaluates it for a whole window in parallel:
the window is cut into chunks of C tokens, each chunk starting from the last state of the one before; inside a
chunk an associative scan combines neighbouring (a, b) pairs with (a_1, b_1) ∘ (a_2, b_2) = (a_1 a_2,
a_2 b_1 + b_2), recursively on the half-length sequence of pairs, then fills in the other half (the odd-even
form of a parallel prefix scan: ⌈log2 C⌉ vectorised levels of halving size, O(C) work).
The scan multiplies and adds only (no logarithm, no division), so it stays finite for any |a| ≤ 1, including
the a_t = 0 that cuts the recurrence at an episode start: the gradient of every later h with respect to
anything before the start is then exactly zero. Backward is the adjoint recurrence, the same scan run from the
end (only a and h are kept for it). Cost: O(T) elementwise work in O(log C) vectorised levels, one Python step
per chunk.

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


def _odd_even_scan(a: Tensor, b: Tensor) -> Tensor:
    """Inclusive scan of h_t = a_t h_{t-1} + b_t along dim 1 from h_{-1} = 0 (odd-even recursion: O(T) work)."""
    n = b.shape[1]
    if n == 1:
        return b
    m = n // 2
    a_even, a_odd = a[:, 0 : 2 * m : 2], a[:, 1 : 2 * m : 2]
    b_even, b_odd = b[:, 0 : 2 * m : 2], b[:, 1 : 2 * m : 2]
    h_odd = _odd_even_scan(a_odd * a_even, a_odd * b_even + b_odd)  # h_1, h_3, …: pairs combined
    h_even = torch.cat([b_even[:, :1], a_even[:, 1:] * h_odd[:, :-1] + b_even[:, 1:]], dim=1)  # h_0, h_2, …
    h = torch.stack([h_even, h_odd], dim=2).flatten(1, 2)
    if n > 2 * m:  # odd length: the last token after the pairs
        h = torch.cat([h, (a[:, -1] * h[:, -1] + b[:, -1])[:, None]], dim=1)
    return h


def _chunked_scan(a: Tensor, b: Tensor, h0: Tensor | None, chunk_size: int) -> Tensor:
    outs = []
    h = h0
    for start in range(0, b.shape[1], chunk_size):
        a_c, b_c = a[:, start : start + chunk_size], b[:, start : start + chunk_size]
        if h is not None:  # the carried state enters through the chunk's first token
            b_c = torch.cat([(b_c[:, 0] + a_c[:, 0] * h)[:, None], b_c[:, 1:]], dim=1)
        hc = _odd_even_scan(a_c, b_c)
        outs.append(hc)
        h = hc[:, -1]
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)


class _LinearScan(torch.autograd.Function):
    """The scan with its adjoint as backward: for g_t = ∂L/∂h_t, the reverse scan δ_t = g_t + ā_{t+1} δ_{t+1}
    gives ∂L/∂b_t = δ_t, ∂L/∂a_t = δ_t h̄_{t-1}, ∂L/∂h_{-1} = ā_0 δ_0 (bars: complex conjugates, PyTorch's
    convention). Only a and h are kept for backward (no per-level intermediates); an a_t = 0 stops δ exactly."""

    @staticmethod
    def forward(ctx: Any, a: Tensor, b: Tensor, h0: Tensor | None, chunk_size: int) -> Tensor:
        h = _chunked_scan(a, b, h0, chunk_size)
        ctx.chunk_size = chunk_size
        ctx.has_h0 = h0 is not None
        ctx.save_for_backward(a, h, h0 if h0 is not None else h.new_zeros(h[:, 0].shape))
        return h

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        a, h, h0 = ctx.saved_tensors
        a_next = torch.cat([a[:, 1:], torch.zeros_like(a[:, :1])], dim=1).conj()
        delta = _chunked_scan(a_next.flip(1), grad.flip(1), None, ctx.chunk_size).flip(1)
        h_prev = torch.cat([h0[:, None], h[:, :-1]], dim=1)
        grad_a = delta * h_prev.conj() if ctx.needs_input_grad[0] else None
        grad_h0 = a[:, 0].conj() * delta[:, 0] if ctx.has_h0 and ctx.needs_input_grad[2] else None
        return grad_a, delta, grad_h0, None


def linear_scan(a: Tensor, b: Tensor, h0: Tensor | None, chunk_size: int) -> Tensor:
    """h_t = a_t ⊙ h_{t-1} + b_t for t = 0 … T-1 with h_{-1} = ``h0``.

    a, b: (B, T, *N) real or complex (a broadcastable to b); h0: (B, *N) or None (zeros). Returns h (B, T, *N).
    ``chunk_size`` only schedules the work (peak memory O(B·C·N) per chunk); the result does not depend on it
    beyond rounding. Backward is the adjoint scan (:class:`_LinearScan`).
    """
    a = a.expand_as(b)
    if h0 is not None:
        h0 = h0.to(b.dtype)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (a, b, h0)):
        out: Tensor = _LinearScan.apply(a, b, h0, chunk_size)
        return out
    return _chunked_scan(a, b, h0, chunk_size)


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

    kernel_form: ClassVar[bool] = False  # the gates read the layer input: no q, k, v kernel alone

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
        from rl_transformers.backbone import registry

        kind = registry.get("position", cfg.position).cls.kind
        if kind not in cls.position_kinds:
            raise ValueError(
                f"attention {cls.registry_name!r} cannot use position {cfg.position!r} (a {kind!r} scheme): it is "
                "a recurrent mixer (no queries or keys) whose recurrence orders the tokens; use position='none' "
                "(--backbone.position none), or an input scheme such as 'sinusoidal'"
            )
        if cfg.memory is not None:
            raise ValueError(
                f"attention {cls.registry_name!r} is a recurrent mixer whose state is its memory; it takes no "
                f"memory module, got memory={cfg.memory!r}: set memory=None (--backbone.memory None)"
            )

    def core(self, *args: Any, **kwargs: Any) -> tuple[Tensor, Any]:
        raise NotImplementedError(
            f"attention {self.registry_name!r} is a recurrent mixer without queries, keys and values: it has no "
            f"kernel on (q, k, v); call the layer (forward) on its input"
        )

    def enter(self, x: Tensor, ctx: ForwardContext) -> None:
        """Record the input of this application (memory modules and depth controllers count them)."""
        ctx.attention_inputs.append(x)
