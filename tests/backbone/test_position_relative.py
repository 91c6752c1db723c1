"""``shaw`` and ``xl_relative`` against per-pair references written from the papers' formulas.

Shaw et al. 2018: logits_ij = q_i·(k_j + a^K_{clip(j-i)})/sqrt(D), out_i = Σ_j α_ij (v_j + a^V_{clip(j-i)}).
Dai et al. 2019: logits_ij = ((q_i + u)·k_j + (q_i + v)·W_R R_{i-j})/sqrt(D) with sinusoidal R. The references
loop over (b, h, i, j) in float64 and feed ``reference_attention`` with the per-pair bias; they are compared
with the hooks, with both evaluation paths of xl_relative (rel-shift and gather), with a whole 1-layer
Backbone (with and without a sliding window), and with XL memory.
"""

from __future__ import annotations

import math
from unittest import mock

import pytest
import torch

from rl_transformers.backbone import Backbone, BackboneConfig
from rl_transformers.backbone.attention.base import dense_attention
from rl_transformers.backbone.position import relative as relative_module
from rl_transformers.backbone.position.relative import contiguous_offset, distinct_distances, rel_shift
from rl_transformers.backbone.reference import causal_mask, reference_attention
from tests.backbone import invariants as inv

torch.set_num_threads(1)
NAMES = ["shaw", "xl_relative"]


