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
