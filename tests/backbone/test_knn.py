"""``knn`` memory (Memorizing Transformer): retrieval vs dense attention over the store built here, exact top-k,
gate formula and extremes (== ``xl``), store contents (what is written, FIFO eviction, no overlap with the local
context, nothing from the future), reset of one row, save / restore, SPALM gate gradients, faiss == exact."""

from __future__ import annotations

import io
import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from rl_transformers.backbone import Backbone
from rl_transformers.backbone.config import BackboneConfig
from rl_transformers.backbone.context import ForwardContext
from rl_transformers.backbone.reference import reference_attention
from tests.backbone import invariants as inv

D_MODEL, HEADS = 16, 2


def knn(**options: object) -> Backbone:
    overrides = {k: options.pop(k) for k in ("n_layers", "position", "block") if k in options}
    return inv.tiny_backbone(memory="knn", memory_options=options, **overrides)


def xl_twin(bb: Backbone, mem_len: int) -> Backbone:
    twin = inv.tiny_backbone(memory="xl", memory_options={"mem_len": mem_len}, n_layers=bb.cfg.n_layers)
    twin.load_state_dict(bb.state_dict(), strict=False)
    return twin


def split(x: Tensor) -> Tensor:
    b, t, d = x.shape
    return x.view(b, t, HEADS, d // HEADS).transpose(1, 2)


def _ctx(t: int, b: int = 2) -> ForwardContext:
    return ForwardContext(
        pos=torch.arange(t).expand(b, t), valid=torch.ones(b, t, dtype=torch.bool), causal=True
    )


def _filled(bb: Backbone, length: int = 14, batch: int = 2):  # type: ignore[no-untyped-def]
    x = torch.randn(batch, length, D_MODEL, dtype=torch.float64)
    with torch.no_grad():
        return inv.run_chunks(bb, x, [5, length - 5])[1]


def _hook_output(bb: Backbone, state, x_in: Tensor, local: Tensor) -> Tensor:  # type: ignore[no-untyped-def]
    """Run the kNN layer's hook directly on an attention input and a given local output."""
    memory = bb.memory
    hook = memory.read(state.memory)[memory.layer].hook
    att = bb.depth.blocks[memory.layer].attention
    with torch.no_grad():
        return hook(att, x_in, local, _ctx(x_in.shape[1], x_in.shape[0]))


def test_whole_store_retrieval_equals_dense_attention_over_store() -> None:
    bb = knn(mem_len=2, store_size=16, top_k=16, n_layers=1, layer=0)
    state = _filled(bb)  # 14 tokens, 12 of them left the local memory -> 12 valid of 16 slots
    store = state.memory
    assert int(store.valid.sum()) == 2 * 12
    with torch.no_grad():
        bb.memory.gate_logit.fill_(50.0)  # g = σ(50) == 1 in float64: the output is A_mem alone
    x_in = torch.randn(2, 3, D_MODEL, dtype=torch.float64)
    att = bb.depth.blocks[0].attention
    got = _hook_output(bb, state, x_in, torch.randn(2, HEADS, 3, D_MODEL // HEADS, dtype=torch.float64))
    q = F.normalize(split(att.q_proj(x_in)), dim=-1)
    tau = bb.memory.log_temperature.exp()[None, :, None, None]
    ref = reference_attention(
        q,
        store.keys,
        store.values,
        mask=store.valid[:, None, None, :],
        scale=1.0,
        bias=None,
        weight=tau.expand(2, HEADS, 3, 16),
    )
    torch.testing.assert_close(got, ref, atol=1e-12, rtol=0)


def test_top_k_equals_attention_over_the_k_best_keys() -> None:
    bb = knn(mem_len=2, store_size=16, top_k=3, n_layers=1, layer=0)
    state = _filled(bb)
    store = state.memory
    att = bb.depth.blocks[0].attention
    x_in = torch.randn(2, 4, D_MODEL, dtype=torch.float64)
    local = torch.randn(2, HEADS, 4, D_MODEL // HEADS, dtype=torch.float64)
    got = _hook_output(bb, state, x_in, local)
    with torch.no_grad():
        q = F.normalize(split(att.q_proj(x_in)), dim=-1)
    tau = bb.memory.log_temperature.exp().detach()
    mask = torch.zeros(2, HEADS, 4, 16, dtype=torch.bool)
    for b in range(2):  # the 3 valid slots with the highest cosine similarity, found by sorting
        for h in range(HEADS):
            for t in range(4):
                sims = [(float(q[b, h, t] @ store.keys[b, h, s]), s) for s in range(16) if store.valid[b, s]]
                for _, s in sorted(sims, reverse=True)[:3]:
                    mask[b, h, t, s] = True
    a_mem = reference_attention(
        q,
        store.keys,
        store.values,
        mask=mask,
        scale=1.0,
        weight=tau[None, :, None, None].expand(2, HEADS, 4, 16),
    )
    g = torch.sigmoid(bb.memory.gate_logit.detach())[None, :, None, None]  # 0.5 at initialisation
    torch.testing.assert_close(got, g * a_mem + (1 - g) * local, atol=1e-12, rtol=0)


@pytest.mark.parametrize("gate", ["per_head", "spalm"])
def test_closed_gate_equals_xl(gate: str) -> None:
    bb = knn(mem_len=3, store_size=8, top_k=4, gate=gate)
    with torch.no_grad():
        if gate == "per_head":
            bb.memory.gate_logit.fill_(-1e4)
        else:
            bb.memory.gate_proj.bias.fill_(-1e4)
    twin = xl_twin(bb, 3)
    x = torch.randn(2, 15, D_MODEL, dtype=torch.float64)
    with torch.no_grad():
        for sizes in ([1] * 15, [4, 4, 7]):
            torch.testing.assert_close(inv.run_chunks(bb, x, sizes)[0], inv.run_chunks(twin, x, sizes)[0])
            assert inv.run_chunks(bb, x, sizes)[1].memory.valid.any()  # the store was in use


def test_empty_store_equals_xl_and_open_gate_differs() -> None:
    bb = knn(mem_len=3, store_size=8, top_k=4)
    twin = xl_twin(bb, 3)
    x = torch.randn(2, 12, D_MODEL, dtype=torch.float64)
    with torch.no_grad():
        y, y_xl = inv.run_chunks(bb, x, [3, 3, 6])[0], inv.run_chunks(twin, x, [3, 3, 6])[0]
    # Nothing left the 3-token local memory before the third chunk: g is taken as 0 there.
    torch.testing.assert_close(y[:, :6], y_xl[:, :6], atol=1e-12, rtol=0)
    assert (y[:, 6:] - y_xl[:, 6:]).abs().max() > 1e-4


def test_store_holds_the_tokens_that_left_the_local_memory() -> None:
    """One layer stores k = normalise(W_k norm1(x)), v = W_v norm1(x) of positions < t - M; ring slot = p mod N."""
    bb = knn(mem_len=3, store_size=5, top_k=2, n_layers=1, layer=0)
    att = bb.depth.blocks[0].attention
    x = torch.randn(2, 20, D_MODEL, dtype=torch.float64)
    with torch.no_grad():
        h = bb.depth.blocks[0].norm1(x)
        keys = F.normalize(split(att.k_proj(h)), dim=-1)  # (B, H, T, D)
        values = split(att.v_proj(h))
        state = bb.init_state(2)
        seen = 0
        for size in (4, 1, 6, 2, 7):
            state = bb(x[:, seen : seen + size], state=state).state
            seen += size
            store = state.memory
            left = max(0, seen - 3)  # positions 0..left-1 left the local memory
            expected = list(range(max(0, left - 5), left))  # the newest 5 of them; the oldest were evicted
            assert sorted(store.pos[0][store.valid[0]].tolist()) == expected
            assert store.ptr.tolist() == [left % 5] * 2
            for p in expected:  # FIFO ring: position p sits in slot p mod N, verified by its key and value
                torch.testing.assert_close(store.keys[:, :, p % 5], keys[:, :, p], atol=1e-12, rtol=0)
                torch.testing.assert_close(store.values[:, :, p % 5], values[:, :, p], atol=1e-12, rtol=0)
            local = store.local.pos[0][store.local.valid[0]].tolist()
            assert local == list(range(left, seen))  # local and store never overlap; both in the past
            assert not set(local) & set(expected)


def test_padding_is_not_stored() -> None:
    bb = knn(mem_len=2, store_size=8, n_layers=1, layer=0)
    x = torch.randn(1, 10, D_MODEL, dtype=torch.float64)
    pad = torch.ones(1, 10, dtype=torch.bool)
    pad[0, [1, 4]] = False
    with torch.no_grad():
        state = bb(x, key_padding_mask=pad).state.memory
    assert sorted(state.pos[0][state.valid[0]].tolist()) == [0, 2, 3, 5, 6, 7]
    assert state.ptr.tolist() == [6]


def test_more_tokens_than_slots_in_one_chunk_keeps_the_newest() -> None:
    bb = knn(mem_len=2, store_size=4, n_layers=1, layer=0)
    with torch.no_grad():
        state = bb(torch.randn(2, 13, D_MODEL, dtype=torch.float64)).state.memory
    assert state.pos.tolist() == [[8, 9, 10, 7]] * 2  # positions 7..10 survive, slot = p mod 4
    assert state.ptr.tolist() == [3, 3]


def test_chunked_run_is_causal() -> None:
    bb = knn(mem_len=2, store_size=6, top_k=3)
    x = torch.randn(2, 16, D_MODEL, dtype=torch.float64)
    x2 = x.clone()
    x2[:, 10] += 1.0 + torch.randn_like(x2[:, 10])
    with torch.no_grad():
        y1, _ = inv.run_chunks(bb, x, [3, 5, 4, 4])
        y2, _ = inv.run_chunks(bb, x2, [3, 5, 4, 4])
    torch.testing.assert_close(y1[:, :10], y2[:, :10], atol=1e-12, rtol=0)
    assert (y1[:, 10:] - y2[:, 10:]).abs().max() > 1e-6


@pytest.mark.parametrize("gate", ["per_head", "spalm"])
def test_reset_clears_only_the_row(gate: str) -> None:
    bb = knn(mem_len=2, store_size=6, top_k=3, gate=gate)
    inv.check_reset(bb, prefix=9, length=6)
    inv.check_state_ops(bb)
    state = _filled(bb, batch=3).reset(torch.tensor([False, True, False]))
    store = state.memory
    assert not store.valid[1].any() and store.ptr[1] == 0 and not store.local.valid[1].any()
    assert store.valid[[0, 2]].all()


def test_cheap_reset_equals_zeroing_the_whole_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reset keeps the stored keys / values (only validity, positions and the pointer are cleared): a stream
    with resets gives the same outputs bit for bit as with every field of the state zeroed."""
    from rl_transformers.backbone.memory import knn as knn_module
    from rl_transformers.backbone.state import State

    bb = knn(mem_len=2, store_size=6, top_k=3)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 16, D_MODEL, generator=g, dtype=torch.float64)
    resets = torch.rand(3, 16, generator=g) < 0.3

    def stream() -> Tensor:
        state, ys = None, []
        with torch.no_grad():
            for t in range(x.shape[1]):
                out = bb(x[:, t : t + 1], state=state, reset=resets[:, t])
                ys.append(out.y)
                state = out.state
        return torch.cat(ys, dim=1)

    cheap = stream()
    assert resets[:, 8:].any() and bool(_filled(bb).memory.keys.abs().sum() > 0)
    monkeypatch.setattr(knn_module.KNNMemoryState, "reset", State.reset)  # zero every field, store included
    assert torch.equal(stream(), cheap)


def test_save_restore_round_trip() -> None:
    bb = knn(mem_len=2, store_size=6, top_k=3)
    x = torch.randn(2, 16, D_MODEL, dtype=torch.float64)
    with torch.no_grad():
        state = inv.run_chunks(bb, x[:, :10], [4, 6])[1]
        buffer = io.BytesIO()
        torch.save(state, buffer)
        buffer.seek(0)
        restored = torch.load(buffer, weights_only=False)  # a dataclass state, not only tensors
        direct = bb(x[:, 10:], state=state)
        again = bb(x[:, 10:], state=restored)
    torch.testing.assert_close(again.y, direct.y, atol=0, rtol=0)
    torch.testing.assert_close(again.state.memory.keys, direct.state.memory.keys, atol=0, rtol=0)


def test_gradients_reach_queries_temperature_and_spalm_gate() -> None:
    bb = knn(mem_len=2, store_size=6, top_k=3, gate="spalm")
    bb.train()
    x = torch.randn(2, 12, D_MODEL, dtype=torch.float64)
    state = bb(x[:, :8]).state.detach()
    bb(x[:, 8:], state=state).y.pow(2).sum().backward()
    memory = bb.memory
    for p in (memory.gate_proj.weight, memory.gate_proj.bias, memory.log_temperature):
        assert p.grad is not None and p.grad.abs().sum() > 0 and torch.isfinite(p.grad).all()
    assert bb.depth.blocks[memory.layer].attention.q_proj.weight.grad.abs().sum() > 0


def test_layer_option() -> None:
    assert knn(n_layers=3).memory.layer == 1  # default: second-to-last
    assert knn(n_layers=1).memory.layer == 0
    assert knn(n_layers=3, layer=-1).memory.layer == 2
    with pytest.raises(ValueError, match="knn layer=3 is out of range for n_layers=3"):
        BackboneConfig(n_layers=3, memory="knn", memory_options={"layer": 3})
    with pytest.raises(ValueError, match=r"unknown knn gate 'spalm2'.*Did you mean 'spalm'"):
        BackboneConfig(memory="knn", memory_options={"gate": "spalm2"})


def test_temperature_starts_at_sqrt_head_dim() -> None:
    tau = knn().memory.log_temperature.exp()
    torch.testing.assert_close(tau, torch.full_like(tau, math.sqrt(D_MODEL // HEADS)))


def test_faiss_index_equals_exact_top_k() -> None:
    pytest.importorskip("faiss")
    exact = knn(mem_len=2, store_size=12, top_k=3)
    fast = knn(mem_len=2, store_size=12, top_k=3, index="faiss")
    fast.load_state_dict(exact.state_dict())
    x = torch.randn(2, 18, D_MODEL, dtype=torch.float64)
    with torch.no_grad():
        for sizes in ([1] * 18, [5, 13]):
            torch.testing.assert_close(
                inv.run_chunks(fast, x, sizes)[0], inv.run_chunks(exact, x, sizes)[0], atol=1e-12, rtol=0
            )


def test_one_entry_write_equals_the_chunk_write() -> None:
    """The acting step's write (one entry per row: a masked select) equals the chunk write (a scatter) bit for
    bit, through wrap-around, padding and a reset; the chunk write gets the same entry plus a padding one."""
    memory = knn(mem_len=2, store_size=4, n_layers=1, layer=0).memory
    one = two = memory.init_state(3, None, torch.float64)
    g = torch.Generator().manual_seed(0)
    written = torch.zeros(3, dtype=torch.long)  # valid writes per row since its reset
    pad = torch.zeros(3, 1, dtype=torch.bool)
    for step in range(11):
        keys, values = torch.randn(2, 3, HEADS, 1, 8, generator=g, dtype=torch.float64)
        valid = torch.rand(3, 1, generator=g) < 0.7
        pos = torch.full((3, 1), step)
        if step == 6:
            reset = torch.tensor([True, False, False])
            one, two, written = one.reset(reset), two.reset(reset), written.masked_fill(reset, 0)
        written += valid.squeeze(1).long()
        one = type(one)(one.local, *memory.store_append(one, keys, values, pos, valid))
        chunk = [
            torch.cat(pair, dim)
            for pair, dim in (((keys, -keys), 2), ((values, -values), 2), ((pos, pos), 1))
        ]
        two = type(two)(two.local, *memory.store_append(two, *chunk, torch.cat([valid, pad], 1)))
        for name in ("keys", "values", "valid", "pos", "ptr"):
            assert torch.equal(getattr(one, name), getattr(two, name)), (step, name)
    assert int(written.max()) > 4 and len(set(one.ptr.tolist())) > 1  # wrapped around; rows written unevenly


def test_pickled_state_round_trips_and_an_old_layout_is_converted() -> None:
    """Resumed runs unpickle the loop state: the head-major store round-trips; one pickled before the store
    became head-major ((B, N, H, D), no marker) comes back transposed, equal to today's layout."""
    import copy

    state = _filled(knn(mem_len=2, store_size=16, top_k=3, n_layers=1, layer=0)).memory
    again = copy.deepcopy(state)  # through __getstate__ / __setstate__, as pickle
    assert torch.equal(again.keys, state.keys) and torch.equal(again.values, state.values)
    data = {**state.__dict__, "keys": state.keys.transpose(1, 2), "values": state.values.transpose(1, 2)}
    # what an old pickle holds: the fields, keys / values (B, N, H, D), no "head_major" marker
    converted = type(state).__new__(type(state))
    converted.__setstate__(data)
    assert torch.equal(converted.keys, state.keys) and torch.equal(converted.values, state.values)
    assert torch.equal(converted.valid, state.valid)


def test_chunk_with_starts_leaves_the_state_of_its_last_segment() -> None:
    """``starts`` (PPO's uncut training rows): a row restarted inside the chunk ends with the store and local
    memory of its last segment run alone from a reset; a row without restarts as if no starts were given."""
    bb = knn(mem_len=2, store_size=8, top_k=2, n_layers=1, layer=0)
    state = _filled(bb)
    x = torch.randn(2, 12, D_MODEL, dtype=torch.float64)
    starts = torch.zeros(2, 12, dtype=torch.bool)
    starts[0, [3, 5]] = True
    with torch.no_grad():
        got = bb(x, state=state, starts=starts).state.memory
        row0 = bb(
            x[:1, 5:], state=state.index_select(torch.tensor([0])), reset=torch.tensor([True])
        ).state.memory
        row1 = bb(x[1:], state=state.index_select(torch.tensor([1]))).state.memory
    for row, want in ((0, row0), (1, row1)):
        assert torch.equal(got.valid[row], want.valid[0]) and torch.equal(got.ptr[row], want.ptr[0])
        slots = want.valid[0]
        assert torch.equal(got.pos[row][slots], want.pos[0][slots])
        torch.testing.assert_close(got.keys[row][:, slots], want.keys[0][:, slots], atol=1e-12, rtol=0)
        torch.testing.assert_close(got.values[row][:, slots], want.values[0][:, slots], atol=1e-12, rtol=0)
        local = got.local.valid[row]
        assert torch.equal(local, want.local.valid[0]) and torch.equal(
            got.local.pos[row][local], want.local.pos[0][local]
        )
    assert int(got.valid[0].sum()) == 5 and int(got.valid[1].sum()) == 8  # 7 - 2 tokens stored; a full store
