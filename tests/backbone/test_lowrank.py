"""``linformer`` and ``memory_compressed`` against independent references, sharing, streaming and errors."""

from __future__ import annotations

import copy

import pytest
import torch

from rl_transformers.backbone import Backbone, BackboneConfig
from rl_transformers.backbone.context import ForwardContext
from rl_transformers.backbone.reference import reference_attention
from tests.backbone import invariants as inv

torch.set_num_threads(1)


def _backbone(attention: str, causal: bool, n_layers: int = 1, **options: object) -> Backbone:
    torch.manual_seed(0)
    cfg = BackboneConfig(
        d_model=16, n_layers=n_layers, n_heads=2, position="none", causal=causal, attention=attention,
        attention_options=options,
    )  # fmt: skip
    return Backbone(cfg).double().eval()


def _ctx(b: int, t: int, causal: bool, valid=None) -> ForwardContext:
    valid = torch.ones(b, t, dtype=torch.bool) if valid is None else valid
    return ForwardContext(pos=torch.arange(t).expand(b, t), valid=valid, causal=causal)


# ------------------------------------------------------------------------------------------------------ linformer
def test_linformer_with_identity_projections_is_full_attention() -> None:
    n = 12
    att = _backbone("linformer", False, k=n, max_len=n, share="none").depth.blocks[0].attention
    with torch.no_grad():
        att.e.copy_(torch.eye(n).expand(2, n, n))
        att.f.copy_(torch.eye(n).expand(2, n, n))
    q, k, v = (torch.randn(2, 2, n, 8, dtype=torch.float64) for _ in range(3))
    pos = torch.arange(n).expand(2, n)
    got = att.attend(q, k, v, pos, pos, torch.ones(2, n, dtype=torch.bool), _ctx(2, n, False))
    torch.testing.assert_close(got, reference_attention(q, k, v), atol=1e-10, rtol=0)
    # and a whole backbone equals the full-attention backbone with the same weights
    lin = _backbone("linformer", False, n_layers=2, k=n, max_len=n, share="key_value")
    full = _backbone("full", False, n_layers=2)
    lin.load_state_dict(full.state_dict(), strict=False)
    for blk in lin.depth.blocks:
        with torch.no_grad():
            blk.attention.e.copy_(torch.eye(n)[None])
    x = torch.randn(2, n, 16, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(lin(x).y, full(x).y, atol=1e-10, rtol=0)


def test_linformer_short_sequences_use_the_first_columns_and_ignore_padding() -> None:
    att = _backbone("linformer", False, k=5, max_len=20, share="headwise").depth.blocks[0].attention
    b, n, d = 2, 9, 8
    q, k, v = (torch.randn(b, 2, n, d, dtype=torch.float64) for _ in range(3))
    valid = torch.ones(b, n, dtype=torch.bool)
    valid[1, [2, 6]] = False
    pos = torch.arange(n).expand(b, n)
    got = att.attend(q, k, v, pos, pos, valid, _ctx(b, n, False, valid))
    e, f = att.e[0, :, :n], att.f[0, :, :n]
    keep = valid[:, None, :, None].double()
    kp = torch.einsum("ns,bhsd->bhnd", e, k * keep)
    vp = torch.einsum("ns,bhsd->bhnd", f, v * keep)
    torch.testing.assert_close(got, reference_attention(q, kp, vp), atol=1e-10, rtol=0)
    v2 = v.clone()
    v2[1, :, 2] += 5.0  # a padded key's value changes nothing
    again = att.attend(q, k, v2, pos, pos, valid, _ctx(b, n, False, valid))
    torch.testing.assert_close(again, got)
    with pytest.raises(ValueError, match="max_len=20"):
        att.attend(q, torch.randn(b, 2, 21, d), torch.randn(b, 2, 21, d), pos, pos, valid, _ctx(b, n, False))


@pytest.mark.parametrize(
    ("share", "n_params"),
    [
        ("none", 2 * 2 * 4 * 10 * 2),
        ("headwise", 2 * 4 * 10 * 2),
        ("key_value", 4 * 10 * 2),
        ("layerwise", 4 * 10),
    ],
)
def test_linformer_sharing_registers_each_projection_once(share: str, n_params: int) -> None:
    bb = _backbone("linformer", False, n_layers=2, k=4, max_len=10, share=share)
    proj = {n: p for n, p in bb.named_parameters() if n.endswith(("attention.e", "attention.f"))}
    assert sum(p.numel() for p in proj.values()) == n_params
    assert sum(1 for n in bb.state_dict() if n.endswith(("attention.e", "attention.f"))) == len(proj)
    if share == "layerwise":
        a0, a1 = (blk.attention for blk in bb.depth.blocks)
        assert a1.projections[0] is a0.e and a0.projections[1] is a0.e
        # both layers feed the one gradient; a copy and a reloaded model keep the sharing
        x = torch.randn(2, 7, 16, dtype=torch.float64)
        bb.zero_grad()
        bb(x).y.sum().backward()
        grad_both = a0.e.grad.clone()
        bb.zero_grad()
        with torch.no_grad():  # layer 0 frozen: the gradient comes from layer 1 alone
            h0 = bb.depth.blocks[0](x, _ctx(2, 7, False), None)[0]
        bb.depth.blocks[1](h0, _ctx(2, 7, False), None)[0].sum().backward()
        assert a0.e.grad.abs().sum() > 0 and not torch.allclose(a0.e.grad, grad_both)
        twin = copy.deepcopy(bb)
        assert twin.depth.blocks[1].attention.projections[0] is twin.depth.blocks[0].attention.e
        fresh = _backbone("linformer", False, n_layers=2, k=4, max_len=10, share=share)
        fresh.load_state_dict(bb.state_dict())
        with torch.no_grad():
            torch.testing.assert_close(fresh(x).y, bb(x).y)
            assert fresh.depth.blocks[1].attention.projections[0] is fresh.depth.blocks[0].attention.e


def test_linformer_rejects_causal_with_the_reason() -> None:
    with pytest.raises(
        ValueError, match=r"'linformer' does not support causal=True \(it needs the whole sequence\)"
    ):
        BackboneConfig(attention="linformer", causal=True)
    with pytest.raises(ValueError, match=r"linformer share='headwize'.*Did you mean 'headwise'"):
        BackboneConfig(attention="linformer", causal=False, attention_options={"share": "headwize"})
    with pytest.raises(ValueError, match="cannot use position 'alibi'"):
        BackboneConfig(attention="linformer", causal=False, position="alibi")


# ---------------------------------------------------------------------------------------------- memory_compressed
def _compress(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor, c: int, per_head: bool) -> torch.Tensor:
    """(B, H, L, D) -> (B, H, ceil(L/c), D) by an explicit loop over blocks (zero-padded last block)."""
    b, h, n, d = x.shape
    nb = -(-n // c)
    out = torch.zeros(b, h, nb, d, dtype=x.dtype)
    for blk in range(nb):
        for s in range(c):
            j = blk * c + s
            if j < n:
                wt = w[:, s] if per_head else w[s].expand(h, d, d)
                out[:, :, blk] += torch.einsum("bhd,hde->bhe", x[:, :, j], wt)
        out[:, :, blk] += bias if per_head else bias.expand(h, d)
    return out


def _compressed_mask(n: int, c: int, causal: bool, local: bool, valid: torch.Tensor) -> torch.Tensor:
    """(B, 1, L, nb + L): columns = compressed blocks then raw keys, built by loops."""
    b = valid.shape[0]
    nb = -(-n // c)
    mask = torch.zeros(b, 1, n, nb + n, dtype=torch.bool)
    for bi in range(b):
        for i in range(n):
            for blk in range(nb):
                members = range(blk * c, min(n, blk * c + c))
                if not any(bool(valid[bi, j]) for j in members):
                    continue
                if causal:
                    ok = blk < i // c if local else blk * c + c - 1 <= i
                else:
                    ok = blk != i // c if local else True
                mask[bi, 0, i, blk] = ok
            for j in range(n):
                same = j // c == i // c
                ok = local and same and bool(valid[bi, j]) and (j <= i or not causal)
                mask[bi, 0, i, nb + j] = ok or j == i
    return mask


@pytest.mark.usefixtures("kernel_path")
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("local", [True, False], ids=["local", "compressed-only"])
@pytest.mark.parametrize("per_head", [True, False], ids=["per-head", "shared"])
def test_memory_compressed_matches_conv_then_reference(causal: bool, local: bool, per_head: bool) -> None:
    c, b, n, d = 3, 2, 14, 8
    att = (
        _backbone("memory_compressed", causal, rate=c, local=local, per_head=per_head)
        .depth.blocks[0]
        .attention
    )
    with torch.no_grad():
        for p in (att.conv_k, att.conv_v, att.bias_k, att.bias_v):
            p.add_(0.3 * torch.randn_like(p))
    q, k, v = (torch.randn(b, 2, n, d, dtype=torch.float64) for _ in range(3))
    valid = torch.ones(b, n, dtype=torch.bool)
    valid[1, [4, 9, 10, 11]] = False  # block 3 of row 1 entirely padding
    pos = torch.arange(n).expand(b, n)
    got, _ = att.core(q, k, v, pos, pos, valid, _ctx(b, n, causal, valid), None)
    keep = valid[:, None, :, None].double()
    ck = _compress(k * keep, att.conv_k, att.bias_k, c, per_head)
    cv = _compress(v * keep, att.conv_v, att.bias_v, c, per_head)
    mask = _compressed_mask(n, c, causal, local, valid)
    ref = reference_attention(q, torch.cat([ck, k], 2), torch.cat([cv, v], 2), mask=mask)
    real = valid[:, None, :, None].expand_as(got)  # padded queries' outputs are unspecified (ignored)
    torch.testing.assert_close(got[real], ref[real], atol=1e-10, rtol=0)


@pytest.mark.usefixtures("kernel_path")
def test_rate_one_with_identity_convolution_is_full_causal_attention() -> None:
    x = torch.randn(2, 11, 16, dtype=torch.float64)
    mc = inv.tiny_backbone(attention="memory_compressed", attention_options={"rate": 1})  # init = identity
    full = inv.tiny_backbone(attention="full")
    full.load_state_dict(mc.state_dict(), strict=False)
    with torch.no_grad():
        torch.testing.assert_close(mc(x).y, full(x).y, atol=1e-10, rtol=0)


@pytest.mark.usefixtures("kernel_path")
@pytest.mark.parametrize(
    "options", [dict(rate=2), dict(rate=4, local=False), dict(rate=3, per_head=False)], ids=["c2", "c4", "c3"]
)
def test_memory_compressed_streams_exactly_with_a_small_state(options: dict) -> None:
    bb = inv.tiny_backbone(attention="memory_compressed", position="rope", attention_options=options)
    for t in (2, 7):
        inv.check_causal(bb, length=14, t=t)
    inv.check_streaming(bb, length=20)
    inv.check_reset(bb, prefix=7)
    _, state = inv.run_chunks(bb, torch.randn(2, 20, 16, dtype=torch.float64), [1] * 20)
    layer = state.layers[0]
    c = options["rate"]
    assert layer.ck.shape[2] == 20 // c and bool(layer.cvalid.all())
    assert layer.pk.shape[2] == c and int(layer.pvalid.sum(-1)[0]) == 20 % c


def test_memory_compressed_rejects_a_memory_module() -> None:
    with pytest.raises(ValueError, match="memory=None"):
        BackboneConfig(attention="memory_compressed", memory="xl")