# -- independent references ----------------------------------------------------------------------------------
def sinusoid(n: int, dim: int) -> torch.Tensor:
    """R_n: sin(n / 10000^(2t/dim)) on even dims, cos on odd dims."""
    out = torch.zeros(dim, dtype=torch.float64)
    for t in range(dim // 2):
        angle = n / 10000 ** (2 * t / dim)
        out[2 * t], out[2 * t + 1] = math.sin(angle), math.cos(angle)
    return out


@torch.no_grad()
def ref_scores_bias(position, name: str, q, k, q_pos, k_pos, layer: int = 0) -> torch.Tensor:
    """Per-pair logits minus q·k/sqrt(D): the key-side relative term (B, H, Tq, Tk)."""
    b, h, tq, d = q.shape
    tk = k.shape[-2]
    out = torch.zeros(b, h, tq, tk, dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            for i in range(tq):
                for j in range(tk):
                    n = int(q_pos[bi, i] - k_pos[bi, j])  # i - j
                    if name == "shaw":
                        cap = position.options.max_distance
                        a_k = position.keys[layer, max(-cap, min(cap, -n)) + cap].double()
                        term = q[bi, hi, i].double() @ a_k
                    else:
                        w_r = position.r_proj[layer].weight.double()  # (H·D, d_model)
                        r = (w_r @ sinusoid(n, w_r.shape[1])).view(h, d)[hi]
                        u, v = position.u[hi].double(), position.v[hi].double()
                        term = u @ k[bi, hi, j].double() + (q[bi, hi, i].double() + v) @ r
                    out[bi, hi, i, j] = term / math.sqrt(d)
    return out


@torch.no_grad()
def ref_shaw_values(position, probs, q_pos, k_pos, layer: int = 0) -> torch.Tensor:
    """Σ_j α_ij a^V_{clip(j-i)} by loops, (B, H, Tq, D)."""
    b, h, tq, tk = probs.shape
    cap = position.options.max_distance
    out = torch.zeros(b, h, tq, position.d_head, dtype=torch.float64)
    for bi in range(b):
        for i in range(tq):
            for j in range(tk):
                r = max(-cap, min(cap, int(k_pos[bi, j] - q_pos[bi, i])))
                out[bi, :, i] += probs[bi, :, i, j, None] * position.values[layer, r + cap].double()
    return out


def reference_output(position, name, q, k, v, q_pos, k_pos, mask, layer: int = 0) -> torch.Tensor:
    bias = ref_scores_bias(position, name, q, k, q_pos, k_pos, layer)
    out, probs = reference_attention(q, k, v, mask=mask, bias=bias, return_probs=True)
    if name == "shaw":
        out = out + ref_shaw_values(position, probs, q_pos, k_pos, layer)
    return out


# -- helpers -------------------------------------------------------------------------------------------------
def backbone(name: str, causal: bool = True, n_layers: int = 1, seed: int = 0, **attention) -> Backbone:
    torch.manual_seed(seed)
    options = {"max_distance": 3} if name == "shaw" else {}  # clipping is visible at tiny lengths
    cfg = BackboneConfig(
        d_model=16,
        n_layers=n_layers,
        n_heads=2,
        position=name,
        position_options=options,
        causal=causal,
        attention_options=attention,
    )
    bb = Backbone(cfg).double().eval()
    with torch.no_grad():  # relative terms of the same size as the content term
        for pname, p in bb.position.named_parameters():
            if not pname.startswith("r_proj"):
                p.normal_(0.0, 0.7)
    return bb


def positions(
    b: int, tq: int, tk: int, start: tuple[int, ...] = (3, 11)
) -> tuple[torch.Tensor, torch.Tensor]:
    k_pos = torch.stack([torch.arange(s, s + tk) for s in start[:b]])
    return k_pos[:, tk - tq :], k_pos


def layer_io(bb: Backbone, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    att = bb.depth.blocks[0].attention
    seen: dict[str, torch.Tensor] = {}
    handle = att.register_forward_hook(lambda m, args, out: seen.update(x=args[0], y=out[0]))
    with torch.no_grad():
        bb(x)
    handle.remove()
    return seen["x"], seen["y"]


def qkv(b: int = 2, tq: int = 5, tk: int = 8, d: int = 8, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, 2, t, d, generator=g, dtype=torch.float64) for t in (tq, tk, tk))


# -- rel-shift and the two evaluation paths ------------------------------------------------------------------
@pytest.mark.parametrize(("tq", "tk"), [(1, 1), (1, 6), (3, 3), (4, 7), (6, 2)])
def test_rel_shift_matches_direct_indexing(tq: int, tk: int) -> None:
    x = torch.randn(2, 3, tq, tq + tk - 1, dtype=torch.float64)
    got = rel_shift(x, tk)
    want = torch.empty(2, 3, tq, tk, dtype=torch.float64)
    for i in range(tq):
        for j in range(tk):
            want[..., i, j] = x[..., i, tq - 1 - i + j]
    assert torch.equal(got, want)


def test_contiguous_offset_detection() -> None:
    q_pos, k_pos = positions(2, 3, 6)
    assert contiguous_offset(q_pos, k_pos) == 3
    assert contiguous_offset(q_pos, k_pos.flip(-1)) is None  # not consecutive
    assert contiguous_offset(q_pos, torch.stack([k_pos[0], k_pos[1] - 1])) is None  # offsets differ by row
    reset = k_pos.clone()
    reset[1, :3] = 0  # cache entries cleared by a reset
    assert contiguous_offset(q_pos, reset) is None


@pytest.mark.parametrize("spread", [1, 1000], ids=["short_range", "sparse"])
def test_distinct_distances_rebuild_every_distance(spread: int) -> None:
    rel = torch.randint(-4, 6, (2, 3, 4, 6)) * spread  # at most 10 = Tq + Tk distinct values
    values, index = distinct_distances(rel)
    assert torch.equal(values[index], rel)
    assert values.numel() <= 10  # never a table over the whole span -4000..5000


@pytest.mark.parametrize("layout", ["contiguous", "permuted_keys", "reset_row"])
def test_xl_position_term_both_paths_match_pair_loops(layout: str) -> None:
    position = backbone("xl_relative", n_layers=2).position
    q, k, _ = qkv()
    q_pos, k_pos = positions(2, 5, 8)
    if layout == "permuted_keys":
        perm = torch.randperm(8, generator=torch.Generator().manual_seed(0))
        k, k_pos = k[:, :, perm], k_pos[:, perm]
    elif layout == "reset_row":
        k_pos = k_pos.clone()
        k_pos[1, :3] = 0
    with mock.patch.object(relative_module, "rel_shift", wraps=rel_shift) as spy:
        got = position.logits(q, k, q_pos, k_pos, 1)
    assert spy.called == (layout == "contiguous")
    want = q @ k.transpose(-1, -2) / math.sqrt(8) + ref_scores_bias(
        position, "xl_relative", q, k, q_pos, k_pos, 1
    )
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


# -- hooks vs references -------------------------------------------------------------------------------------
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("name", NAMES)
def test_dense_attention_matches_pair_reference(name: str, causal: bool) -> None:
    position = backbone(name, causal=causal, n_layers=2).position
    q, k, v = qkv()
    q_pos, k_pos = positions(2, 5, 8)
    if not causal:
        q_pos = k_pos[:, 1:6]
    mask = causal_mask(5, 8) if causal else None
    for layer in (0, 1):
        got, _ = dense_attention(q, k, v, mask, position, q_pos, k_pos, layer)
        want = reference_output(position, name, q, k, v, q_pos, k_pos, mask, layer)
        torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", NAMES)
def test_block_dims(name: str) -> None:
    """Kernels call the hooks on sub-blocks: q (B, H, nb, Tq, D), positions (B, nb, Tq)."""
    position = backbone(name).position
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 2, 3, t, 8, generator=g, dtype=torch.float64) for t in (4, 6, 6))
    k_pos = torch.arange(36).view(2, 3, 6) * 2  # gaps: the xl gather path
    q_pos = k_pos[..., 2:] + 1
    got, _ = dense_attention(q, k, v, None, position, q_pos, k_pos, 0)
    for blk in range(3):
        args = (q[:, :, blk], k[:, :, blk], v[:, :, blk], q_pos[:, blk], k_pos[:, blk], None)
        torch.testing.assert_close(
            got[:, :, blk], reference_output(position, name, *args), atol=1e-12, rtol=0
        )


