"""``full`` attention against the float64 dense reference, SDPA vs dense path, padding and the KV-cache window."""

from __future__ import annotations

import pytest
import torch

from rl_transformers.backbone import Backbone, BackboneConfig
from rl_transformers.backbone.attention.base import visible_mask
from rl_transformers.backbone.context import ForwardContext
from rl_transformers.backbone.reference import causal_mask, reference_attention
from tests.backbone import invariants as inv


def _layer(causal: bool = True, **options: object):
    cfg = BackboneConfig(
        d_model=16, n_layers=1, n_heads=2, position="none", causal=causal, attention_options=options
    )
    return Backbone(cfg).depth.blocks[0].attention


def _ctx(b: int, t: int, valid=None, causal=True) -> ForwardContext:
    pos = torch.arange(t).expand(b, t)
    valid = torch.ones(b, t, dtype=torch.bool) if valid is None else valid
    return ForwardContext(pos=pos, valid=valid, causal=causal)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("force_dense", [False, True], ids=["sdpa", "dense"])
def test_full_matches_reference(causal: bool, force_dense: bool) -> None:
    att = _layer(causal=causal, force_dense=force_dense)
    b, h, t, d = 2, 2, 7, 8
    q, k, v = (torch.randn(b, h, t, d) for _ in range(3))
    pos = torch.arange(t).expand(b, t)
    valid = torch.ones(b, t, dtype=torch.bool)
    got = att.attend(q, k, v, pos, pos, valid, _ctx(b, t, causal=causal))
    mask = causal_mask(t) if causal else None
    torch.testing.assert_close(got.double(), reference_attention(q, k, v, mask=mask), atol=1e-6, rtol=1e-6)


def test_key_padding_masks_keys_but_never_empties_a_row() -> None:
    att = _layer(causal=False)
    b, h, t, d = 1, 2, 5, 4
    q, k, v = (torch.randn(b, h, t, d) for _ in range(3))
    valid = torch.tensor([[False, True, True, False, True]])
    pos = torch.arange(t)[None]
    got = att.attend(q, k, v, pos, pos, valid, _ctx(b, t, valid, causal=False))
    mask = visible_mask(t, valid, causal=False)
    assert mask[0, 0, 0].tolist() == [True, True, True, False, True]  # padded query still sees itself
    ref = reference_attention(q, k, v, mask=mask)
    torch.testing.assert_close(got.double(), ref, atol=1e-6, rtol=1e-6)
    # real queries ignore padded keys: changing a padded key's value changes nothing for them
    v2 = v.clone()
    v2[:, :, 3] += 10
    got2 = att.attend(q, k, v2, pos, pos, valid, _ctx(b, t, valid, causal=False))
    torch.testing.assert_close(got[:, :, [1, 2, 4]], got2[:, :, [1, 2, 4]])


def test_max_cache_is_a_sliding_window_in_full_and_streaming_runs() -> None:
    w, length = 3, 11
    bb = inv.tiny_backbone(attention="full", attention_options={"max_cache": w}, position="rope")
    ref = inv.tiny_backbone(attention="full", position="rope")  # same seed -> same weights
    x = torch.randn(2, length, 16, dtype=torch.float64)
    with torch.no_grad():
        full = bb(x).y
        for sizes in inv.chunkings(length):
            got, state = inv.run_chunks(bb, x, sizes)
            torch.testing.assert_close(got, full, atol=1e-9, rtol=0)
            assert state.layers[0].length <= w
        # the first w+1 tokens see their whole past: identical to unbounded attention there
        unbounded = ref(x).y
    torch.testing.assert_close(full[:, : w + 1], unbounded[:, : w + 1], atol=1e-9, rtol=0)
    assert not torch.allclose(full[:, w + 1 :], unbounded[:, w + 1 :])


def test_sdpa_and_dense_paths_agree_inside_a_backbone() -> None:
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    a = inv.tiny_backbone(position="rope")
    b = inv.tiny_backbone(position="rope", attention_options={"force_dense": True})
    with torch.no_grad():
        torch.testing.assert_close(a(x).y, b(x).y, atol=1e-10, rtol=0)


def test_info_diagnostics_only_when_requested() -> None:
    bb = inv.tiny_backbone(block="gtrxl", position="none")
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    assert bb(x).info == {}
    bb.collect_info = True
    info = bb(x).info
    assert "backbone/attention_entropy/layer0" in info and "backbone/gate_openness/layer1" in info


def test_without_sinks_there_are_no_sink_parameters() -> None:
    """``sink`` = 0 (the default) adds nothing: the parameters of plain multi-head attention only."""
    names = {n for n, _ in _layer().named_parameters()}
    assert names == {f"{p}_proj.{w}" for p in "qkvo" for w in ("weight", "bias")}
    assert {n for n, _ in _layer(sink=2).named_parameters()} - names == {"sinks.k", "sinks.v"}


@pytest.mark.parametrize("position", ["none", "rope", "alibi"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_sinks_are_slots_prepended_to_the_keys(position: str, causal: bool) -> None:
    """With sinks: the float64 reference over [sink keys; keys] and [sink values; values], the sink columns
    visible to every query and free of position terms, inside a backbone with rope / alibi / padding."""
    cfg = BackboneConfig(
        d_model=16, n_layers=1, n_heads=2, position=position, causal=causal, attention_options={"sink": 3}
    )
    torch.manual_seed(0)
    bb = Backbone(cfg).double()
    att = bb.depth.blocks[0].attention
    with torch.no_grad():
        att.sinks.k.normal_()  # well away from zero: the slots take a visible share
        att.sinks.v.normal_()
    b, h, t, d = 2, 2, 6, 8
    q, k, v = (torch.randn(b, h, t, d, dtype=torch.float64) for _ in range(3))
    pos = torch.arange(t).expand(b, t)
    valid = torch.tensor([[True] * t, [False, True, True, True, False, True]])
    ctx = ForwardContext(pos=pos, valid=valid, causal=causal)
    qr, kr = att.position.transform_q(q, pos, 0), att.position.transform_k(k, pos, 0)
    got = att.attend(qr, kr, v, pos, pos, valid, ctx)
    keys = torch.cat([att.sinks.k.expand(b, -1, -1, -1), kr], dim=2)
    values = torch.cat([att.sinks.v.expand(b, -1, -1, -1), v], dim=2)
    mask = torch.cat([torch.ones(b, 1, t, 3, dtype=torch.bool), visible_mask(t, valid, causal)], dim=-1)
    bias = att.position.bias(pos, pos, 0)
    if bias is not None:  # alibi's bias on the real keys only
        bias = torch.cat([torch.zeros(*bias.shape[:-1], 3, dtype=bias.dtype), bias], dim=-1)
    want = reference_attention(qr, keys, values, mask=mask, bias=bias)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    plain = _layer(causal=causal).double()
    plain.load_state_dict(att.state_dict(), strict=False)
    assert not torch.allclose(got, plain.attend(qr, kr, v, pos, pos, valid, ctx), atol=1e-3)


@pytest.mark.parametrize("options", [{"sink": 2}, {"sink": 1, "max_cache": 3}])
def test_sinks_stream_and_reset_exactly(options: dict) -> None:
    bb = inv.tiny_backbone(attention="full", position="rope", attention_options=options)
    inv.check_streaming(bb)
    inv.check_reset(bb)


def test_bad_sink_is_refused() -> None:
    with pytest.raises(ValueError, match="sink must be a non-negative int"):
        BackboneConfig(attention_options={"sink": -1})
