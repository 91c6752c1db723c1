"""``compressive`` memory: rate 1 == ``xl`` with m_m + m_cm, each f_c written out per group, group bookkeeping
by positions, both aux losses against hand-computed values and trainable by the compressor alone, most-used
selection against recomputed attention weights, reset / state ops / causality while compressing."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from rl_transformers.backbone import Backbone
from rl_transformers.backbone.config import BackboneConfig
from rl_transformers.backbone.memory.compressive import COMPRESSIONS, Compressor
from rl_transformers.backbone.reference import causal_mask, reference_attention
from tests.backbone import invariants as inv

D_MODEL = 16


def compressive(**options: object) -> Backbone:
    overrides = {k: options.pop(k) for k in ("n_layers", "position", "block") if k in options}
    return inv.tiny_backbone(memory="compressive", memory_options=options, **overrides)


def run_stream(bb: Backbone, x: Tensor, sizes: list[int], resets: dict[int, Tensor], pad: Tensor) -> Tensor:
    """Chunked run with resets before some chunks and a key-padding mask."""
    state, ys, start = bb.init_state(x.shape[0]), [], 0
    for i, size in enumerate(sizes):
        out = bb(
            x[:, start : start + size],
            state=state,
            reset=resets.get(i),
            key_padding_mask=pad[:, start : start + size],
        )
        ys.append(out.y)
        state, start = out.state, start + size
    return torch.cat(ys, dim=1)


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_rate_one_equals_xl_with_both_memories(compression: str) -> None:
    cb = compressive(mem_len=3, cmem_len=4, rate=1, compression=compression)
    xb = inv.tiny_backbone(memory="xl", memory_options={"mem_len": 7})
    xb.load_state_dict(cb.state_dict(), strict=False)  # same blocks; the compressor is the identity at rate 1
    x = torch.randn(3, 22, D_MODEL, dtype=torch.float64)
    pad = torch.rand(3, 22) > 0.2
    resets = {2: torch.tensor([False, True, False])}
    with torch.no_grad():
        for sizes in ([1] * 22, [6, 6, 10], [2, 5, 1, 9, 5]):
            got = run_stream(cb, x, sizes, resets, pad)
            ref = run_stream(xb, x, sizes, resets, pad)
            torch.testing.assert_close(
                got, ref, atol=1e-10, rtol=0, msg=lambda m, s=sizes: f"chunks {s}: {m}"
            )
    short = inv.tiny_backbone(memory="xl", memory_options={"mem_len": 3})
    short.load_state_dict(cb.state_dict(), strict=False)
    with torch.no_grad():
        assert (
            run_stream(short, x, [6, 6, 10], {}, pad) - run_stream(cb, x, [6, 6, 10], {}, pad)
        ).abs().max() > 1e-4


# -- the compression functions, written out per group -------------------------------------------------------------
def _groups(x: Tensor, c: int) -> list[Tensor]:
    return [x[:, g * c : (g + 1) * c] for g in range(x.shape[1] // c)]


def _dilated_reference(comp: Compressor, group: Tensor) -> Tensor:
    """Stack of kernel-2 convolutions h_l[t] = W0 h_{l-1}[t - δ] + W1 h_{l-1}[t] + b (zero before the group)."""
    h = group  # (B, c, d)
    for conv in comp.convs:
        delta = conv.dilation[0]
        w0, w1, bias = conv.weight[:, :, 0], conv.weight[:, :, 1], conv.bias
        nxt = torch.zeros_like(h)
        for t in range(h.shape[1]):
            prev = h[:, t - delta] if t - delta >= 0 else torch.zeros_like(h[:, t])
            nxt[:, t] = prev @ w0.T + h[:, t] @ w1.T + bias
        h = nxt
    return h[:, -1]


@pytest.mark.parametrize("rate", [1, 2, 3, 4])
@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_compression_maps_groups(compression: str, rate: int) -> None:
    torch.manual_seed(rate)
    comp = Compressor(compression, D_MODEL, rate).double()
    for p in comp.parameters():  # random weights: not the mean-pooling initialisation
        torch.nn.init.normal_(p, std=0.3)
    n = 4 * rate
    x = torch.randn(2, n, D_MODEL, dtype=torch.float64)
    usage = torch.rand(2, n, dtype=torch.float64)
    out, ok = comp(x, usage=usage)
    assert out.shape == (2, n // rate, D_MODEL) and ok.all()
    for g, group in enumerate(_groups(x, rate)):
        if compression == "mean_pool":
            want = group.mean(1)
        elif compression == "max_pool":
            want = group.max(1).values
        elif compression == "conv":  # kernel = stride = c: Σ_k W[:, :, k] x_{gc+k} + b
            want = comp.conv.bias + sum(group[:, k] @ comp.conv.weight[:, :, k].T for k in range(rate))
        elif compression == "dilated_conv":
            want = _dilated_reference(comp, group)
        else:
            want = group[torch.arange(2), usage[:, g * rate : (g + 1) * rate].argmax(1)]
        torch.testing.assert_close(out[:, g], want, atol=1e-12, rtol=0)
    decoded = comp.decode(out)
    assert decoded.shape == x.shape  # g: (B, n/c, d) -> (B, n, d)


@pytest.mark.parametrize("compression", ["conv", "dilated_conv"])
def test_learned_compressors_start_as_mean_pooling(compression: str) -> None:
    comp = Compressor(compression, D_MODEL, 4).double()
    x = torch.randn(2, 8, D_MODEL, dtype=torch.float64)
    torch.testing.assert_close(comp(x)[0], x.view(2, 2, 4, D_MODEL).mean(2), atol=1e-12, rtol=0)
    torch.testing.assert_close(
        comp.decode(comp(x)[0]), x.view(2, 2, 4, D_MODEL).mean(2).repeat_interleave(4, 1)
    )


@pytest.mark.parametrize("compression", ["mean_pool", "max_pool", "conv", "most_used"])
def test_invalid_memories_are_left_out(compression: str) -> None:
    comp = Compressor(compression, D_MODEL, 3).double()
    x = torch.randn(1, 6, D_MODEL, dtype=torch.float64)
    valid = torch.tensor([[True, False, True, False, False, False]])
    out, ok = comp(x, valid, usage=torch.tensor([[0.1, 9.0, 0.2, 1.0, 1.0, 1.0]], dtype=torch.float64))
    assert ok.tolist() == [[True, False]]
    assert out[0, 1].abs().max() == 0
    if compression == "mean_pool":
        expected = (x[0, 0] + x[0, 2]) / 2
    elif compression == "max_pool":
        expected = torch.maximum(x[0, 0], x[0, 2])
    elif compression == "conv":  # the mean-pooling init (1/3 per tap) over zeroed invalid entries
        expected = (x[0, 0] + x[0, 2]) * comp.conv.weight[0, 0, 0]
    else:  # most_used: the invalid member 1 has the largest usage but is skipped
        expected = x[0, 2]
    torch.testing.assert_close(out[0, 0], expected, atol=1e-12, rtol=0)


def test_unknown_compression_is_explained() -> None:
    with pytest.raises(ValueError, match=r"unknown compression 'mean_pol'.*Did you mean 'mean_pool'"):
        BackboneConfig(memory="compressive", memory_options={"compression": "mean_pol"})
    with pytest.raises(ValueError, match="rate must be an int >= 1"):
        BackboneConfig(memory="compressive", memory_options={"rate": 0})
    with pytest.raises(ValueError, match="absolute position scheme"):
        BackboneConfig(memory="compressive", position="sinusoidal")


# -- bookkeeping -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sizes", [[1] * 17, [9, 8], [2, 7, 3, 5]], ids=["ones", "halves", "random"])
def test_groups_follow_positions_and_fifo(sizes: list[int]) -> None:
    """Layer 0 stores norm1(x): its compressed memories are the group means, oldest groups dropped first."""
    bb = compressive(mem_len=3, cmem_len=3, rate=3, compression="mean_pool", n_layers=1)
    x = torch.randn(2, 17, D_MODEL, dtype=torch.float64)
    with torch.no_grad():
        _, state = inv.run_chunks(bb, x, sizes)
        h0 = bb.depth.blocks[0].norm1(x)
    mem = state.memory
    # 17 tokens, FIFO = positions 14..16; group 4 = {12, 13, 14} straddles it: 12, 13 wait uncompressed.
    assert mem.cpos.tolist() == [[5, 8, 11]] * 2 and mem.cfill.all() and mem.cvalid.all()
    for slot, g in enumerate([1, 2, 3]):
        torch.testing.assert_close(mem.ch[:, 0, slot], h0[:, 3 * g : 3 * g + 3].mean(1), atol=1e-12, rtol=0)
    attended = mem.pos[0][mem.live[0] & mem.valid[0]].tolist()
    assert attended == [12, 13, 14, 15, 16]
    torch.testing.assert_close(mem.h[:, 0, -5:], h0[:, 12:], atol=1e-12, rtol=0)


def test_groups_restart_at_reset() -> None:
    bb = compressive(mem_len=2, cmem_len=4, rate=2, compression="mean_pool", n_layers=1)
    x = torch.randn(2, 12, D_MODEL, dtype=torch.float64)
    with torch.no_grad():
        state = bb(x[:, :7]).state
        state = bb(x[:, 7:], state=state, reset=torch.tensor([False, True])).state
        h0 = bb.depth.blocks[0].norm1(x)
    mem = state.memory
    # Row 1 restarted at token 7 (position 0): 5 tokens, FIFO = positions 3, 4; group {0, 1} compressed.
    assert mem.cpos[1][mem.cfill[1]].tolist() == [1]
    torch.testing.assert_close(mem.ch[1, 0][mem.cfill[1]][0], h0[1, 7:9].mean(0), atol=1e-12, rtol=0)
    assert mem.cpos[0][mem.cfill[0]].tolist() == [1, 3, 5, 7, 9][-4:]


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_reset_and_state_ops_while_compressing(compression: str) -> None:
    bb = compressive(mem_len=2, cmem_len=2, rate=2, compression=compression)
    inv.check_reset(bb, prefix=11, length=7)
    inv.check_state_ops(bb)


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_chunked_run_is_causal(compression: str) -> None:
    bb = compressive(mem_len=2, cmem_len=3, rate=2, compression=compression)
    x = torch.randn(2, 16, D_MODEL, dtype=torch.float64)
    x2 = x.clone()
    x2[:, 11] += 1.0 + torch.randn_like(x2[:, 11])
    with torch.no_grad():
        y1, _ = inv.run_chunks(bb, x, [3, 5, 4, 4])
        y2, _ = inv.run_chunks(bb, x2, [3, 5, 4, 4])
    torch.testing.assert_close(y1[:, :11], y2[:, :11], atol=1e-12, rtol=0)
    assert (y1[:, 11:] - y2[:, 11:]).abs().max() > 1e-6


def test_memory_reaches_compressed_past() -> None:
    """A token only present in compressed memory still changes later outputs; beyond m_m + c·m_cm it cannot."""
    bb = compressive(
        mem_len=2, cmem_len=2, rate=2, compression="mean_pool", n_layers=1
    )  # one layer: no relay
    x = torch.randn(1, 12, D_MODEL, dtype=torch.float64)
    outs = []
    for t in (5, 1):  # token 5 is compressed at the last chunk; token 1 fell out of the compressed FIFO
        x2 = x.clone()
        x2[:, t] = torch.randn(D_MODEL, dtype=torch.float64)
        with torch.no_grad():
            outs.append(
                (inv.run_chunks(bb, x, [4, 4, 2, 2])[0] - inv.run_chunks(bb, x2, [4, 4, 2, 2])[0])[:, -2:]
            )
    assert outs[0].abs().max() > 1e-6
    assert outs[1].abs().max() < 1e-12


# -- aux losses ---------------------------------------------------------------------------------------------------
def _split(x: Tensor, heads: int) -> Tensor:
    b, t, d = x.shape
    return x.view(b, t, heads, d // heads).transpose(1, 2)


def test_losses_match_hand_computation() -> None:
    """One layer, one forward of 9 tokens with m_m = 3, c = 2: positions 0..5 are compressed (3 groups)."""
    bb = compressive(mem_len=3, cmem_len=4, rate=2, compression="mean_pool", n_layers=1)
    x = torch.randn(2, 9, D_MODEL, dtype=torch.float64)
    with torch.no_grad():
        out = bb(x)
        block = bb.depth.blocks[0]
        att = block.attention
        h = block.norm1(x)
    old = h[:, :6]
    z = old.view(2, 3, 2, D_MODEL).mean(2)
    decoded = z.repeat_interleave(2, 1)  # the decoder starts as "repeat c times"
    ae = (old - decoded).pow(2).mean()
    q = _split(att.q_proj(h), 2)
    a_old = reference_attention(q, _split(att.k_proj(old), 2), _split(att.v_proj(old), 2))
    a_new = reference_attention(q, _split(att.k_proj(z), 2), _split(att.v_proj(z), 2))
    ar = (a_old - a_new).pow(2).mean()
    torch.testing.assert_close(out.aux_losses["compressive_autoencoding"], ae, atol=1e-12, rtol=0)
    torch.testing.assert_close(out.aux_losses["compressive_attention_reconstruction"], ar, atol=1e-12, rtol=0)
    assert ae > 1e-3 and ar > 1e-6


def test_losses_vanish_for_identity_compression() -> None:
    bb = compressive(mem_len=2, cmem_len=4, rate=1, compression="mean_pool")
    out = bb(torch.randn(2, 7, D_MODEL, dtype=torch.float64))
    assert out.aux_losses["compressive_autoencoding"].abs() < 1e-14
    assert out.aux_losses["compressive_attention_reconstruction"].abs() < 1e-14


def test_losses_are_zero_when_nothing_is_compressed() -> None:
    out = compressive(mem_len=8)(torch.randn(2, 5, D_MODEL, dtype=torch.float64))
    assert set(out.aux_losses) == {"compressive_autoencoding", "compressive_attention_reconstruction"}
    assert all(v == 0 for v in out.aux_losses.values())


@pytest.mark.parametrize("loss", ["compressive_autoencoding", "compressive_attention_reconstruction"])
@pytest.mark.parametrize("compression", ["conv", "dilated_conv"])
def test_losses_decrease_training_only_the_compressor(compression: str, loss: str) -> None:
    torch.manual_seed(0)
    bb = compressive(mem_len=2, cmem_len=4, rate=4, compression=compression)
    bb.train()
    x = torch.randn(2, 14, D_MODEL, dtype=torch.float64)
    state = bb(x[:, :8]).state.detach()  # a fixed memory: the next chunk compresses a fixed set of groups
    with torch.no_grad():  # start from random weights (not the mean-pooling initialisation)
        for p in bb.memory.parameters():
            p.normal_(0.0, 0.2)
    opt = torch.optim.Adam(bb.memory.parameters(), lr=1e-2)
    history = []
    for _ in range(20):
        out = bb(x[:, 8:], state=state)
        value = out.aux_losses[loss]
        assert all(torch.isfinite(v) for v in out.aux_losses.values())
        history.append(value.item())
        opt.zero_grad()
        value.backward()
        others = [
            name for name, p in bb.named_parameters() if p.grad is not None and not name.startswith("memory.")
        ]
        assert not others, f"aux losses must not reach the main model: {others}"
        opt.step()
    assert history[0] > 0
    assert history[-1] < 0.5 * history[0], history


# -- most used ----------------------------------------------------------------------------------------------------
def _rotate(x: Tensor, pos: Tensor) -> Tensor:
    d = x.shape[-1]
    out = torch.empty_like(x)
    for i in range(d // 2):
        angle = pos.double() * 10000.0 ** (-2 * i / d)
        a, b = x[..., 2 * i], x[..., 2 * i + 1]
        out[..., 2 * i] = a * torch.cos(angle) - b * torch.sin(angle)
        out[..., 2 * i + 1] = a * torch.sin(angle) + b * torch.cos(angle)
    return out


def test_most_used_keeps_the_memory_with_most_attention() -> None:
    bb = compressive(mem_len=2, cmem_len=4, rate=3, compression="most_used", n_layers=1)
    x = torch.randn(2, 11, D_MODEL, dtype=torch.float64)
    with torch.no_grad():
        state = bb(x).state.memory
        block = bb.depth.blocks[0]
        att = block.attention
        h = block.norm1(x)
        pos = torch.arange(11)
        q, k = _rotate(_split(att.q_proj(h), 2), pos), _rotate(_split(att.k_proj(h), 2), pos)
        _, probs = reference_attention(
            q, k, _split(att.v_proj(h), 2), mask=causal_mask(11), return_probs=True
        )
    usage = probs.sum((1, 2))  # (B, 11): attention each token received, summed over heads and queries
    # 11 tokens, FIFO = 9, 10: groups {0,1,2}, {3,4,5}, {6,7,8} compressed.
    # The compressed FIFO has cmem_len slots from the start, filled right-aligned: the 3 groups are the last 3.
    assert state.cfill[:, -3:].all() and not state.cfill[:, :-3].any()
    for g in range(3):
        pick = usage[:, 3 * g : 3 * g + 3].argmax(1) + 3 * g
        torch.testing.assert_close(state.ch[:, 0, g - 3], h[torch.arange(2), pick], atol=1e-12, rtol=0)
    assert math.isclose(float(usage.sum()), 2 * 2 * 11, rel_tol=1e-12)  # every query row sums to one


def test_chunk_with_starts_leaves_the_state_of_its_last_segment() -> None:
    """``starts`` (PPO's uncut training rows, chunks of at most mem_len tokens): a row restarted inside the chunk
    ends with the state of its last segment run alone from a reset (no compressed memory, its tokens live); a
    row without restarts as if no starts were given. The next chunk then reads the same memory."""
    bb = compressive(mem_len=6, cmem_len=3, rate=2)
    x0 = torch.randn(2, 14, D_MODEL, dtype=torch.float64)
    with torch.no_grad():
        state = inv.run_chunks(bb, x0, [7, 7])[1]
    assert bool(state.memory.cfill.any())  # something was compressed before the chunk
    x = torch.randn(2, 6, D_MODEL, dtype=torch.float64)
    starts = torch.zeros(2, 6, dtype=torch.bool)
    starts[0, [2, 4]] = True
    with torch.no_grad():
        got = bb(x, state=state, starts=starts).state
        row0 = bb(x[:1, 4:], state=state.index_select(torch.tensor([0])), reset=torch.tensor([True])).state
        row1 = bb(x[1:], state=state.index_select(torch.tensor([1]))).state
        after = bb(x, state=got).y  # the next chunk, from the uncut state and from the rows' own states
        want_after = torch.cat([bb(x[:1], state=row0).y, bb(x[1:], state=row1).y])
    for row, want in ((0, row0.memory), (1, row1.memory)):
        mem = got.memory
        for name in ("valid", "live", "cfill", "cvalid"):
            assert torch.equal(getattr(mem, name)[row], getattr(want, name)[0]), (row, name)
        seen = mem.valid[row] & mem.live[row]
        assert torch.equal(mem.pos[row][seen], want.pos[0][seen])
        torch.testing.assert_close(mem.h[row][:, seen], want.h[0][:, seen], atol=1e-12, rtol=0)
        kept = mem.cvalid[row]
        torch.testing.assert_close(mem.ch[row][:, kept], want.ch[0][:, kept], atol=1e-12, rtol=0)
        assert int(got.pos[row]) == int((row0 if row == 0 else row1).pos[0])
    assert int((got.memory.valid[0] & got.memory.live[0]).sum()) == 2 and not bool(got.memory.cfill[0].any())
    assert bool(got.memory.cfill[1].any())
    torch.testing.assert_close(after, want_after, atol=1e-12, rtol=0)
