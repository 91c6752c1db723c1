"""``adaptive_span``: soft-ramp mask vs the dense reference, span >= L == full, gradients to spans, cost ∝ span."""

from __future__ import annotations

import pytest
import torch

from rl_transformers.backbone.context import ForwardContext
from rl_transformers.backbone.reference import causal_mask, reference_attention
from tests.backbone import invariants as inv


def _layer(**options):
    bb = inv.tiny_backbone(attention="adaptive_span", attention_options=options, position="none", n_layers=1)
    return bb, bb.depth.blocks[0].attention


def _ctx(t: int) -> ForwardContext:
    return ForwardContext(
        pos=torch.arange(t)[None], valid=torch.ones(1, t, dtype=torch.bool), causal=True, info={}
    )


@pytest.mark.parametrize("t", [1, 9, 23])
def test_matches_reference_with_explicit_ramp(t: int) -> None:
    _, att = _layer(max_span=8, ramp=3, query_block=4)
    with torch.no_grad():
        att.span_frac.copy_(torch.tensor([0.25, 0.6], dtype=torch.float64))  # z = 2 and 4.8
    q, k, v = (torch.randn(1, 2, t, 8, dtype=torch.float64) for _ in range(3))
    got = att.attend(
        q, k, v, torch.arange(t)[None], torch.arange(t)[None], torch.ones(1, t, dtype=torch.bool), _ctx(t)
    )
    # m_z(x) = clamp((R + z - x) / R, 0, 1), written out per head and pair
    m = torch.zeros(2, t, t, dtype=torch.float64)
    for h, z in enumerate((2.0, 4.8)):
        for i in range(t):
            for j in range(i + 1):
                m[h, i, j] = min(1.0, max(0.0, (3 + z - (i - j)) / 3))
    mask = (m > 0) & causal_mask(t)
    bias = torch.where(mask, m.clamp_min(1e-300).log(), torch.zeros_like(m))
    ref = reference_attention(q, k, v, mask=mask[None], bias=bias[None])
    torch.testing.assert_close(got, ref, atol=1e-10, rtol=0)


def test_spans_beyond_every_distance_take_the_fused_path_exactly() -> None:
    """z > max distance: every ramp value is clamped at 1, so output and gradients are plain causal attention."""
    t = 9
    _, att = _layer(max_span=16, ramp=3, query_block=4)
    with torch.no_grad():
        att.span_frac.copy_(torch.tensor([0.51, 0.9], dtype=torch.float64))  # z = 8.16, 14.4 > 8 = max i - j
    q, k, v = (torch.randn(1, 2, t, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    pos, valid = torch.arange(t)[None], torch.ones(1, t, dtype=torch.bool)
    got = att.attend(q, k, v, pos, pos, valid, _ctx(t))
    dist = (torch.arange(t)[:, None] - torch.arange(t)[None, :]).to(torch.float64)
    z = (att.span_frac.clamp(0.0, 1.0) * 16).view(2, 1, 1)
    ramp = ((3 + z - dist) / 3).clamp(0.0, 1.0)  # with autograd: the reference's span gradient
    mask = causal_mask(t)
    ref = reference_attention(q, k, v, mask=mask[None], bias=ramp.clamp_min(1e-300).log()[None])
    torch.testing.assert_close(got, ref, atol=1e-10, rtol=0)
    w = torch.randn_like(ref)
    g_got = torch.autograd.grad((got * w).sum(), [q, k, v])
    g_ref = torch.autograd.grad((ref * w).sum(), [q, k, v, att.span_frac])
    for a, b in zip(g_got, g_ref[:3]):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)
    assert float(g_ref[3].abs().max()) == 0.0  # saturated ramp: no span gradient in the reference either


def test_span_covering_sequence_equals_full() -> None:
    span = inv.tiny_backbone(attention="adaptive_span", attention_options={"max_span": 16, "init_span": 1.0})
    full = inv.tiny_backbone(attention="full")
    span.load_state_dict(full.state_dict(), strict=False)
    x = torch.randn(2, 14, 16, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(span(x).y, full(x).y, atol=1e-10, rtol=0)


def test_spans_receive_gradient_from_output_and_l1() -> None:
    bb = inv.tiny_backbone(
        attention="adaptive_span", attention_options={"max_span": 4, "ramp": 4, "init_span": 0.5}
    )
    x = torch.randn(2, 12, 16, dtype=torch.float64)
    out = bb(x)
    out.y.pow(2).mean().backward(retain_graph=True)
    spans = [m.span_frac for m in bb.modules() if hasattr(m, "span_frac") and m.span_frac is not None]
    assert all(s.grad is not None and s.grad.abs().sum() > 0 for s in spans)
    for s in spans:
        s.grad = None
    out.aux_losses["adaptive_span_l1"].backward()
    assert all(torch.all(s.grad > 0) for s in spans)  # the penalty pushes every span down


def test_l1_penalty_is_the_weighted_mean_span_in_tokens() -> None:
    """aux = l1_weight * mean span (tokens), summed over layers; default weight 2e-6 as the reference's."""
    opts = {"max_span": 8, "ramp": 4, "init_span": 0.25}
    x = torch.randn(2, 12, 16, dtype=torch.float64)
    default = inv.tiny_backbone(attention="adaptive_span", n_layers=2, attention_options=opts)
    heavy = inv.tiny_backbone(
        attention="adaptive_span", n_layers=2, attention_options={**opts, "l1_weight": 0.5}
    )
    heavy.load_state_dict(default.state_dict())
    # every head starts at 0.25 * 8 = 2 tokens: 2 layers x 2 tokens x weight
    assert default(x).aux_losses["adaptive_span_l1"].item() == pytest.approx(2 * 2 * 2e-6)
    assert heavy(x).aux_losses["adaptive_span_l1"].item() == pytest.approx(2 * 2 * 0.5)
    with pytest.raises(ValueError, match="l1_weight must be a number >= 0, got -1"):
        inv.tiny_backbone(attention="adaptive_span", attention_options={"l1_weight": -1})


def test_computed_scores_shrink_with_span() -> None:
    x = torch.randn(1, 256, 16, dtype=torch.float64)
    counts = {}
    for frac in (0.05, 0.5, 1.0):
        bb = inv.tiny_backbone(
            attention="adaptive_span",
            attention_options={"max_span": 128, "ramp": 8, "init_span": frac, "query_block": 16},
        )
        bb.collect_info = True
        with torch.no_grad():
            counts[frac] = bb(x).info["backbone/adaptive_span/scores/layer0"]
    assert counts[0.05] < counts[0.5] < counts[1.0] < 256 * 256
    assert counts[0.05] < 256 * (0.05 * 128 + 8 + 16 + 1)  # O(T·(z + R + block))


def test_dynamic_span_streams_exactly() -> None:
    bb = inv.tiny_backbone(
        attention="adaptive_span", attention_options={"dynamic": True, "max_span": 6, "ramp": 2}
    )
    inv.check_streaming(bb, length=13)
    inv.check_causal(bb)
