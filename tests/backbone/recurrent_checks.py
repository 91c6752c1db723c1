"""Checks shared by the tests of the recurrent mixers (``lru``, ``mingru``, ``mamba``, ``ffm``, ``fox``).

Each check drives one mixer module directly (float64) the way ``Backbone.forward`` does: a window with episode
starts inside it (``ForwardContext.segment``), or one token per call with ``reset`` at the starts. The test of
each entry supplies a naive reference written from the paper's formula (a Python loop over tokens) and calls
:func:`check_all`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from rl_transformers.backbone import Backbone, BackboneConfig, registry
from rl_transformers.backbone.context import ForwardContext

D_MODEL = 8
Reference = Callable[[Any, Tensor, Tensor], Tensor]
"""naive(mixer, x (B, T, d), starts (B, T) bool) -> y (B, T, d), from a fresh state."""


def make_mixer(name: str, seed: int = 0, **options: Any) -> Any:
    """The ``name`` mixer of a d_model = 8, 2-head config, in float64."""
    torch.manual_seed(seed)
    cfg = BackboneConfig(
        d_model=D_MODEL, n_layers=1, n_heads=2, attention=name, position="none", attention_options=options
    )
    position = registry.get("position", "none").cls(cfg, cfg.options("position"))
    cls = registry.get("attention", name).cls
    return cls(cfg, cfg.options("attention"), position, 0).double()


def context(starts: Tensor | None, t: int, b: int, valid: Tensor | None = None) -> ForwardContext:
    pos = torch.arange(t)[None].expand(b, t)
    segment = None if starts is None else starts.long().cumsum(1)
    if valid is None:
        return ForwardContext(pos=pos, valid=torch.ones(b, t, dtype=torch.bool), causal=True, all_valid=True,
                              segment=segment)  # fmt: skip
    return ForwardContext(pos=pos, valid=valid, causal=True, segment=segment)


def parallel(m: Any, x: Tensor, starts: Tensor | None = None, state: Any = None) -> tuple[Tensor, Any]:
    """One pass over the window, rows restarting at ``starts`` (B, T) bool."""
    b, t, _ = x.shape
    state = m.init_state(b, x.device, x.dtype) if state is None else state
    if starts is not None:
        state = state.reset(starts[:, 0])
    return m(x, context(starts, t, b), state)


def stepwise(m: Any, x: Tensor, starts: Tensor | None = None, state: Any = None) -> tuple[Tensor, Any]:
    """One token per call, the state reset where an episode starts."""
    b, t, _ = x.shape
    state = m.init_state(b, x.device, x.dtype) if state is None else state
    ys = []
    for i in range(t):
        if starts is not None:
            state = state.reset(starts[:, i])
        y, state = m(x[:, i : i + 1], context(None, 1, b), state)
        ys.append(y)
    return torch.cat(ys, dim=1), state


def random_starts(b: int, t: int, seed: int = 1) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    starts = torch.rand(b, t, generator=g) < 0.2
    starts[0, t // 2] = True  # a restart inside the first chunk
    starts[1] = False  # a row that never restarts
    starts[-1, 1] = starts[-1, 2] = True  # a one-token episode
    return starts


def tag(label: str) -> Callable[[str], str]:
    """An ``assert_close`` message that names the case."""
    return lambda message: f"{label}: {message}"


def grads(m: Any, x: Tensor, y: Tensor, w: Tensor) -> list[Tensor]:
    params = [p for p in m.parameters() if p.requires_grad]
    out = torch.autograd.grad((y * w).sum(), [x, *params], allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for g, p in zip(out, [x, *params])]


def check_reference(m: Any, naive: Reference, b: int = 3, t: int = 11, tol: float = 1e-10) -> None:
    """parallel == token by token == naive reference, values and gradients (inputs and every parameter)."""
    x = torch.randn(b, t, D_MODEL, dtype=torch.float64, requires_grad=True)
    starts = random_starts(b, t)
    w = torch.randn(b, t, D_MODEL, dtype=torch.float64)
    want = naive(m, x, starts)
    want_g = grads(m, x, want, w)
    for run in (parallel, stepwise):
        got, _ = run(m, x, starts)
        torch.testing.assert_close(got, want, rtol=tol, atol=tol, msg=tag(f"{run.__name__}"))
        for i, (g, wg) in enumerate(zip(grads(m, x, got, w), want_g)):
            torch.testing.assert_close(g, wg, rtol=tol, atol=tol, msg=tag(f"{run.__name__} {i}"))


def check_chunk_sizes(m: Any, sizes: tuple[int, ...] = (1, 2, 3, 5, 64), tol: float = 1e-10) -> None:
    """The scan's chunk size schedules the work only."""
    x = torch.randn(3, 13, D_MODEL, dtype=torch.float64)
    starts = random_starts(3, 13)
    base = m.options
    with torch.no_grad():
        outs = []
        for size in sizes:
            m.options = dataclasses.replace(base, chunk_size=size)
            outs.append(parallel(m, x, starts)[0])
    m.options = base
    for size, y in zip(sizes[1:], outs[1:]):
        torch.testing.assert_close(y, outs[0], rtol=tol, atol=tol, msg=tag(f"chunk {size}"))


