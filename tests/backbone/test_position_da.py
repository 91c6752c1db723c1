"""``da`` (DA-Transformer, Wu et al. 2021) against a per-pair reference of its formula.

logits_ij = ReLU(q_i·k_j)·R̂_h(|i - j|)/sqrt(D), R̂_h(R) = (1 + exp(v_h)) / (1 + exp(v_h - w_h·R)), then the
masked softmax. The reference computes R̂ pair by pair with python floats and hands ``reference_attention``
the weight R̂_ij·[q_i·k_j > 0] (the reference multiplies the scaled q·k by it, which equals ReLU(q·k)·R̂).
"""

from __future__ import annotations

import math

import pytest
import torch

from rl_transformers.backbone import Backbone, BackboneConfig
from rl_transformers.backbone.attention.base import dense_attention
from rl_transformers.backbone.reference import causal_mask, reference_attention
from tests.backbone import invariants as inv

torch.set_num_threads(1)


@torch.no_grad()
def ref_weight(position, q_pos: torch.Tensor, k_pos: torch.Tensor, layer: int = 0) -> torch.Tensor:
    """R̂ (B, H, Tq, Tk) from the paper's formula, pair by pair."""
    b, tq, tk = q_pos.shape[0], q_pos.shape[-1], k_pos.shape[-1]
    out = torch.zeros(b, position.n_heads, tq, tk, dtype=torch.float64)
    for bi in range(b):
        for h in range(position.n_heads):
            w, v = float(position.w[layer, h]), float(position.v[layer, h])
            for i in range(tq):
                for j in range(tk):
                    r = abs(int(q_pos[bi, i] - k_pos[bi, j]))
                    out[bi, h, i, j] = (1 + math.exp(v)) / (1 + math.exp(v - w * r))
    return out


def ref_attention(position, q, k, v, q_pos, k_pos, mask, layer: int = 0) -> torch.Tensor:
    weight = ref_weight(position, q_pos, k_pos, layer) * (q @ k.transpose(-1, -2) > 0)
    return reference_attention(q, k, v, mask=mask, weight=weight)


def backbone(causal: bool = True, n_layers: int = 1, seed: int = 0, **attention) -> Backbone:
    torch.manual_seed(seed)
    cfg = BackboneConfig(
        d_model=16, n_layers=n_layers, n_heads=2, position="da", causal=causal, attention_options=attention
    )
    bb = Backbone(cfg).double().eval()
    with torch.no_grad():  # one head favouring near keys, one favouring far keys, per layer
        bb.position.w.copy_(
            torch.tensor([[-0.8, 0.5]]).expand(n_layers, -1) + 0.1 * torch.arange(n_layers)[:, None]
        )
        bb.position.v.normal_(0.0, 1.0)
    return bb


def positions(
    b: int, tq: int, tk: int, start: tuple[int, ...] = (3, 11)
) -> tuple[torch.Tensor, torch.Tensor]:
    k_pos = torch.stack([torch.arange(s, s + tk) for s in start[:b]])
    return k_pos[:, tk - tq :], k_pos


def qkv(b: int = 2, tq: int = 5, tk: int = 8, d: int = 8, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, 2, t, d, generator=g, dtype=torch.float64) for t in (tq, tk, tk))


def test_weight_function_shape() -> None:
    """R̂(0) = 1; w > 0: increasing to the bound 1 + e^v; w < 0: decreasing to 0."""
    position = backbone().position
    with torch.no_grad():
        position.w.copy_(torch.tensor([[2.0, -2.0]]))
        position.v.copy_(torch.tensor([[0.5, 0.5]]))
    dist = torch.arange(0, 60)
    weight = position.weight(torch.tensor([[59]]), (59 - dist)[None], 0, torch.float64)[0, :, 0].detach()
    torch.testing.assert_close(weight[:, 0], torch.ones(2, dtype=torch.float64), atol=1e-15, rtol=0)
    assert (weight[0, 1:] >= weight[0, :-1]).all() and weight[0, 1] > weight[0, 0]
    assert weight[0, -1] == pytest.approx(1 + math.exp(0.5))
    assert (weight[1, 1:] <= weight[1, :-1]).all() and weight[1, -1] < 1e-40
    assert torch.isfinite(weight).all()


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_dense_attention_matches_pair_reference(causal: bool) -> None:
    position = backbone(causal=causal, n_layers=2).position
    q, k, v = qkv()
    q_pos, k_pos = positions(2, 5, 8)
    if not causal:
        q_pos = k_pos[:, 1:6]
    mask = causal_mask(5, 8) if causal else None
    for layer in (0, 1):
        got, _ = dense_attention(q, k, v, mask, position, q_pos, k_pos, layer)
        torch.testing.assert_close(
            got, ref_attention(position, q, k, v, q_pos, k_pos, mask, layer), atol=1e-12, rtol=0
        )


