"""``xl`` memory: chunked runs == one pass under the banded mask "seg_start(t) - M <= j <= t", built explicitly.

The one-layer case is checked against ``reference_attention`` on the layer's own projections (RoPE rotation
written out here); multi-layer runs against the model's own blocks with every attention swapped for a dense
masked softmax (the same band at every layer). Also: M >= L == plain causal attention, reset row == fresh row,
positions continue across segments, absolute schemes are refused, memory is stop-gradient (the training window
is the chunk, a separate knob from the memory length M).
"""

from __future__ import annotations

import types

import pytest
import torch
from torch import Tensor

from rl_transformers.backbone import Backbone, available, registry
from rl_transformers.backbone.config import BackboneConfig
from rl_transformers.backbone.reference import reference_attention
from tests.backbone import invariants as inv

D_MODEL = 16


def band_mask(sizes: list[int], mem_len: int) -> Tensor:
    """(L, L) bool: key j visible from query t iff seg_start(t) - M <= j <= t (explicit loops)."""
    length = sum(sizes)
    mask = torch.zeros(length, length, dtype=torch.bool)
    start = 0
    for size in sizes:
        for t in range(start, start + size):
            for j in range(length):
                mask[t, j] = start - mem_len <= j <= t
        start += size
    return mask


def rope(x: Tensor, pos: Tensor, base: float = 10000.0) -> Tensor:
    """Rotate pairs (2i, 2i+1) of x (..., T, D) by angle p·base^(-2i/D), written out independently."""
    d = x.shape[-1]
    out = torch.empty_like(x)
    for i in range(d // 2):
        angle = pos.double() * base ** (-2 * i / d)
        c, s = torch.cos(angle), torch.sin(angle)
        a, b = x[..., 2 * i], x[..., 2 * i + 1]
        out[..., 2 * i] = a * c - b * s
        out[..., 2 * i + 1] = a * s + b * c
    return out


def dense_forward(bb: Backbone, x: Tensor, mask: Tensor) -> Tensor:
    """bb's own blocks, every attention replaced by a dense softmax over the whole sequence restricted by ``mask``."""

    def dense(att, x_in: Tensor, ctx, state=None):  # type: ignore[no-untyped-def]
        ctx.attention_inputs.append(x_in)
        pos = ctx.pos
        q = bb.position.transform_q(att.split_heads(att.q_proj(x_in)), pos, att.layer)
        k = bb.position.transform_k(att.split_heads(att.k_proj(x_in)), pos, att.layer)
        v = att.split_heads(att.v_proj(x_in))
        logits = bb.position.logits(q, k, pos, pos, att.layer).masked_fill(~mask, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        out = probs @ v
        extra = bb.position.value_term(probs, pos, pos, att.layer)
        out = out if extra is None else out + extra
        return att.o_proj(att.merge_heads(out)), state

    attentions = [block.attention for block in bb.depth.blocks]
    for att in attentions:
        att.forward = types.MethodType(dense, att)
    try:
        with torch.no_grad():
            return bb(x).y
    finally:
        for att in attentions:
            del att.forward


def xl(mem_len: int, **overrides: object) -> Backbone:
    return inv.tiny_backbone(memory="xl", memory_options={"mem_len": mem_len}, **overrides)


SPLITS = [[1] * 10, [4, 6], [3, 2, 5], [7, 1, 2]]


@pytest.mark.parametrize("mem_len", [1, 3, 6])
@pytest.mark.parametrize("sizes", SPLITS, ids=["ones", "4-6", "3-2-5", "7-1-2"])
def test_one_layer_equals_reference_with_band_mask(mem_len: int, sizes: list[int]) -> None:
    bb = xl(mem_len, n_layers=1, position="rope")
    block = bb.depth.blocks[0]
    att = block.attention
    x = torch.randn(2, sum(sizes), D_MODEL, dtype=torch.float64)
    with torch.no_grad():
        got, _ = inv.run_chunks(bb, x, sizes)
        h = block.norm1(x)
        pos = torch.arange(x.shape[1])
        q = rope(att.split_heads(att.q_proj(h)), pos)
        k = rope(att.split_heads(att.k_proj(h)), pos)
        v = att.split_heads(att.v_proj(h))
        a = reference_attention(q, k, v, mask=band_mask(sizes, mem_len))
        y = x + att.o_proj(att.merge_heads(a))
        y = bb.final_norm(y + block.ffn(block.norm2(y)))
    torch.testing.assert_close(got, y, atol=1e-10, rtol=0)


POSITIONS = ["xl_relative", "rope", "alibi", "t5"]


@pytest.mark.parametrize("block", ["pre_ln", "gtrxl"])
@pytest.mark.parametrize("position", POSITIONS)
def test_multilayer_chunks_equal_dense_band(position: str, block: str) -> None:
    if position not in available()["position"]:
        pytest.skip(f"position {position!r} is not registered yet")
    bb = xl(3, n_layers=3, position=position, block=block)
    x = torch.randn(2, 11, D_MODEL, dtype=torch.float64)
    for sizes in ([1] * 11, [5, 6], [2, 4, 1, 4]):
        with torch.no_grad():
            got, _ = inv.run_chunks(bb, x, sizes)
        ref = dense_forward(bb, x, band_mask(sizes, 3))
        torch.testing.assert_close(got, ref, atol=1e-10, rtol=0, msg=lambda m, s=sizes: f"chunks {s}: {m}")


def test_band_is_not_trivial() -> None:
    """The band matters: a memory of 1 and of 3 give different outputs (the test above can fail)."""
    x = torch.randn(1, 8, D_MODEL, dtype=torch.float64)
    with torch.no_grad():
        short, _ = inv.run_chunks(xl(1), x, [4, 4])
        long, _ = inv.run_chunks(xl(3), x, [4, 4])
    torch.testing.assert_close(short[:, :4], long[:, :4], atol=1e-12, rtol=0)
    assert (short[:, 4:] - long[:, 4:]).abs().max() > 1e-4


@pytest.mark.parametrize("position", ["rope", "alibi", "t5"])
def test_memory_covering_sequence_equals_causal_attention(position: str) -> None:
    if position not in available()["position"]:
        pytest.skip(f"position {position!r} is not registered yet")
    bb = xl(12, position=position)
    plain = inv.tiny_backbone(position=position)
    plain.load_state_dict(bb.state_dict())
    x = torch.randn(2, 12, D_MODEL, dtype=torch.float64)
    with torch.no_grad():
        full = plain(x).y
        for sizes in inv.chunkings(12):
            got, _ = inv.run_chunks(bb, x, sizes)
            torch.testing.assert_close(got, full, atol=1e-10, rtol=0)


def test_reset_row_equals_fresh_with_full_memory() -> None:
    bb = xl(3)
    inv.check_reset(bb, prefix=7, length=5)
    inv.check_state_ops(bb)
    state = bb(torch.randn(3, 7, D_MODEL, dtype=torch.float64)).state
    cleared = state.reset(torch.tensor([False, True, False])).memory
    assert not cleared.valid[1].any() and cleared.valid[[0, 2]].all()


def test_positions_continue_across_segments() -> None:
    bb = xl(4)
    x = torch.randn(2, 10, D_MODEL, dtype=torch.float64)
    state = bb.init_state(2)
    for sizes in ([3], [5], [2]):
        state = bb(x[:, : sizes[0]], state=state).state
    assert state.pos.tolist() == [10, 10]
    assert state.memory.pos.tolist() == [[6, 7, 8, 9]] * 2  # memory tokens keep their positions
    contexts = bb.memory.read(state.memory)
    assert len(contexts) == bb.cfg.n_layers
    assert all(c is not None and c.h.shape == (2, 4, D_MODEL) for c in contexts)


@pytest.mark.parametrize("position", ["sinusoidal", "learned"])
def test_absolute_schemes_are_refused(position: str) -> None:
    with pytest.raises(ValueError, match=r"absolute position scheme.*xl_relative, rope"):
        BackboneConfig(memory="xl", position=position)


def test_memory_is_stop_gradient_training_window_is_separate() -> None:
    """Gradients stop at the chunk boundary (training window) while the forward still reads M past tokens."""
    bb = xl(4)
    past = torch.randn(1, 4, D_MODEL, dtype=torch.float64, requires_grad=True)
    now = torch.randn(1, 3, D_MODEL, dtype=torch.float64)
    state = bb(past).state
    y = bb(now, state=state).y
    assert y.sum().grad_fn is not None
    # no graph from y back to the previous chunk: past is unused by y's graph
    assert torch.autograd.grad(y.sum(), past, allow_unused=True) == (None,)
    with torch.no_grad():
        moved = bb(now, state=bb(torch.randn_like(past)).state).y
    assert (moved - y).abs().max() > 1e-4  # ... yet the memory is read


def test_memory_stays_bounded() -> None:
    bb = xl(5)
    x = torch.randn(2, 40, D_MODEL, dtype=torch.float64)
    with torch.no_grad():
        _, state = inv.run_chunks(bb, x, [3] * 13 + [1])
    assert state.memory.h.shape == (2, bb.cfg.n_layers, 5, D_MODEL)


@pytest.mark.parametrize("name", available()["memory"])
def test_every_memory_declares_itself_causal_only(name: str) -> None:
    """A memory holds the past: its capabilities say so, and the capability check refuses causal=False first."""
    entry = registry.get("memory", name)
    assert entry.capabilities.causal and not entry.capabilities.noncausal
    with pytest.raises(ValueError, match=f"memory {name!r} is causal-only"):
        entry.validate(types.SimpleNamespace(causal=False), None)
