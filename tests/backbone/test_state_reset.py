"""``State.reset`` (masked arithmetic, no host sync) equals the elementwise definition ``zero_rows`` bit for bit."""

from __future__ import annotations

import torch

from rl_transformers.backbone.memory.xl import XLMemoryState
from rl_transformers.backbone.state import BackboneState, KVCache, zero_rows


def leaves(state: BackboneState) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    state.map(lambda t: out.append(t) or t)
    return out


def test_reset_equals_zero_rows_for_every_dtype_and_layout() -> None:
    g = torch.Generator().manual_seed(0)
    wide = torch.randn(5, 2, 7, 3, generator=g)
    h = wide[:, :, 1:]  # a non-contiguous narrowed view, like the XL memory window
    h[0, 0, 0, 0] = -0.0
    kv = KVCache(
        k=torch.randn(5, 2, 4, 3, generator=g).transpose(2, 3),
        v=torch.randn(5, 2, 4, 3, generator=g, dtype=torch.float64),
        pos=torch.randint(0, 9, (5, 4), generator=g),
        valid=torch.rand(5, 4, generator=g) > 0.3,
    )
    state = BackboneState(
        pos=torch.randint(1, 9, (5,), generator=g),
        layers=(kv, None),
        memory=XLMemoryState(
            h=h, pos=torch.randint(0, 9, (5, 6), generator=g), valid=torch.ones(5, 6, dtype=torch.bool)
        ),
    )
    for mask in (torch.tensor([True, False, False, True, False]), torch.ones(5, dtype=torch.bool)):
        got = state.reset(mask)
        want = state.map(lambda t, m=mask: zero_rows(t, m))
        got_leaves, want_leaves = leaves(got), leaves(want)
        assert len(got_leaves) == len(want_leaves) == 8
        for a, b in zip(got_leaves, want_leaves):
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
            if a.is_floating_point():
                assert torch.equal(a.signbit(), b.signbit())  # +0 fills, -0 kept where kept
        assert torch.equal(got.memory.h[~mask], h[~mask]) and not got.memory.h[mask].any()
    h_before = h.clone()
    state.reset(torch.ones(5, dtype=torch.bool))
    assert torch.equal(h, h_before)  # out of place: the caller's state is untouched
    unchanged = state.reset(torch.zeros(5, dtype=torch.bool))  # no reset: equal values (masked arithmetic, no
    for a, b in zip(leaves(unchanged), leaves(state)):  # data-dependent shortcut, issue 26)
        assert torch.equal(a, b)