@pytest.mark.parametrize("name", NAMES)
def test_shift_invariant(name: str) -> None:
    position = backbone(name).position
    assert position.shift_invariant
    q, k, v = qkv()
    q_pos, k_pos = positions(2, 5, 8)
    base, _ = dense_attention(q, k, v, None, position, q_pos, k_pos, 0)
    for c in (1, 50, 100_000):
        torch.testing.assert_close(
            position.logits(q, k, q_pos + c, k_pos + c, 0),
            position.logits(q, k, q_pos, k_pos, 0),
            atol=1e-12,
            rtol=0,
        )
        shifted, _ = dense_attention(q, k, v, None, position, q_pos + c, k_pos + c, 0)
        torch.testing.assert_close(shifted, base, atol=1e-12, rtol=0)


def test_shaw_clips_distances_and_uses_the_value_term() -> None:
    position = backbone("shaw").position  # k = 3
    q = torch.randn(1, 2, 1, 8, dtype=torch.float64)
    k = torch.randn(1, 2, 1, 8, dtype=torch.float64).expand(1, 2, 10, 8)  # identical keys
    logits = position.logits(q, k, torch.tensor([[9]]), torch.arange(10)[None], 0)[..., 0, :]
    # distances 9..3 all clip to 3: equal logits; distances 3, 2, 1, 0 differ
    assert torch.allclose(logits[..., :7], logits[..., :1].expand(-1, -1, 7))
    assert not torch.allclose(logits[..., 6], logits[..., 7])
    # the value term is part of the output
    _, k2, v = qkv(1, 4, 4)
    q_pos, k_pos = positions(1, 4, 4)
    out, probs = dense_attention(k2, k2, v, causal_mask(4), position, q_pos, k_pos, 0)
    torch.testing.assert_close(out - probs @ v, position.value_term(probs, q_pos, k_pos, 0))
    assert position.value_term(probs, q_pos, k_pos, 0).abs().min() > 0


# -- whole backbone ------------------------------------------------------------------------------------------
MODES = [
    pytest.param(True, None, id="causal"),
    pytest.param(False, None, id="bidirectional"),
    pytest.param(True, 3, id="causal-window3"),  # a KV-cache window is a causal construct
]


