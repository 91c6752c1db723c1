"""Reusable checks of the docs/design.md invariants, used by the generic registry test and by the family tests.

Every helper builds a tiny backbone in float64 (so tolerances are tight) and compares two ways of computing
the same thing: chunked vs full run, reset vs fresh state, perturbed vs original input.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rl_transformers.backbone import Backbone, BackboneConfig

TINY = dict(d_model=16, n_layers=2, n_heads=2)


def tiny_backbone(seed: int = 0, **overrides: object) -> Backbone:
    torch.manual_seed(seed)
    cfg = BackboneConfig(**{**TINY, **overrides})  # type: ignore[arg-type]
    return Backbone(cfg).double().eval()


def run_chunks(bb: Backbone, x: Tensor, sizes: list[int], state=None) -> tuple[Tensor, object]:
    """Run x (B, T, d) through ``bb`` in consecutive chunks of the given sizes, carrying the state."""
    assert sum(sizes) == x.shape[1]
    state = bb.init_state(x.shape[0]) if state is None else state
    ys, start = [], 0
    for size in sizes:
        out = bb(x[:, start : start + size], state=state)
        ys.append(out.y)
        state = out.state
        start += size
    return torch.cat(ys, dim=1), state


def chunkings(length: int, seed: int = 0) -> list[list[int]]:
    """One-token-at-a-time, halves, and a random split of ``length``."""
    g = torch.Generator().manual_seed(seed)
    cuts = sorted(torch.randperm(length - 1, generator=g)[: max(1, length // 4)].add(1).tolist())
    rand = [b - a for a, b in zip([0, *cuts], [*cuts, length])]
    return [[1] * length, [length // 2, length - length // 2], rand]


def check_streaming(bb: Backbone, length: int = 12, batch: int = 2, atol: float = 1e-9) -> None:
    """Chunked runs with carried state == one full pass, for every chunking."""
    x = torch.randn(batch, length, bb.cfg.d_model, dtype=torch.float64)
    with torch.no_grad():
        full = bb(x).y
        for sizes in chunkings(length):
            got, _ = run_chunks(bb, x, sizes)
            torch.testing.assert_close(
                got, full, atol=atol, rtol=0, msg=lambda m, s=sizes: f"chunks {s}: {m}"
            )


def check_causal(bb: Backbone, length: int = 10, t: int = 6, atol: float = 1e-12) -> None:
    """Perturbing token t changes no output before t."""
    x = torch.randn(2, length, bb.cfg.d_model, dtype=torch.float64)
    x2 = x.clone()
    x2[:, t] += torch.randn_like(x2[:, t])
    with torch.no_grad():
        y1, y2 = bb(x).y, bb(x2).y
    torch.testing.assert_close(y1[:, :t], y2[:, :t], atol=atol, rtol=0)
    assert not torch.allclose(y1[:, t:], y2[:, t:]), "perturbation had no effect at or after t"


def check_reset(bb: Backbone, prefix: int = 5, length: int = 6, atol: float = 1e-9) -> None:
    """Resetting row b == a fresh state for row b; other rows untouched."""
    d = bb.cfg.d_model
    past = torch.randn(3, prefix, d, dtype=torch.float64)
    x = torch.randn(3, length, d, dtype=torch.float64)
    with torch.no_grad():
        state = bb(past).state
        reset = torch.tensor([False, True, False])
        got = bb(x, state=state, reset=reset).y
        fresh = bb(x[1:2]).y
        kept = bb(x, state=state).y
    torch.testing.assert_close(got[1:2], fresh, atol=atol, rtol=0)
    torch.testing.assert_close(got[[0, 2]], kept[[0, 2]], atol=atol, rtol=0)


def check_gradients(bb: Backbone, length: int = 8) -> None:
    """Backward runs, every trainable parameter that takes part gets a finite gradient, none NaN."""
    bb.train()
    x = torch.randn(2, length, bb.cfg.d_model, dtype=torch.float64, requires_grad=True)
    out = bb(x)
    loss = out.y.pow(2).mean() + sum(
        (v.sum() for v in out.aux_losses.values()), torch.zeros((), dtype=x.dtype)
    )
    loss.backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    assert x.grad.abs().sum() > 0
    for name, p in bb.named_parameters():
        if p.grad is not None:
            assert torch.isfinite(p.grad).all(), f"non-finite gradient in {name}"
    bb.eval()


def check_state_ops(bb: Backbone) -> None:
    """index_select / detach / reset keep the structure and slice rows."""
    x = torch.randn(3, 4, bb.cfg.d_model, dtype=torch.float64)
    state = bb(x).state
    picked = state.index_select(torch.tensor([2, 0]))
    assert picked.batch_size == 2
    with torch.no_grad():
        y_pick = bb(x[[2, 0], :2], state=picked).y
        y_all = bb(x[:, :2], state=state).y
    torch.testing.assert_close(y_pick, y_all[[2, 0]], atol=1e-9, rtol=0)
    state.detach()
