"""Per-forward caches of the acting path change no number.

The backbone shares, across the layers of one forward, the memory keys' positions / validity
(``attention.base.memory_keys``), the attention masks built from them (``shared_mask``) and xl_relative's
position analysis and sinusoid tables (``XLRelativePosition.layout`` / ``table``); blocks skip dropout calls
with p = 0. Each cache is checked against the same computation with the cache defeated (bit-equal), and the
xl_relative term of every layer against the float64 pair loop of ``test_position_relative`` while the layout
cache is hit (layer 1 must use its own W_R) and after the positions change (the cache must miss).
"""

from __future__ import annotations

import copy
import math
import pickle
from unittest import mock

import pytest
import torch

from rl_transformers.backbone import Backbone, BackboneConfig
from rl_transformers.backbone.attention import base as attention_base
from rl_transformers.backbone.attention import full as full_module
from rl_transformers.backbone.position.relative import XLRelativePosition
from tests.backbone.test_position_relative import backbone, positions, qkv, ref_scores_bias

torch.set_num_threads(1)


def gtrxl(window: int | None = 4, dropout: float = 0.0, dtype: torch.dtype = torch.float64) -> Backbone:
    torch.manual_seed(0)
    cfg = BackboneConfig(
        d_model=16,
        n_layers=3,
        n_heads=2,
        position="xl_relative",
        memory="xl",
        block="gtrxl",
        memory_options={"mem_len": 4},
        attention_options={"max_cache": window},
        dropout=dropout,
    )
    return Backbone(cfg).to(dtype).eval()


def stream(bb: Backbone, x: torch.Tensor, resets: torch.Tensor) -> torch.Tensor:
    """One token per step with per-row resets (the rollout's acting path)."""
    state, ys = None, []
    with torch.inference_mode():
        for t in range(x.shape[1]):
            out = bb(x[:, t : t + 1], state, reset=resets[:, t])
            ys.append(out.y)
            state = out.state
    return torch.cat(ys, dim=1)


def uncached() -> mock._patch:
    """Defeat every per-forward cache: masks rebuilt, keys re-concatenated, layout / tables recomputed."""

    def rebuild_mask(ctx, key, k_valid, build):
        return build()

    def fresh_keys(ctx, mem):
        return torch.cat([mem.pos, ctx.pos], dim=1), torch.cat([mem.valid, ctx.valid], dim=1)

    original_layout = XLRelativePosition.layout

    def fresh_layout(self, q_pos, k_pos):
        self._layout, self._tables = None, {}
        return original_layout(self, q_pos, k_pos)

    patches = [
        mock.patch.object(full_module, "shared_mask", rebuild_mask),
        mock.patch.object(attention_base, "memory_keys", fresh_keys),
        mock.patch.object(XLRelativePosition, "layout", fresh_layout),
    ]

    class _All:
        def __enter__(self):
            for p in patches:
                p.start()

        def __exit__(self, *exc):
            for p in patches:
                p.stop()

    return _All()  # type: ignore[return-value]


@pytest.mark.parametrize("window", [None, 2, 4], ids=["unbounded", "window_2", "window_mem_len"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_streaming_with_resets_is_bit_equal_to_uncached(window: int | None, dtype: torch.dtype) -> None:
    bb = gtrxl(window, dtype=dtype)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 14, 16, generator=g).to(dtype)
    resets = torch.rand(3, 14, generator=g) < 0.2  # rows reset at different times: gather and rel-shift paths
    resets[:, 0] = True
    got = stream(bb, x, resets)
    with uncached():
        want = stream(bb, x, resets)
    assert torch.equal(got, want)


def test_training_pass_after_acting_is_bit_equal_and_differentiable() -> None:
    """Tables cached under inference_mode are never reused by a grad-mode pass (inference tensors cannot be
    saved for backward); a training pass equals the uncached one, gradients included."""
    bb = gtrxl(dtype=torch.float32).train()
    x = torch.randn(2, 6, 16)
    stream(bb, x, torch.zeros(2, 6, dtype=torch.bool))

    def loss_and_grads() -> tuple[torch.Tensor, list[torch.Tensor]]:
        bb.zero_grad()
        y = bb(x).y
        y.square().sum().backward()
        return y.detach(), [p.grad.clone() for p in bb.parameters() if p.grad is not None]

    y, grads = loss_and_grads()
    with uncached():
        y_ref, grads_ref = loss_and_grads()
    assert torch.equal(y, y_ref)
    assert len(grads) == len(grads_ref) and all(torch.equal(a, b) for a, b in zip(grads, grads_ref))


@pytest.mark.parametrize("layout", ["contiguous", "reset_row", "sparse"])
def test_xl_layout_cache_hit_uses_each_layers_projection(layout: str) -> None:
    position = backbone("xl_relative", n_layers=2).position
    q, k, _ = qkv()
    q_pos, k_pos = positions(2, 5, 8)
    if layout == "reset_row":
        k_pos = k_pos.clone()
        k_pos[1, :3] = 0
    elif layout == "sparse":  # span > Tq + Tk: the torch.unique path
        k_pos = k_pos.clone()
        k_pos[0, :2] = torch.tensor([-500, -300])
    for layer in (0, 1, 1, 0):  # the second and later calls hit the cache
        got = position.logits(q, k, q_pos, k_pos, layer)
        want = q @ k.transpose(-1, -2) / math.sqrt(8) + ref_scores_bias(
            position, "xl_relative", q, k, q_pos, k_pos, layer
        )
        torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    q_pos2, k_pos2 = positions(2, 5, 8, start=(7, 0))  # new positions: the cache must miss
    got = position.logits(q, k, q_pos2, k_pos2, 1)
    want = q @ k.transpose(-1, -2) / math.sqrt(8) + ref_scores_bias(
        position, "xl_relative", q, k, q_pos2, k_pos2, 1
    )
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


def test_copies_and_pickles_start_with_empty_caches() -> None:
    bb = gtrxl()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    stream(bb, x, torch.zeros(2, 5, dtype=torch.bool))
    assert bb.position._tables  # (XL memory keys are column-aligned: the table path, no layout analysis)
    for clone in (copy.deepcopy(bb), pickle.loads(pickle.dumps(bb))):
        assert clone.position._tables == {} and clone.position._layout is None
        assert torch.equal(
            stream(clone, x, torch.zeros(2, 5, dtype=torch.bool)),
            stream(bb, x, torch.zeros(2, 5, dtype=torch.bool)),
        )


def test_zero_dropout_in_training_mode_equals_eval_and_draws_no_random_numbers() -> None:
    bb = gtrxl(dropout=0.0, dtype=torch.float32)
    x = torch.randn(2, 7, 16)
    with torch.no_grad():
        want = bb.eval()(x).y
        torch.manual_seed(5)
        got = bb.train()(x).y
        after = torch.rand(4)
    torch.manual_seed(5)
    assert torch.equal(got, want) and torch.equal(after, torch.rand(4))


def test_positive_dropout_still_drops_in_training_mode() -> None:
    bb = gtrxl(dropout=0.5, dtype=torch.float32)
    x = torch.randn(2, 7, 16)
    with torch.no_grad():
        assert not torch.equal(bb.train()(x).y, bb.eval()(x).y)
