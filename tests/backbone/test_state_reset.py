"""``State.reset`` (masked arithmetic, no host sync) equals the elementwise definition ``zero_rows`` bit for bit,
except the XL memory's hidden states, which a reset leaves in place (only validity and positions are cleared):
the backbone's outputs and gradients are then bit for bit those of a zeroed memory."""

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
        want.memory.h = h  # kept: invalid columns are never attended (test below)
        got_leaves, want_leaves = leaves(got), leaves(want)
        assert len(got_leaves) == len(want_leaves) == 8
        for a, b in zip(got_leaves, want_leaves):
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
            if a.is_floating_point():
                assert torch.equal(a.signbit(), b.signbit())  # +0 fills, -0 kept where kept
        assert got.memory.h is h and not got.memory.valid[mask].any() and not got.memory.pos[mask].any()
    h_before = h.clone()
    state.reset(torch.ones(5, dtype=torch.bool))
    assert torch.equal(h, h_before)  # out of place: the caller's state is untouched
    unchanged = state.reset(torch.zeros(5, dtype=torch.bool))  # no reset: equal values (masked arithmetic, no
    for a, b in zip(leaves(unchanged), leaves(state)):  # data-dependent shortcut)
        assert torch.equal(a, b)


def test_xl_reset_keeping_hidden_states_equals_zeroing_them_bit_for_bit() -> None:
    """Outputs and parameter gradients after a reset are identical (``torch.equal``) whether the reset rows'
    hidden states are kept (what ``XLMemoryState.reset`` does) or zeroed; and differ from no reset at all."""
    from rl_transformers.backbone import Backbone
    from rl_transformers.policies import gtrxl_backbone

    torch.manual_seed(0)
    bb = Backbone(gtrxl_backbone(16, 2, 2, mem_len=5).replace(attention_options={"max_cache": 5})).double()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        state = bb(torch.randn(4, 7, 16, generator=g, dtype=torch.float64)).state
    x = torch.randn(4, 3, 16, generator=g, dtype=torch.float64)
    mask = torch.tensor([True, False, True, False])
    kept = state.reset(mask)
    zeroed = kept.map(lambda t: t)
    zeroed.memory.h = zero_rows(state.memory.h, mask)
    assert kept.memory.h[mask].abs().min() > 0  # the kept rows really hold old, non-zero states

    def run(s: BackboneState) -> list[torch.Tensor]:
        bb.zero_grad(set_to_none=True)
        y = bb(x, state=s).y
        y.pow(2).sum().backward()
        return [y.detach(), *(p.grad for p in bb.parameters() if p.grad is not None)]

    a, b, c = run(kept), run(zeroed), run(state)
    assert len(a) == len(b) > 10
    assert all(torch.equal(u, w) for u, w in zip(a, b))
    assert not torch.equal(a[0], c[0])  # the reset matters
