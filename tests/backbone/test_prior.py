"""``gaussian_prior``: reference with the Gaussian bias from its formula, composition with a position bias,
degenerate widths, σ parametrisation, streaming with a bounded cache."""

from __future__ import annotations

import math

import pytest
import torch

from rl_transformers.backbone import Backbone, BackboneConfig
from rl_transformers.backbone.attention import prior as prior_module
from rl_transformers.backbone.attention.prior import truncation_bound
from rl_transformers.backbone.context import ForwardContext
from rl_transformers.backbone.reference import causal_mask, reference_attention
from tests.backbone import invariants as inv

torch.set_num_threads(1)


def _layer(causal: bool = True, position: str = "none", **options: object):
    cfg = BackboneConfig(
        d_model=16, n_layers=1, n_heads=2, position=position, causal=causal, attention="gaussian_prior",
        attention_options=options,
    )  # fmt: skip
    return Backbone(cfg).double().eval().depth.blocks[0].attention


def _ctx(b: int, t: int, causal: bool) -> ForwardContext:
    return ForwardContext(
        pos=torch.arange(t).expand(b, t), valid=torch.ones(b, t, dtype=torch.bool), causal=causal
    )


def _gauss(sigmas: list[float], tq: int, tk: int, offset: int) -> torch.Tensor:
    """(1, H, Tq, Tk) bias -(i - j)² / (2σ²), query i at position offset + i, key j at position j."""
    out = torch.zeros(1, len(sigmas), tq, tk, dtype=torch.float64)
    for h, sigma in enumerate(sigmas):
        for i in range(tq):
            for j in range(tk):
                out[0, h, i, j] = -((offset + i - j) ** 2) / (2 * sigma**2)
    return out


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_matches_reference_with_the_gaussian_bias(causal: bool) -> None:
    torch.manual_seed(0)
    att = _layer(causal=causal, sigma=2.0)
    with torch.no_grad():
        att.rho.copy_(torch.tensor([0.3, 2.5], dtype=torch.float64))
    sigmas = [math.log1p(math.exp(r)) for r in (0.3, 2.5)]
    b, t, s, d = 2, 6, 10, 8  # 4 cached keys before the 6 queries
    q, k, v = torch.randn(b, 2, t, d), torch.randn(b, 2, s, d), torch.randn(b, 2, s, d)
    q, k, v = q.double(), k.double(), v.double()
    q_pos, k_pos = torch.arange(4, s).expand(b, t), torch.arange(s).expand(b, s)
    got = att.attend(q, k, v, q_pos, k_pos, torch.ones(b, s, dtype=torch.bool), _ctx(b, t, causal))
    mask = causal_mask(t, s) if causal else None
    ref = reference_attention(q, k, v, mask=mask, bias=_gauss(sigmas, t, s, 4))
    torch.testing.assert_close(got, ref, atol=1e-10, rtol=0)


def test_composes_with_a_position_bias() -> None:
    torch.manual_seed(1)
    att = _layer(position="alibi", sigma=3.0, learn_sigma=False)
    b, t, d = 2, 9, 8
    q, k, v = (torch.randn(b, 2, t, d, dtype=torch.float64) for _ in range(3))
    pos = torch.arange(t).expand(b, t)
    got = att.attend(q, k, v, pos, pos, torch.ones(b, t, dtype=torch.bool), _ctx(b, t, True))
    slopes = torch.tensor(
        [2.0 ** (-8 * (h + 1) / 2) for h in range(2)], dtype=torch.float64
    )  # ALiBi, 2 heads
    dist = (torch.arange(t)[:, None] - torch.arange(t)[None, :]).abs().double()
    alibi = -slopes.view(1, 2, 1, 1) * dist
    sigmas = att.sigma.tolist()  # 3.0 up to the float32 rounding of ρ at construction
    assert sigmas == pytest.approx([3.0, 3.0], abs=1e-6)
    ref = reference_attention(q, k, v, mask=causal_mask(t), bias=alibi + _gauss(sigmas, t, t, 0))
    torch.testing.assert_close(got, ref, atol=1e-10, rtol=0)


def test_degenerate_widths() -> None:
    x = torch.randn(2, 10, 16, dtype=torch.float64)
    wide = inv.tiny_backbone(attention="gaussian_prior", attention_options={"sigma": 1e7})
    full = inv.tiny_backbone(attention="full")
    full.load_state_dict(wide.state_dict(), strict=False)
    with torch.no_grad():
        torch.testing.assert_close(wide(x).y, full(x).y, atol=1e-9, rtol=0)
    att = _layer(causal=True, sigma=0.05, learn_sigma=False)  # narrow: each query sees only itself
    q, k, v = (torch.randn(1, 2, 7, 8, dtype=torch.float64) for _ in range(3))
    pos = torch.arange(7)[None]
    got = att.attend(q, k, v, pos, pos, torch.ones(1, 7, dtype=torch.bool), _ctx(1, 7, True))
    torch.testing.assert_close(got, v, atol=1e-12, rtol=0)