@pytest.mark.parametrize(("causal", "window"), MODES)
@pytest.mark.parametrize("name", NAMES)
def test_backbone_layer_matches_reference(name: str, causal: bool, window: int | None) -> None:
    bb = backbone(name, causal=causal, **({"max_cache": window} if window else {}))
    length = 11
    x = torch.randn(2, length, 16, dtype=torch.float64)
    h_in, y = layer_io(bb, x)
    att = bb.depth.blocks[0].attention
    q, k, v = (att.split_heads(p(h_in)) for p in (att.q_proj, att.k_proj, att.v_proj))
    pos = torch.arange(length).expand(2, length)
    i, j = torch.arange(length)[:, None], torch.arange(length)[None, :]
    mask = (j <= i) if causal else torch.ones(length, length, dtype=torch.bool)
    if window is not None:
        mask = mask & (i - j <= window)
    want = att.o_proj(att.merge_heads(reference_output(bb.position, name, q, k, v, pos, pos, mask)))
    torch.testing.assert_close(y, want, atol=1e-10, rtol=0)
    if window is not None:  # the super-baseline streams: chunked == full run
        with torch.no_grad():
            full = bb(x).y
            for sizes in inv.chunkings(length):
                got, state = inv.run_chunks(bb, x, sizes)
                torch.testing.assert_close(got, full, atol=1e-9, rtol=0)
                assert state.layers[0].length <= window


def test_xl_relative_with_xl_memory_streams_like_a_full_pass() -> None:
    """GTrXL's default pair: with mem_len >= sequence length, chunked runs with memory == one full pass."""
    torch.manual_seed(0)
    cfg = BackboneConfig(
        d_model=16,
        n_layers=2,
        n_heads=2,
        position="xl_relative",
        memory="xl",
        block="gtrxl",
        memory_options={"mem_len": 16},
    )
    bb = Backbone(cfg).double().eval()
    x = torch.randn(2, 12, 16, dtype=torch.float64)
    with torch.no_grad():
        full = bb(x).y
        for sizes in inv.chunkings(12):
            got, _ = inv.run_chunks(bb, x, sizes)
            torch.testing.assert_close(got, full, atol=1e-9, rtol=0)


@pytest.mark.parametrize("name", NAMES)
def test_parameters_receive_gradients(name: str) -> None:
    bb = backbone(name, n_layers=2)
    bb.train()
    bb(torch.randn(2, 9, 16, dtype=torch.float64)).y.pow(2).mean().backward()
    params = dict(bb.position.named_parameters())
    expected = {"shaw": {"keys", "values"}, "xl_relative": {"u", "v", "r_proj.0.weight", "r_proj.1.weight"}}[
        name
    ]
    assert set(params) == expected
    for pname, p in params.items():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname
        per_layer = p.grad if p.dim() == 2 else p.grad.flatten(1)
        assert (per_layer.abs().sum(-1) > 0).all(), f"{pname}: a layer / head got no gradient"


def test_xl_relative_init_matches_the_reference_scales() -> None:
    """u, v ~ N(0, 0.02²) (Dai et al. 2019's reference code: ``init_std`` 0.02), W_R bias-free, and W_R at the
    same scale as the key projection (the reference initialises both alike), so that at init the position
    term (q + v)·W_R R is no larger than the content term (docs/results/xl_relative.md)."""
    torch.manual_seed(0)
    cfg = BackboneConfig(d_model=256, n_layers=2, n_heads=8, position="xl_relative")
    bb = Backbone(cfg).requires_grad_(False)
    pos = bb.position
    for p in (pos.u, pos.v):
        assert p.shape == (8, 32)
        assert abs(float(p.std()) - 0.02) < 0.003 and abs(float(p.mean())) < 0.003
    for layer in range(2):
        w_r = pos.r_proj[layer]
        assert w_r.bias is None and w_r.weight.shape == (256, 256)
        k_proj = bb.depth.blocks[layer].attention.k_proj.weight
        assert 0.9 < float(w_r.weight.std() / k_proj.std()) < 1.1
