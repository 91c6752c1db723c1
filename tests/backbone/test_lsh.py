"""``lsh`` (Reformer) against an independent dense reference, its error law, causality, streaming and the preset."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from rl_transformers.backbone import Backbone, BackboneConfig
from rl_transformers.backbone.attention.base import dense_attention
from rl_transformers.backbone.attention.lsh import hash_buckets, reformer_config
from rl_transformers.backbone.context import ForwardContext
from rl_transformers.backbone.reference import reference_attention
from tests.backbone import invariants as inv

torch.set_num_threads(1)


def _layer(
    causal: bool = True, position: str = "none", n_heads: int = 2, d_model: int = 16, **options: object
):
    cfg = BackboneConfig(
        d_model=d_model,
        n_layers=1,
        n_heads=n_heads,
        position=position,
        causal=causal,
        attention="lsh",
        attention_options=options,
    )
    return Backbone(cfg).double().eval().depth.blocks[0].attention


def _ctx(b: int, t: int, causal: bool) -> ForwardContext:
    return ForwardContext(
        pos=torch.arange(t).expand(b, t), valid=torch.ones(b, t, dtype=torch.bool), causal=causal
    )


def _buckets(x: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
    """(B, H, R, L) argmax over [xR; -xR], written out independently of the module."""
    if rot.shape[-1] == 0:
        return torch.zeros(x.shape[0], x.shape[1], rot.shape[0], x.shape[2], dtype=torch.long)
    out = torch.empty(x.shape[0], x.shape[1], rot.shape[0], x.shape[2], dtype=torch.long)
    for r in range(rot.shape[0]):
        for h in range(x.shape[1]):
            proj = x[:, h] @ rot[r, h]
            out[:, h, r] = torch.cat([proj, -proj], dim=-1).argmax(-1)
    return out


def _lsh_mask(
    kn: torch.Tensor,
    valid: torch.Tensor,
    rot: torch.Tensor,
    w: int,
    causal: bool,
    max_cache: int | None = None,
) -> torch.Tensor:
    """(B, H, L, L) union over rounds of 'same bucket, at most w bucket-mates away', by explicit loops."""
    b, h, n, _ = kn.shape
    buckets = _buckets(kn, rot)
    mask = torch.zeros(b, h, n, n, dtype=torch.bool)
    for bi in range(b):
        for hi in range(h):
            for r in range(rot.shape[0]):
                bk = buckets[bi, hi, r]
                for i in range(n):
                    if not valid[bi, i]:
                        continue
                    mates = [j for j in range(n) if valid[bi, j] and bk[j] == bk[i]]  # index order
                    pi = mates.index(i)
                    for pj, j in enumerate(mates):
                        d = pi - pj
                        if (0 <= d <= w) if causal else (abs(d) <= w):
                            mask[bi, hi, i, j] = True
    allowed = mask & valid[:, None, None, :]
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    if causal:
        allowed = allowed & (j <= i)
    if max_cache is not None:
        allowed = allowed & (i - j <= max_cache)
    return allowed


def _self_rule(allowed: torch.Tensor) -> torch.Tensor:
    """Shared-QK rule: never the own key, unless the query has no other key."""
    n = allowed.shape[-1]
    eye = torch.eye(n, dtype=torch.bool)
    others = allowed & ~eye
    alone = ~others.any(-1, keepdim=True)
    return others | (alone & eye)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize(
    "options",
    [
        dict(n_buckets=4, n_hashes=3, chunk_size=3),
        dict(n_buckets=2, n_hashes=1, chunk_size=2),
        dict(n_buckets=6, n_hashes=2, chunk_size=5, max_cache=6),
    ],
    ids=["4b-3r-c3", "2b-1r-c2", "6b-2r-c5-cache6"],
)
@pytest.mark.parametrize("path", ["dense", "chunked"])
def test_lsh_equals_reference_with_union_mask(causal: bool, options: dict, path: str) -> None:
    torch.manual_seed(1)
    att = _layer(causal=causal, **options)
    att.dense_chunks = 10**9 if path == "dense" else 0  # force the (T, S) grid or the sorted chunks
    b, h, n, d = 2, 2, 17, 8
    q, v = torch.randn(b, h, n, d, dtype=torch.float64), torch.randn(b, h, n, d, dtype=torch.float64)
    valid = torch.ones(b, n, dtype=torch.bool)
    valid[1, [3, 10]] = False  # key padding
    pos = torch.arange(n).expand(b, n)
    got = att.attend(q, q, v, pos, pos, valid, _ctx(b, n, causal))
    kn = F.normalize(q, dim=-1)
    allowed = _lsh_mask(kn, valid, att.rotations, options["chunk_size"], causal, options.get("max_cache"))
    allowed = allowed | torch.eye(n, dtype=torch.bool)  # padded queries see themselves
    ref = reference_attention(q, kn, v, mask=_self_rule(allowed))
    torch.testing.assert_close(got[:, :, :], ref, atol=1e-10, rtol=0)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize(
    "options", [dict(n_buckets=1, chunk_size=64), dict(n_buckets=1, chunk_size=20, n_hashes=3)]
)
def test_one_bucket_covering_the_sequence_is_full_attention_with_self_mask(
    causal: bool, options: dict
) -> None:
    torch.manual_seed(2)
    att = _layer(causal=causal, **options)
    b, h, n, d = 2, 2, 20, 8
    q, v = torch.randn(b, h, n, d, dtype=torch.float64), torch.randn(b, h, n, d, dtype=torch.float64)
    pos = torch.arange(n).expand(b, n)
    got = att.attend(q, q, v, pos, pos, torch.ones(b, n, dtype=torch.bool), _ctx(b, n, causal))
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    mask = (j < i) if causal else (j != i)
    mask = mask | ((i == 0) & (j == 0)) if causal else mask  # the first token has no other key
    ref = reference_attention(q, F.normalize(q, dim=-1), v, mask=mask)
    torch.testing.assert_close(got, ref, atol=1e-10, rtol=0)
    if causal:
        torch.testing.assert_close(got[:, :, 0], v[:, :, 0])  # alone: attends itself


def test_error_vs_full_self_masked_attention_falls_with_hash_rounds() -> None:
    b, h, n, d = 1, 2, 96, 8
    errors = {r: 0.0 for r in (1, 2, 4, 8)}
    seeds = range(5)
    for seed in seeds:
        g = torch.Generator().manual_seed(100 + seed)
        q = torch.randn(b, h, n, d, generator=g, dtype=torch.float64) * 1.5
        v = torch.randn(b, h, n, d, generator=g, dtype=torch.float64)
        pos = torch.arange(n).expand(b, n)
        exact = reference_attention(q, F.normalize(q, dim=-1), v, mask=~torch.eye(n, dtype=torch.bool))
        for r in errors:
            att = _layer(causal=False, n_buckets=8, chunk_size=8, n_hashes=r, seed=seed)
            got = att.attend(q, q, v, pos, pos, torch.ones(b, n, dtype=torch.bool), _ctx(b, n, False))
            errors[r] += float((got - exact).norm() / exact.norm()) / len(seeds)
    values = [errors[r] for r in (1, 2, 4, 8)]
    assert all(a > b_ for a, b_ in itertools.pairwise(values)), errors
    assert values[-1] < 0.6 * values[0], errors


def test_hash_is_angular_and_rounds_are_nested() -> None:
    torch.manual_seed(3)
    x = torch.randn(2, 2, 11, 8, dtype=torch.float64)
    att4 = _layer(n_buckets=8, n_hashes=4)
    att2 = _layer(n_buckets=8, n_hashes=2)
    rot = att4.rotations
    torch.testing.assert_close(hash_buckets(x, rot), hash_buckets(3.7 * x, rot))
    torch.testing.assert_close(hash_buckets(x, rot), _buckets(x, rot))
    assert hash_buckets(x, rot).max() < 8
    torch.testing.assert_close(att2.rotations, att4.rotations[:2])  # more rounds only add rounds


def test_shared_qk_and_per_layer_rotations() -> None:
    bb = inv.tiny_backbone(attention="lsh", position="rope")
    a0, a1 = (blk.attention for blk in bb.depth.blocks)
    assert a0.k_proj is a0.q_proj
    names = [n for n, _ in bb.named_parameters()]
    assert not any("k_proj" in n for n in names)  # registered once (under q_proj)
    assert not torch.equal(a0.rotations, a1.rotations)
    assert "depth.blocks.0.attention.rotations" in bb.state_dict()


def test_redraw_changes_rotations_only_in_training() -> None:
    bb = inv.tiny_backbone(
        attention="lsh", position="none", attention_options={"redraw": True, "chunk_size": 2}
    )
    x = torch.randn(2, 12, 16, dtype=torch.float64)
    stored = bb.depth.blocks[0].attention.rotations.clone()
    with torch.no_grad():
        torch.testing.assert_close(bb(x).y, bb(x).y)
        bb.train()
        y1, y2 = bb(x).y, bb(x).y
    assert not torch.allclose(y1, y2)
    torch.testing.assert_close(bb.depth.blocks[0].attention.rotations, stored)


@pytest.mark.parametrize(
    "options",
    [dict(n_buckets=4, n_hashes=3, chunk_size=2), dict(n_buckets=2, n_hashes=2, chunk_size=3, max_cache=5)],
    ids=["multi-chunk", "max_cache"],
)
def test_strictly_causal_and_streaming_with_several_chunks(options: dict) -> None:
    bb = inv.tiny_backbone(attention="lsh", position="rope", attention_options=options)
    for t in (3, 9, 15):
        inv.check_causal(bb, length=20, t=t)
    inv.check_streaming(bb, length=20)
    inv.check_reset(bb)
    if "max_cache" in options:
        _, state = inv.run_chunks(bb, torch.randn(2, 20, 16, dtype=torch.float64), [1] * 20)
        assert state.layers[0].length <= options["max_cache"]


@pytest.mark.parametrize("position", ["alibi", "shaw", "xl_relative"])
@pytest.mark.parametrize("path", ["dense", "chunked"])
def test_gathered_positions_match_dense_scheme(position: str, path: str) -> None:
    torch.manual_seed(4)
    opts = dict(n_buckets=4, n_hashes=2, chunk_size=3)
    att = _layer(causal=True, position=position, **opts)
    att.dense_chunks = 10**9 if path == "dense" else 0
    for p in att.position.parameters():  # make the scheme's terms visible
        p.data.normal_(0, 0.3)
    b, h, n, d = 2, 2, 13, 8
    q, v = torch.randn(b, h, n, d, dtype=torch.float64), torch.randn(b, h, n, d, dtype=torch.float64)
    pos = (torch.arange(n) + 5).expand(b, n)
    valid = torch.ones(b, n, dtype=torch.bool)
    got = att.attend(q, q, v, pos, pos, valid, _ctx(b, n, True))
    kn = F.normalize(q, dim=-1)
    mask = _self_rule(_lsh_mask(kn, valid, att.rotations, opts["chunk_size"], True))
    ref, _ = dense_attention(q, kn, v, mask[:, :, :, :], att.position, pos, pos, 0)
    torch.testing.assert_close(got, ref, atol=1e-10, rtol=0)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_dense_and_chunked_paths_agree_on_new_queries_over_a_cache(causal: bool) -> None:
    """T new queries over S > T keys (a streaming step / a training window after a cache) on both paths."""
    torch.manual_seed(5)
    att = _layer(causal=causal, position="rope", n_buckets=4, n_hashes=3, chunk_size=3, max_cache=9)
    b, h, s, t, d = 2, 2, 23, 5, 8
    k, v = torch.randn(b, h, s, d, dtype=torch.float64), torch.randn(b, h, s, d, dtype=torch.float64)
    valid = torch.ones(b, s, dtype=torch.bool)
    valid[0, [2, 7, 20]] = False
    pos = torch.arange(s).expand(b, s)
    out = {}
    for path, chunks in (("dense", 10**9), ("chunked", 0)):
        att.dense_chunks = chunks
        out[path] = att.attend(k[:, :, s - t :], k, v, pos[:, s - t :], pos, valid, _ctx(b, t, causal))
    kn = F.normalize(k, dim=-1)
    allowed = _lsh_mask(kn, valid, att.rotations, 3, causal, 9) | torch.eye(s, dtype=torch.bool)
    ref = reference_attention(k, kn, v, mask=_self_rule(allowed))[:, :, s - t :]
    torch.testing.assert_close(out["dense"], ref, atol=1e-10, rtol=0)
    torch.testing.assert_close(out["chunked"], ref, atol=1e-10, rtol=0)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("n_hashes", [1, 2, 3, 5])
def test_chunked_path_forward_and_gradients_match_the_reference(causal: bool, n_hashes: int) -> None:
    """The sorted-chunk path (row gathers, overlapping chunk windows, log N_ij by telescoping for R <= 3 and by
    log for R > 3) against the dense reference: outputs and gradients of q, k, v, several chunks, key padding."""
    torch.manual_seed(6)
    w = 3
    att = _layer(causal=causal, n_buckets=4, n_hashes=n_hashes, chunk_size=w)
    att.dense_chunks = 0
    b, h, n, d = 2, 2, 19, 8
    q, v = torch.randn(b, h, n, d, dtype=torch.float64), torch.randn(b, h, n, d, dtype=torch.float64)
    valid = torch.ones(b, n, dtype=torch.bool)
    valid[1, [0, 9, 18]] = False
    pos = torch.arange(n).expand(b, n)
    weight = torch.randn(b, h, n, d, dtype=torch.float64)
    grads = {}
    for name in ("got", "ref"):
        qq, vv = q.clone().requires_grad_(), v.clone().requires_grad_()
        if name == "got":
            out = att.attend(qq, qq, vv, pos, pos, valid, _ctx(b, n, causal))
        else:
            kn = F.normalize(qq, dim=-1)
            allowed = _lsh_mask(kn.detach(), valid, att.rotations, w, causal) | torch.eye(n, dtype=torch.bool)
            out = reference_attention(qq, kn, vv, mask=_self_rule(allowed))
        (out * weight).sum().backward()
        grads[name] = (out.detach(), qq.grad, vv.grad)
    for got, ref in zip(grads["got"], grads["ref"]):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, ref, atol=1e-9, rtol=0)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_chunked_path_keeps_batch_elements_apart(causal: bool) -> None:
    """A NaN in one batch element's values never reaches another element: the chunk windows outside a row are
    zeros, not the neighbouring row's values (a masked weight of 0 times NaN would be NaN)."""
    torch.manual_seed(7)
    att = _layer(causal=causal, n_buckets=4, n_hashes=2, chunk_size=3)
    att.dense_chunks = 0
    b, h, n, d = 3, 2, 13, 8
    q, v = torch.randn(b, h, n, d, dtype=torch.float64), torch.randn(b, h, n, d, dtype=torch.float64)
    v[1] = float("nan")
    valid = torch.ones(b, n, dtype=torch.bool)
    pos = torch.arange(n).expand(b, n)
    out = att.attend(q, q, v, pos, pos, valid, _ctx(b, n, causal))
    assert torch.isnan(out[1]).all()
    for i in (0, 2):
        alone = att.attend(
            q[i : i + 1], q[i : i + 1], v[i : i + 1], pos[:1], pos[:1], valid[:1], _ctx(1, n, causal)
        )
        assert torch.isfinite(out[i]).all()
        torch.testing.assert_close(out[i : i + 1], alone, atol=1e-12, rtol=0)