def test_block_dims() -> None:
    position = backbone().position
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 2, 3, t, 8, generator=g, dtype=torch.float64) for t in (4, 6, 6))
    k_pos = torch.arange(36).view(2, 3, 6) * 2
    q_pos = k_pos[..., 2:] + 1
    got, _ = dense_attention(q, k, v, None, position, q_pos, k_pos, 0)
    for blk in range(3):
        want = ref_attention(
            position, q[:, :, blk], k[:, :, blk], v[:, :, blk], q_pos[:, blk], k_pos[:, blk], None
        )
        torch.testing.assert_close(got[:, :, blk], want, atol=1e-12, rtol=0)


def test_shift_invariant() -> None:
    position = backbone().position
    assert position.shift_invariant
    q, k, _ = qkv()
    q_pos, k_pos = positions(2, 5, 8)
    base = position.logits(q, k, q_pos, k_pos, 0)
    for c in (1, 50, 100_000):
        torch.testing.assert_close(position.logits(q, k, q_pos + c, k_pos + c, 0), base, atol=1e-12, rtol=0)


MODES = [
    pytest.param(True, None, id="causal"),
    pytest.param(False, None, id="bidirectional"),
    pytest.param(True, 3, id="causal-window3"),
]


@pytest.mark.parametrize(("causal", "window"), MODES)
def test_backbone_layer_matches_reference(causal: bool, window: int | None) -> None:
    bb = backbone(causal=causal, **({"max_cache": window} if window else {}))
    length = 11
    x = torch.randn(2, length, 16, dtype=torch.float64)
    att = bb.depth.blocks[0].attention
    seen: dict[str, torch.Tensor] = {}
    handle = att.register_forward_hook(lambda m, args, out: seen.update(x=args[0], y=out[0]))
    with torch.no_grad():
        bb(x)
    handle.remove()
    q, k, v = (att.split_heads(p(seen["x"])) for p in (att.q_proj, att.k_proj, att.v_proj))
    pos = torch.arange(length).expand(2, length)
    i, j = torch.arange(length)[:, None], torch.arange(length)[None, :]
    mask = (j <= i) if causal else torch.ones(length, length, dtype=torch.bool)
    if window is not None:
        mask = mask & (i - j <= window)
    want = att.o_proj(att.merge_heads(ref_attention(bb.position, q, k, v, pos, pos, mask)))
    torch.testing.assert_close(seen["y"], want, atol=1e-10, rtol=0)
    if window is not None:  # windowed streaming: chunked == full run
        with torch.no_grad():
            full = bb(x).y
            for sizes in inv.chunkings(length):
                got, _ = inv.run_chunks(bb, x, sizes)
                torch.testing.assert_close(got, full, atol=1e-9, rtol=0)


def test_weights_receive_gradients_at_default_init() -> None:
    torch.manual_seed(0)
    bb = Backbone(BackboneConfig(d_model=16, n_layers=2, n_heads=2, position="da")).double()
    bb(torch.randn(2, 9, 16, dtype=torch.float64)).y.pow(2).mean().backward()
    for name in ("w", "v"):
        grad = getattr(bb.position, name).grad
        assert grad is not None and torch.isfinite(grad).all()
        assert (grad != 0).all(), f"{name}: some layer / head got no gradient"
