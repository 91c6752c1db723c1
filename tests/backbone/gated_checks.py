"""Shared checks of the matrix-state recurrent mixers (retnet, gla, mamba2, mlstm, deltanet, gated_deltanet), all
in float64.

Each entry's test file supplies ``naive(att, x, starts)``: the paper's recurrence written as a plain loop over
tokens with the layer's own weights, the state emptied where ``starts`` (B, T) is True. The checks compare the
layer's chunked forward with it (values and autograd gradients of the input and of every parameter), across
chunk sizes, against the token-by-token stream with resets, and test the state's ``reset`` and that a restart
cuts every gradient path into the past.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from rl_transformers.backbone import Backbone, BackboneConfig
from rl_transformers.backbone.context import ForwardContext

F64 = torch.float64
B, T, D_MODEL = 3, 11, 16
Naive = Callable[[Any, Tensor, Tensor], Tensor]


def backbone(name: str, seed: int = 0, n_layers: int = 1, **options: Any) -> Backbone:
    torch.manual_seed(seed)
    cfg = BackboneConfig(
        d_model=D_MODEL, n_layers=n_layers, n_heads=2, position="none", attention=name,
        attention_options=options,
    )  # fmt: skip
    return Backbone(cfg).double().eval()


def layer(name: str, seed: int = 0, **options: Any) -> Any:
    """The attention module of a one-layer float64 backbone."""
    return backbone(name, seed, **options).depth.blocks[0].attention


def random_starts(b: int = B, t: int = T, seed: int = 0) -> Tensor:
    """(B, T) bool restarts at random positions (none at the first token; row 0 never restarts)."""
    g = torch.Generator().manual_seed(seed)
    starts = torch.rand(b, t, generator=g) < 0.3
    starts[:, 0] = False
    starts[0] = False
    starts[-1, 2] = starts[-1, 3] = True  # a one-token episode
    return starts


def run(att: Any, x: Tensor, starts: Tensor | None = None, state: Any = None) -> tuple[Tensor, Any]:
    """The layer's forward over x (B, T, d) in one call, rows restarting where ``starts`` is True."""
    b, t, _ = x.shape
    segment = None if starts is None else starts.long().cumsum(1)
    ctx = ForwardContext(
        pos=torch.arange(t).expand(b, t), valid=torch.ones(b, t, dtype=torch.bool), causal=True,
        all_valid=True, segment=segment,
    )  # fmt: skip
    return att(x, ctx, state)


def stream(att: Any, x: Tensor, starts: Tensor, state: Any) -> tuple[Tensor, Any]:
    """One token per call, the state reset where ``starts`` is True."""
    ys = []
    for i in range(x.shape[1]):
        y, state = run(att, x[:, i : i + 1], state=state.reset(starts[:, i]))
        ys.append(y)
    return torch.cat(ys, dim=1), state


def label(prefix: str) -> Callable[[str], str]:
    """An ``assert_close`` message that names what differs."""
    return lambda message: f"{prefix}: {message}"


def _grads(att: Any, fn: Callable[[Tensor], Tensor], x: Tensor, w: Tensor) -> list[Tensor]:
    x = x.clone().requires_grad_(True)
    params = list(att.parameters())
    grads = torch.autograd.grad((fn(x) * w).sum(), [x, *params], allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for g, p in zip(grads, [x, *params])]


def check_naive(att: Any, naive: Naive, seed: int = 0, scale: float = 1.0) -> None:
    """Chunked forward == the paper's loop, values and gradients, with restarts at random positions."""
    g = torch.Generator().manual_seed(seed)
    x = scale * torch.randn(B, T, D_MODEL, generator=g, dtype=F64)
    w = torch.randn(B, T, D_MODEL, generator=g, dtype=F64)
    starts = random_starts(seed=seed)
    got, want = run(att, x, starts)[0], naive(att, x, starts)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    assert not torch.allclose(got, naive(att, x, torch.zeros_like(starts)), atol=1e-6), (
        "starts have no effect"
    )
    ours = _grads(att, lambda x_: run(att, x_, starts)[0], x, w)
    theirs = _grads(att, lambda x_: naive(att, x_, starts), x, w)
    names = ["x", *(n for n, _ in att.named_parameters())]
    for name, a, b in zip(names, ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10, msg=label(f"gradient of {name}"))
    assert any(a.abs().sum() > 0 for a in ours[1:]), "no parameter gradient"