def check_carried_state(m: Any, tol: float = 1e-10, same_tensors: bool = True) -> None:
    """Chunks with a carried state (restarts inside them) == one pass: the outputs, the state's tensors
    (``same_tensors``; a KV cache may differ in columns it no longer reads) and the next chunk from either state."""
    x = torch.randn(3, 16, D_MODEL, dtype=torch.float64)
    starts = random_starts(3, 16)
    with torch.no_grad():
        want, want_state = parallel(m, x[:, :12], starts[:, :12])
        state, ys = None, []
        for lo, hi in ((0, 5), (5, 6), (6, 12)):
            y, state = parallel(m, x[:, lo:hi], starts[:, lo:hi], state)
            ys.append(y)
        nxt = parallel(m, x[:, 12:], starts[:, 12:], state)[0]
        want_nxt = parallel(m, x[:, 12:], starts[:, 12:], want_state)[0]
    torch.testing.assert_close(torch.cat(ys, 1), want, rtol=tol, atol=tol)
    torch.testing.assert_close(nxt, want_nxt, rtol=tol, atol=tol, msg=tag("next chunk"))
    if not same_tensors:
        return
    for f in dataclasses.fields(want_state):
        got_f, want_f = getattr(state, f.name), getattr(want_state, f.name)
        if isinstance(want_f, Tensor):
            torch.testing.assert_close(got_f, want_f, rtol=tol, atol=tol, msg=tag(f.name))


def check_reset_rows(m: Any) -> None:
    """``reset`` zeroes exactly the reset rows of every tensor of the state."""
    with torch.no_grad():
        _, state = parallel(m, torch.randn(4, 6, D_MODEL, dtype=torch.float64))
    mask = torch.tensor([False, True, False, True])
    cleared = state.reset(mask)
    for f in dataclasses.fields(state):
        before, after = getattr(state, f.name), getattr(cleared, f.name)
        if not isinstance(before, Tensor):
            continue
        assert (after[mask] == 0).all(), f.name
        assert torch.equal(after[~mask], before[~mask]), f.name
        assert before.numel() == 0 or bool(before[mask].ne(0).any()), (
            f"{f.name}: the state held nothing to clear"
        )


def check_reset_cuts(m: Any, t: int = 10, cut: int = 4) -> None:
    """With an episode start at ``cut``, outputs from ``cut`` on do not depend on inputs before it (gradient
    exactly zero); without the start they do."""
    x = torch.randn(2, t, D_MODEL, dtype=torch.float64, requires_grad=True)
    starts = torch.zeros(2, t, dtype=torch.bool)
    starts[:, cut] = True
    y, _ = parallel(m, x, starts)
    (g,) = torch.autograd.grad(y[:, cut:].sum(), x)
    assert torch.equal(g[:, :cut], torch.zeros_like(g[:, :cut])), "information crossed the reset"
    y, _ = parallel(m, x, None)
    (g,) = torch.autograd.grad(y[:, cut:].sum(), x)
    assert (g[:, :cut].abs().sum(-1) > 0).all(), "without a reset the past should matter"


def check_padding(m: Any, tol: float = 1e-10) -> None:
    """Masked padding changes nothing for the real tokens: left padding from a fresh state, and right padding
    followed by a next chunk from the returned state (a padded token leaves the state as it is)."""
    x, nxt = torch.randn(2, 6, D_MODEL, dtype=torch.float64), torch.randn(2, 3, D_MODEL, dtype=torch.float64)
    pad = torch.randn(2, 2, D_MODEL, dtype=torch.float64)
    real, fake = torch.ones(2, 6, dtype=torch.bool), torch.zeros(2, 2, dtype=torch.bool)
    with torch.no_grad():
        y, state = parallel(m, x)
        want_next = parallel(m, nxt, None, state)[0]
        for valid, xs, cut in (
            (torch.cat([fake, real], 1), [pad, x], slice(2, 8)),
            (torch.cat([real, fake], 1), [x, pad], slice(0, 6)),
        ):
            y_pad, state_pad = m(
                torch.cat(xs, 1), context(None, 8, 2, valid), m.init_state(2, None, torch.float64)
            )
            torch.testing.assert_close(y_pad[:, cut], y, rtol=tol, atol=tol)
            got_next = parallel(m, nxt, None, state_pad)[0]
            torch.testing.assert_close(got_next, want_next, rtol=tol, atol=tol, msg=tag("after padding"))


def check_all(m: Any, naive: Reference) -> None:
    check_reference(m, naive)
    check_padding(m)
    check_chunk_sizes(m)
    check_carried_state(m)
    check_reset_rows(m)
    check_reset_cuts(m)


def check_backbone(name: str, **options: Any) -> None:
    """Inside a 2-layer backbone: a window with episode starts (``Backbone.forward(starts=...)``) from a carried
    state == one token per call with ``reset`` at the starts, outputs and the next chunk; and under bfloat16
    the state's floating tensors stay float32 (a KV cache's keys / values excepted)."""
    torch.manual_seed(0)
    cfg = BackboneConfig(d_model=16, n_layers=2, n_heads=2, attention=name, position="none",
                         attention_options=options)  # fmt: skip
    bb = Backbone(cfg).double().eval()
    assert bb.segments_unsupported is None
    g = torch.Generator().manual_seed(2)
    warm, x, nxt = (torch.randn(3, n, 16, generator=g, dtype=torch.float64) for n in (5, 10, 4))
    starts = random_starts(3, 10)
    with torch.no_grad():
        state = bb(warm).state
        out = bb(x, state=state, starts=starts)
        ys, s = [], state
        for t in range(10):
            step = bb(x[:, t : t + 1], state=s, reset=starts[:, t])
            ys.append(step.y)
            s = step.state
        torch.testing.assert_close(out.y, torch.cat(ys, 1), rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(bb(nxt, state=out.state).y, bb(nxt, state=s).y, rtol=1e-10, atol=1e-10)
        half = Backbone(cfg).to(torch.bfloat16)
        layers = half(x[:, :3].to(torch.bfloat16)).state.layers
    for layer in layers:
        for f in dataclasses.fields(layer):
            value = getattr(layer, f.name)
            if isinstance(value, Tensor) and value.is_floating_point() and f.name not in ("k", "v"):
                assert value.dtype == torch.float32, f"{f.name}: {value.dtype}"