def test_reformer_preset_runs_reversible_and_merges_overrides() -> None:
    cfg = reformer_config(
        d_model=16, n_heads=2, n_layers=2, attention_options={"n_hashes": 3, "chunk_size": 4}
    )
    assert cfg.attention == "lsh" and cfg.block == "reversible" and cfg.block_options["ffn_chunks"] == 4
    assert cfg.attention_options["n_hashes"] == 3 and cfg.attention_options["n_buckets"] == 8
    torch.manual_seed(0)
    bb = Backbone(cfg).double()
    ref = Backbone(cfg.replace(block_options={"ffn_chunks": 4, "recompute": False})).double()
    ref.load_state_dict(bb.state_dict())
    x = torch.randn(2, 10, 16, dtype=torch.float64)
    y, y_ref = bb(x).y, ref(x).y
    torch.testing.assert_close(y, y_ref, atol=1e-10, rtol=0)
    y.pow(2).sum().backward()
    y_ref.pow(2).sum().backward()
    for (name, p), p_ref in zip(bb.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, p_ref.grad, atol=1e-8, rtol=1e-6, msg=name)
    with pytest.raises(ValueError, match="LSH preset"):
        reformer_config(attention="full")


def test_options_are_validated() -> None:
    with pytest.raises(ValueError, match="n_buckets must be 1 or an even"):
        _layer(n_buckets=3)
    with pytest.raises(ValueError, match="chunk_size"):
        _layer(chunk_size=0)