def check_chunk_sizes(name: str, sizes: tuple[int, ...] = (1, 2, 3, 4, 64), **options: Any) -> None:
    """The chunk size is a schedule: the outputs and the final state do not depend on it."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(B, T, D_MODEL, generator=g, dtype=F64)
    starts = random_starts(seed=3)
    results = [
        run(layer(name, chunk_size=c, **options), x, starts, _warm(layer(name, **options), x)) for c in sizes
    ]
    for (y, s), c in zip(results[1:], sizes[1:]):
        torch.testing.assert_close(y, results[0][0], rtol=1e-10, atol=1e-10, msg=label(f"C={c}"))
        _same_states(s, results[0][1])


def _warm(att: Any, x: Tensor) -> Any:
    """A non-empty state: the layer run over a prefix."""
    with torch.no_grad():
        return run(att, torch.flip(x[:, :5], [1]), state=att.init_state(x.shape[0], None, F64))[1]


def _tensors(state: Any) -> list[Tensor]:
    return [getattr(state, f) for f in state.__dataclass_fields__]


def _comparable(state: Any) -> list[Tensor]:
    """What a state represents: its tensors, or ``represented()`` for states with a stabiliser (mLSTM)."""
    rep = getattr(state, "represented", None)
    return list(rep()) if rep is not None else _tensors(state)


def _same_states(a: Any, b: Any) -> None:
    for x, y in zip(_comparable(a), _comparable(b), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-9, atol=1e-10)


def check_stream(name: str, **options: Any) -> None:
    """From a carried state: one pass with restarts == one token at a time with resets; same final state."""
    att = layer(name, **options)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(B, T, D_MODEL, generator=g, dtype=F64)
    starts = random_starts(seed=5)
    with torch.no_grad():
        state = _warm(att, x)
        y, s = run(att, x, starts, state)
        y_ref, s_ref = stream(att, x, starts, state)
        torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
        _same_states(s, s_ref)
        # the returned state continues as the stream's does
        nxt = torch.randn(B, 4, D_MODEL, generator=g, dtype=F64)
        torch.testing.assert_close(
            run(att, nxt, state=s)[0], run(att, nxt, state=s_ref)[0], rtol=1e-10, atol=1e-10
        )


def check_reset_rows(name: str, **options: Any) -> None:
    """``reset(mask)`` empties exactly the masked rows: they equal a fresh state, the others are untouched."""
    att = layer(name, **options)
    x = torch.randn(B, 6, D_MODEL, dtype=F64)
    state = _warm(att, x)
    mask = torch.tensor([False, True, True])
    fresh = att.init_state(B, None, F64)
    reset = state.reset(mask)
    for r, s, f in zip(_tensors(reset), _tensors(state), _tensors(fresh)):
        assert torch.equal(r[mask], f[mask])
        assert torch.equal(r[~mask], s[~mask])
        assert not torch.equal(s[mask], f[mask]), "the warm state was empty"


def check_reset_cuts(name: str, **options: Any) -> None:
    """With a restart at t, no output at or after t depends on an input before t (the gradient is exactly zero,
    through two layers); without it, they do."""
    bb = backbone(name, n_layers=2, **options)
    x = torch.randn(2, T, D_MODEL, dtype=F64, requires_grad=True)
    t = 6
    starts = torch.zeros(2, T, dtype=torch.bool)
    starts[:, t] = True
    for restart, zero in ((starts, True), (None, False)):
        (grad,) = torch.autograd.grad(bb(x, starts=restart).y[:, t:].pow(2).sum(), x)
        past = grad[:, :t].abs().max()
        assert (past == 0) if zero else (past > 1e-6), (restart is not None, past)
        assert grad[:, t:].abs().max() > 0


def check_backbone_starts(name: str, **options: Any) -> None:
    """Through a two-layer backbone from a carried state: ``forward(starts=...)`` == one token per call with
    ``reset`` at the starts (outputs, and the returned state continues alike)."""
    bb = backbone(name, n_layers=2, **options)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(B, T, D_MODEL, generator=g, dtype=F64)
    starts = random_starts(seed=7)
    starts[1, 0] = True  # a restart at the window's first token
    with torch.no_grad():
        state = bb(torch.randn(B, 5, D_MODEL, generator=g, dtype=F64)).state
        out = bb(x, state=state, starts=starts)
        ys, s = [], state
        for i in range(T):
            step = bb(x[:, i : i + 1], state=s, reset=starts[:, i])
            ys.append(step.y)
            s = step.state
        torch.testing.assert_close(out.y, torch.cat(ys, 1), rtol=1e-10, atol=1e-10)
        nxt = torch.randn(B, 3, D_MODEL, generator=g, dtype=F64)
        torch.testing.assert_close(bb(nxt, state=out.state).y, bb(nxt, state=s).y, rtol=1e-10, atol=1e-10)


def check_low_precision(name: str, **options: Any) -> None:
    """bfloat16 weights and inputs: the state stays float32, outputs are finite and near the float32 run."""
    bb = backbone(name, n_layers=2, **options).float()
    x = torch.randn(2, 40, D_MODEL)
    with torch.no_grad():
        want = bb(x).y
        half = bb.to(torch.bfloat16)
        out = half(x.to(torch.bfloat16))
        assert out.y.dtype == torch.bfloat16 and torch.isfinite(out.y).all()
        assert all(t.dtype == torch.float32 for layer in out.state.layers for t in _tensors(layer))
        step = half(x[:, :1].to(torch.bfloat16), state=out.state)
        assert torch.isfinite(step.y).all()
    assert (out.y.float() - want).abs().max() < 0.1 * want.abs().max()