def test_sigma_parametrisation_learned_or_fixed() -> None:
    learned = _layer(sigma=5.0)
    torch.testing.assert_close(learned.sigma, torch.full((2,), 5.0, dtype=torch.float64))
    assert isinstance(learned.rho, torch.nn.Parameter)
    fixed = _layer(sigma=5.0, learn_sigma=False)
    assert "rho" not in dict(fixed.named_parameters()) and "rho" in dict(fixed.named_buffers())
    bb = inv.tiny_backbone(attention="gaussian_prior", attention_options={"sigma": 2.0})
    inv.check_gradients(bb)
    assert bb.depth.blocks[0].attention.rho.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="sigma must be a finite number > 0"):
        _layer(sigma=0.0)


def test_streaming_with_a_bounded_cache() -> None:
    bb = inv.tiny_backbone(attention="gaussian_prior", attention_options={"max_cache": 4, "sigma": 3.0})
    inv.check_streaming(bb, length=14)
    inv.check_causal(bb)
    _, state = inv.run_chunks(bb, torch.randn(2, 14, 16, dtype=torch.float64), [5, 9])
    assert state.layers[0].length == 4


# ---------------------------------------------------------------------------------------------- windowed form
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("position", ["none", "alibi"])
def test_windowed_form_matches_reference_with_the_window_mask(
    causal: bool, position: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prior_module, "WINDOW_CHUNK", 3)  # several query chunks
    torch.manual_seed(2)
    att = _layer(causal=causal, position=position, sigma=1.5, truncate_sigmas=2.0, max_cache=7)
    with torch.no_grad():
        att.rho.copy_(torch.tensor([0.3, 1.2], dtype=torch.float64))
    sigmas = [math.log1p(math.exp(r)) for r in (0.3, 1.2)]
    w = math.ceil(2.0 * max(sigmas))
    assert att.window() == w
    b, t, s, d = 2, 11, 15, 8  # 4 cached keys
    q, k, v = (torch.randn(b, 2, n, d, dtype=torch.float64) for n in (t, s, s))
    q_pos, k_pos = torch.arange(4, s).expand(b, t), torch.arange(s).expand(b, s)
    valid = torch.ones(b, s, dtype=torch.bool)
    valid[1, [2, 9]] = False
    got = att.attend(q, k, v, q_pos, k_pos, valid, _ctx(b, t, causal))
    i, j = torch.arange(4, s)[:, None], torch.arange(s)[None, :]
    mask = valid[:, None, None, :] & ((i - j).abs() <= w) & (i - j <= 7)
    mask = (mask & (j <= i) if causal else mask) | (i == j)
    bias = _gauss(sigmas, t, s, 4)
    if position == "alibi":
        slopes = torch.tensor([2.0 ** (-8 * (h + 1) / 2) for h in range(2)], dtype=torch.float64)
        bias = bias - slopes.view(1, 2, 1, 1) * (i - j).abs().double()
    ref = reference_attention(q, k, v, mask=mask, bias=bias)
    torch.testing.assert_close(got, ref, atol=1e-10, rtol=0)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_windowed_error_is_within_the_truncation_bound(causal: bool) -> None:
    torch.manual_seed(3)
    b, t, d = 2, 60, 8
    q, k, v = (torch.randn(b, 2, t, d, dtype=torch.float64) for _ in range(3))
    q, k = 0.4 * q, 0.4 * k  # a small logit spread keeps the bound informative
    pos, valid = torch.arange(t).expand(b, t), torch.ones(b, t, dtype=torch.bool)
    exact = _layer(causal=causal, sigma=3.0, learn_sigma=False)
    content = (q @ k.transpose(-1, -2)) / math.sqrt(d)
    spread = float((content - content.diagonal(dim1=-2, dim2=-1).unsqueeze(-1)).max())
    diam = float(torch.cdist(v, v).max())  # max |v_j - v_j'|
    want = exact.attend(q, k, v, pos, pos, valid, _ctx(b, t, causal))
    errors = []
    for m in (1.0, 2.0, 3.0):
        att = _layer(causal=causal, sigma=3.0, learn_sigma=False, truncate_sigmas=m)
        got = att.attend(q, k, v, pos, pos, valid, _ctx(b, t, causal))
        error = float((got - want).norm(dim=-1).max())
        bound = truncation_bound(att.window(), float(att.sigma.max()), spread, causal) * diam
        assert 0.0 < error <= bound, (m, error, bound)
        errors.append(error)
    assert errors[0] > errors[1] > errors[2]  # a wider window only drops less weight


def test_windowed_form_streams_and_learns_sigma() -> None:
    options = {"sigma": 2.0, "truncate_sigmas": 2.5}
    bb = inv.tiny_backbone(attention="gaussian_prior", attention_options=options)
    inv.check_streaming(bb, length=14)
    inv.check_causal(bb)
    inv.check_gradients(bb)
    assert bb.depth.blocks[0].attention.rho.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="truncate_sigmas"):
        _layer(truncate_sigmas=0.0)
