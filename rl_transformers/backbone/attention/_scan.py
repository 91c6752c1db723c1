"""Shared machinery of the elementwise recurrent mixers (``lru``, ``mingru``, ``mamba``, ``ffm``).

Each of them is a diagonal linear recurrence h_t = a_t ⊙ h_{t-1} + b_t over the time axis, with a_t, b_t
computed from the inputs (real or complex). :func:`linear_scan` evaluates it for a whole window in parallel:
the window is cut into chunks of C tokens, each chunk starting from the last state of the one before; inside a
chunk an associative scan combines neighbouring (a, b) pairs with (a_1, b_1) ∘ (a_2, b_2) = (a_1 a_2,
a_2 b_1 + b_2), recursively on the half-length sequence of pairs, then fills in the other half (the odd-even
form of a parallel prefix scan: ⌈log2 C⌉ vectorised levels of halving size, O(C) work).
The scan multiplies and adds only (no logarithm, no division), so it stays finite for any |a| ≤ 1, including
the a_t = 0 that cuts the recurrence at an episode start: the gradient of every later h with respect to
anything before the start is then exactly zero. Backward is the adjoint recurrence, the mirrored scan run from
the end (only a and h are kept for it). :func:`selective_scan` is mamba's form of it, fused with its inputs
(a = exp(Δ A), b = Δ u Bᵀ) and read-out (C h), so that backward forms each (B, T, E, N) gradient once. Cost: O(T) elementwise work in O(log C) vectorised levels, one Python step
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
    h = torch.empty_like(b)
    h_odd = h[:, 1 : 2 * m : 2]
    h_odd.copy_(_odd_even_scan(a_odd * a_even, torch.addcmul(b_odd, a_odd, b_even)))  # h_1, h_3, …
    h[:, 0] = b[:, 0]
    if m > 1:  # h_2, h_4, …: one step from the odd state before each
        torch.addcmul(b_even[:, 1:], a_even[:, 1:], h_odd[:, :-1], out=h[:, 2 : 2 * m : 2])
    if n > 2 * m:  # odd length: the last token after the pairs
        torch.addcmul(b[:, -1], a[:, -1], h[:, -2], out=h[:, -1])
    return h


def _odd_even_scan_reverse(a: Tensor, b: Tensor) -> Tensor:
    """Scan from the end: h_t = a_t h_{t+1} + b_t along dim 1 with h_T = 0 (a_{T-1} is not read); the mirror of
    :func:`_odd_even_scan` (pairs (2i, 2i+1) give h_{2i} = a_{2i} a_{2i+1} h_{2i+2} + a_{2i} b_{2i+1} + b_{2i})."""
    n = b.shape[1]
    if n == 1:
        return b
    m, odd = n // 2, n % 2 == 1
    a_even, a_odd = a[:, 0 : 2 * m : 2], a[:, 1 : 2 * m : 2]
    b_even, b_odd = b[:, 0 : 2 * m : 2], b[:, 1 : 2 * m : 2]
    pair_b = torch.addcmul(b_even, a_even, b_odd)
    last_odd = b_odd[:, -1]  # h_{2m-1} = b_{2m-1} + a_{2m-1} h_{2m}
    if odd:  # h_{n-1} = b_{n-1} closes the pairs' recursion
        pair_b[:, -1].addcmul_(a_even[:, -1] * a_odd[:, -1], b[:, -1])
        last_odd = torch.addcmul(last_odd, a_odd[:, -1], b[:, -1])
    h = torch.empty_like(b)
    h_even = h[:, 0 : 2 * m : 2]
    h_even.copy_(_odd_even_scan_reverse(a_even * a_odd, pair_b))
    if odd:
        h[:, -1] = b[:, -1]
    if m > 1:  # h_1, h_3, …: one step back from the even state after each
        torch.addcmul(b_odd[:, :-1], a_odd[:, :-1], h_even[:, 1:], out=h[:, 1 : 2 * m - 2 : 2])
    h[:, 2 * m - 1] = last_odd
    return h


def _chunked_scan_reverse(a: Tensor, b: Tensor, chunk_size: int) -> Tensor:
    """:func:`_odd_even_scan_reverse` chunk by chunk from the end (h_T = 0)."""
    outs = []
    h = None
    n = b.shape[1]
    for stop in range(n, 0, -chunk_size):
        start = max(0, stop - chunk_size)
        a_c, b_c = a[:, start:stop], b[:, start:stop]
        if h is not None:  # the later chunk's first state enters through this chunk's last token
            b_c = b_c.clone()
            b_c[:, -1].addcmul_(a_c[:, -1], h)
        hc = _odd_even_scan_reverse(a_c, b_c)
        outs.append(hc)
        h = hc[:, 0]
    return outs[0] if len(outs) == 1 else torch.cat(outs[::-1], dim=1)


def _chunked_scan(a: Tensor, b: Tensor, h0: Tensor | None, chunk_size: int) -> Tensor:
    outs = []
    h = h0
    for start in range(0, b.shape[1], chunk_size):
        a_c, b_c = a[:, start : start + chunk_size], b[:, start : start + chunk_size]
        if h is not None:  # the carried state enters through the chunk's first token
            b_c = b_c.clone()
            b_c[:, 0].addcmul_(a_c[:, 0], h)
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
        delta = _adjoint_scan(a, grad, ctx.chunk_size)
        h_prev = torch.cat([h0[:, None], h[:, :-1]], dim=1)
        grad_a = delta * h_prev.conj() if ctx.needs_input_grad[0] else None
        grad_h0 = a[:, 0].conj() * delta[:, 0] if ctx.has_h0 and ctx.needs_input_grad[2] else None
        return grad_a, delta, grad_h0, None


def _adjoint_scan(a: Tensor, grad: Tensor, chunk_size: int) -> Tensor:
    """δ_t = g_t + ā_{t+1} δ_{t+1} (δ_{T-1} = g_{T-1}): the scan run from the end."""
    a_next = torch.cat([a[:, 1:], torch.zeros_like(a[:, :1])], dim=1).conj()
    return _chunked_scan_reverse(a_next, grad, chunk_size)


class _SelectiveScan(torch.autograd.Function):
    """Mamba's scan fused with its inputs and read-out: h_t = exp(Δ_t A) ⊙ h_{t-1} · keep_t + (Δ_t u_t) B_t^T,
    y_t = h_t C_t, returning (y, h_{T-1}). Only a, h and the small inputs are kept; backward forms the (B, T,
    E, N) gradients once (δ by the adjoint scan, ∂L/∂(ΔA) = δ ⊙ h_{t-1} ⊙ a) and reduces them to the inputs'
    shapes with matrix products, where autograd through the separate operations would build several more."""

    @staticmethod
    def forward(ctx: Any, delta: Tensor, u: Tensor, a_mat: Tensor, b_in: Tensor, c_out: Tensor,
                h0: Tensor | None, keep: Tensor | None, chunk_size: int) -> tuple[Tensor, Tensor]:  # fmt: skip
        y, last, a, h = _selective_chunks(delta, u, a_mat, b_in, c_out, h0, keep, chunk_size, True)
        ctx.chunk_size, ctx.has_h0 = chunk_size, h0 is not None
        ctx.save_for_backward(
            delta, u, a_mat, b_in, c_out, a, h, h0 if h0 is not None else torch.zeros_like(last)
        )
        return y, last

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_y: Tensor, grad_last: Tensor | None) -> tuple[Tensor | None, ...]:
        delta, u, a_mat, b_in, c_out, a, h, h0 = ctx.saved_tensors
        g = grad_y[..., None] * c_out[:, :, None, :]  # ∂L/∂h_t from the read-out
        if grad_last is not None:
            g[:, -1] += grad_last
        dh = _adjoint_scan(a, g, ctx.chunk_size)  # ∂L/∂h_t through the recurrence = ∂L/∂b_t
        dz = dh * torch.cat([h0[:, None], h[:, :-1]], dim=1)
        dz *= a  # ∂L/∂(Δ_t A)
        d_du = torch.matmul(dh, b_in[..., None]).squeeze(-1)  # (B, T, E)
        d_delta = torch.einsum("bten,en->bte", dz, a_mat) + d_du * u
        d_amat = torch.einsum("bten,bte->en", dz, delta)
        d_b = torch.matmul((delta * u)[:, :, None, :], dh).squeeze(2)  # (B, T, N)
        d_c = torch.matmul(grad_y[:, :, None, :], h).squeeze(2)
        d_h0 = a[:, 0] * dh[:, 0] if ctx.has_h0 else None
        return d_delta, d_du * delta, d_amat, d_b, d_c, d_h0, None, None


def _selective_chunks(delta: Tensor, u: Tensor, a_mat: Tensor, b_in: Tensor, c_out: Tensor, h0: Tensor | None,
                      keep: Tensor | None, chunk_size: int, keep_all: bool) -> tuple[Tensor, Tensor, Any, Any]:  # fmt: skip
    """The selective scan chunk by chunk: (B, C, E, N) at a time, so without ``keep_all`` (no backward to come)
    memory stays O(B·C·E·N) at any length. Returns (y, h_{T-1}, a, h), a and h (B, T, E, N) only with
    ``keep_all``."""
    t = u.shape[1]
    du = delta * u
    ys, a_all, h_all = [], [], []
    h = h0
    for start in range(0, t, chunk_size):
        rows = slice(start, start + chunk_size)
        d_c = delta[:, rows, :, None]
        a_c = torch.exp(d_c * a_mat)  # (B, C, E, N)
        if keep is not None:
            a_c *= keep[:, rows, None, None].to(a_c.dtype)
        b_c = du[:, rows, :, None] * b_in[:, rows, None, :]
        if h is not None:  # the carried state enters through the chunk's first token
            b_c[:, 0].addcmul_(a_c[:, 0], h)
        h_c = _odd_even_scan(a_c, b_c)
        ys.append(torch.matmul(h_c, c_out[:, rows, :, None]).squeeze(-1))
        if keep_all:
            a_all.append(a_c)
            h_all.append(h_c)
        h = h_c[:, -1]
    assert h is not None
    y = ys[0] if len(ys) == 1 else torch.cat(ys, dim=1)
    if not keep_all:
        return y, h, None, None
    if len(a_all) == 1:
        return y, h, a_all[0], h_all[0]
    return y, h, torch.cat(a_all, dim=1), torch.cat(h_all, dim=1)


def selective_scan(delta: Tensor, u: Tensor, a_mat: Tensor, b_in: Tensor, c_out: Tensor, h0: Tensor | None,
                   ctx: ForwardContext, chunk_size: int) -> tuple[Tensor, Tensor]:  # fmt: skip
    """Mamba's selective scan: y_t = C_t · h_t with h_t = exp(Δ_t A) ⊙ h_{t-1} + (Δ_t u_t) B_t^T, from h_{-1} =
    ``h0`` (zeros when None); returns (y (B, T, E), h_{T-1} (B, E, N)).

    delta, u: (B, T, E); a_mat: (E, N); b_in, c_out: (B, T, N). An episode start restarts h (a_t = 0); a padded
    token has Δ_t = 0, so a_t = 1 and nothing is added (the state passes through). Real inputs only.
    """
    if not ctx.all_valid:
        delta = delta * ctx.valid[..., None].to(delta.dtype)
    cut = restarts(ctx)
    keep = None if cut is None else ~cut
    inputs = (delta, u, a_mat, b_in, c_out, h0)
    if torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in inputs):
        y, last = _SelectiveScan.apply(*inputs, keep, chunk_size)
        return y, last
    y, last, _, _ = _selective_chunks(*inputs, keep, chunk_size, False)
    return y, last


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
