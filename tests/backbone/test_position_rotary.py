"""``rope`` and ``xpos`` against per-pair references, and XPOS's numerical range on long streams.

For pair p of dims (2p, 2p+1), θ_p = base^(-2p/D): RoPE rotates q_i by n_i·θ_p and k_j by m_j·θ_p; XPOS also
scales the pair's product by ζ_p^((n_i - m_j)/γ), ζ_p = (2p/D + γ')/(1 + γ'). The references rotate each pair
with python floats and sum over pairs, per (b, h, i, j), in float64.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from rl_transformers.backbone import Backbone, BackboneConfig
from rl_transformers.backbone.position.rotary import XPosOptions, XPosPosition
from rl_transformers.backbone.reference import causal_mask, reference_attention
from tests.backbone import invariants as inv

torch.set_num_threads(1)


def rotate(x1: float, x2: float, angle: float) -> tuple[float, float]:
    return x1 * math.cos(angle) - x2 * math.sin(angle), x1 * math.sin(angle) + x2 * math.cos(angle)


@torch.no_grad()
def ref_logits(q, k, q_pos, k_pos, base: float = 10000.0, xpos: dict | None = None) -> torch.Tensor:
    """(B, H, Tq, Tk) rope / xpos logits, pair by pair."""
    b, h, tq, d = q.shape
    tk = k.shape[-2]
    out = torch.zeros(b, h, tq, tk, dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            for i in range(tq):
                for j in range(tk):
                    n, m = int(q_pos[bi, i]), int(k_pos[bi, j])
                    total = 0.0
                    for p in range(d // 2):
                        theta = base ** (-2 * p / d)
                        a1, a2 = rotate(float(q[bi, hi, i, 2 * p]), float(q[bi, hi, i, 2 * p + 1]), n * theta)
                        b1, b2 = rotate(float(k[bi, hi, j, 2 * p]), float(k[bi, hi, j, 2 * p + 1]), m * theta)
                        factor = 1.0
                        if xpos is not None:
                            zeta = (2 * p / d + xpos["gamma"]) / (1 + xpos["gamma"])
                            factor = zeta ** ((n - m) / xpos["scale_base"])
                        total += (a1 * b1 + a2 * b2) * factor
                    out[bi, hi, i, j] = total / math.sqrt(d)
    return out


XPOS_SMALL = {"scale_base": 6.0, "gamma": 0.4}  # a decay visible at tiny lengths


def backbone(name: str, n_layers: int = 1, seed: int = 0, position_options=None, **attention) -> Backbone:
    torch.manual_seed(seed)
    cfg = BackboneConfig(
        d_model=16,
        n_layers=n_layers,
        n_heads=2,
        position=name,
        position_options=position_options or {},
        attention_options=attention,
    )
    return Backbone(cfg).double().eval()


def positions(
    b: int, tq: int, tk: int, start: tuple[int, ...] = (3, 11)
) -> tuple[torch.Tensor, torch.Tensor]:
    k_pos = torch.stack([torch.arange(s, s + tk) for s in start[:b]])
    return k_pos[:, tk - tq :], k_pos


def qk(b: int = 2, tq: int = 5, tk: int = 8, d: int = 8, seed: int = 1, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, 2, t, d, generator=g, dtype=torch.float64).to(dtype) for t in (tq, tk))


def xpos_position(**options) -> XPosPosition:
    return backbone("xpos", position_options={**XPOS_SMALL, **options}).position


# -- rope (kept working) -------------------------------------------------------------------------------------
def test_rope_hooks_match_pair_reference_and_are_shift_invariant() -> None:
    position = backbone("rope").position
    q, k = qk()
    q_pos, k_pos = positions(2, 5, 8)
    got = (
        position.transform_q(q, q_pos, 0) @ position.transform_k(k, k_pos, 0).transpose(-1, -2) / math.sqrt(8)
    )
    torch.testing.assert_close(got, ref_logits(q, k, q_pos, k_pos), atol=1e-12, rtol=0)
    shifted = position.transform_q(q, q_pos + 1000, 0) @ position.transform_k(k, k_pos + 1000, 0).transpose(
        -1, -2
    )
    torch.testing.assert_close(shifted / math.sqrt(8), got, atol=1e-10, rtol=0)


# -- xpos hooks ----------------------------------------------------------------------------------------------
def test_xpos_logits_match_pair_reference() -> None:
    position = xpos_position()
    q, k = qk()
    q_pos, k_pos = positions(2, 5, 8)
    want = ref_logits(q, k, q_pos, k_pos, xpos=XPOS_SMALL)
    torch.testing.assert_close(position.logits(q, k, q_pos, k_pos, 0), want, atol=1e-12, rtol=1e-12)


def test_xpos_block_dims() -> None:
    position = xpos_position()
    g = torch.Generator().manual_seed(3)
    q, k = (torch.randn(2, 2, 3, t, 8, generator=g, dtype=torch.float64) for t in (4, 6))
    k_pos = torch.arange(36).view(2, 3, 6) * 2
    q_pos = k_pos[..., 2:] + 1
    got = position.logits(q, k, q_pos, k_pos, 0)
    for blk in range(3):
        want = ref_logits(q[:, :, blk], k[:, :, blk], q_pos[:, blk], k_pos[:, blk], xpos=XPOS_SMALL)
        torch.testing.assert_close(got[:, :, blk], want, atol=1e-12, rtol=1e-12)


def test_xpos_query_blocks_with_their_own_anchor_are_exact() -> None:
    """Query blocks, each scaled relative to its own last position, change no visible logit."""
    position = xpos_position()
    q, k = qk(tq=9, tk=12)
    q_pos, k_pos = positions(2, 9, 12)
    visible = causal_mask(9, 12)
    whole = position.logits(q, k, q_pos, k_pos, 0)
    assert position.block >= 9
    position.block = 2
    split = position.logits(q, k, q_pos, k_pos, 0)
    torch.testing.assert_close(split[..., visible], whole[..., visible], atol=1e-12, rtol=1e-12)
    assert torch.isfinite(split).all()  # keys after a block's anchor (masked) keep a finite value
    # default block size: the query factor stays below e^4
    default = xpos_position(scale_base=512.0).block
    assert default == 1 + int(4 * 512 / -math.log(0.4 / 1.4)) == 1635


def test_xpos_without_decay_is_rope() -> None:
    position = xpos_position(scale_base=1e18)
    rope = backbone("rope").position
    q, k = qk()
    q_pos, k_pos = positions(2, 5, 8)
    want = rope.transform_q(q, q_pos, 0) @ rope.transform_k(k, k_pos, 0).transpose(-1, -2) / math.sqrt(8)
    torch.testing.assert_close(position.logits(q, k, q_pos, k_pos, 0), want, atol=1e-12, rtol=0)


def test_xpos_decay_by_hand() -> None:
    """q = k = e_0 (pair 0: θ_0 = 1, ζ_0 = γ'/(1 + γ')): logit at distance r = cos(r)·ζ_0^(r/γ)/sqrt(D)."""
    position = xpos_position()
    q = torch.zeros(1, 1, 1, 8, dtype=torch.float64)
    q[..., 0] = 1
    k = q.expand(1, 1, 10, 8)
    logits = position.logits(q, k, torch.tensor([[9]]), torch.arange(10)[None], 0)[0, 0, 0]
    zeta0 = 0.4 / 1.4
    want = [math.cos(9 - j) * zeta0 ** ((9 - j) / 6.0) / math.sqrt(8) for j in range(10)]
    torch.testing.assert_close(logits, torch.tensor(want, dtype=torch.float64), atol=1e-14, rtol=0)


def test_xpos_shift_invariant_up_to_rounding() -> None:
    position = xpos_position()
    assert position.shift_invariant
    q, k = qk()
    q_pos, k_pos = positions(2, 5, 8)
    base = position.logits(q, k, q_pos, k_pos, 0)
    for c in (1, 50, 100_000):
        torch.testing.assert_close(position.logits(q, k, q_pos + c, k_pos + c, 0), base, atol=1e-9, rtol=0)


def test_xpos_long_streams_stay_finite_in_float32() -> None:
    """Default γ = 512: the literal factor ζ_0^(-m/γ) overflows float32 near m = 36k; ours does not."""
    position = Backbone(BackboneConfig(d_model=16, n_layers=1, n_heads=2, position="xpos")).position
    log_zeta0 = math.log(0.4 / 1.4)
    assert math.isinf(torch.tensor(-40_000 / 512 * log_zeta0).exp().item())  # float32: the naive key factor
    q, k = qk(tq=4, tk=64, dtype=torch.float32)
    q_pos, k_pos = positions(2, 4, 64, start=(0, 0))
    near = position.logits(q, k, q_pos, k_pos, 0)
    for c in (40_000, 10_000_000):
        far = position.logits(q, k, q_pos + c, k_pos + c, 0)
        assert torch.isfinite(far).all()
        torch.testing.assert_close(far, near, atol=2e-5, rtol=1e-5)
    # a distance of 10^6 inside one call: the key factor underflows to 0 (the exact value is ~e^-2400)
    far_key = position.logits(q, k[:, :, :1], q_pos + 1_000_000, torch.zeros(2, 1, dtype=torch.long), 0)
    assert torch.isfinite(far_key).all()
    assert far_key.abs().max() < 1e-30


# -- whole backbone ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("window", [None, 3], ids=["unbounded", "window3"])
@pytest.mark.parametrize("name", ["rope", "xpos"])
def test_backbone_layer_matches_reference(name: str, window: int | None) -> None:
    options = XPOS_SMALL if name == "xpos" else {}
    bb = backbone(name, position_options=options, **({"max_cache": window} if window else {}))
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
    mask = causal_mask(length)
    if window is not None:
        i, j = torch.arange(length)[:, None], torch.arange(length)[None, :]
        mask = mask & (i - j <= window)
    logits = ref_logits(q, k, pos, pos, xpos=options if name == "xpos" else None)
    bias = logits - q @ k.transpose(-1, -2) / math.sqrt(8)  # reference_attention adds q·k/sqrt(D) back
    want = att.o_proj(att.merge_heads(reference_attention(q, k, v, mask=mask, bias=bias)))
    torch.testing.assert_close(seen["y"], want, atol=1e-10, rtol=0)
    if window is not None:
        with torch.no_grad():
            full = bb(x).y
            for sizes in inv.chunkings(length):
                got, _ = inv.run_chunks(bb, x, sizes)
                torch.testing.assert_close(got, full, atol=1e-9, rtol=0)


# -- configuration -------------------------------------------------------------------------------------------
def test_xpos_is_causal_only() -> None:
    with pytest.raises(ValueError, match="causal"):
        BackboneConfig(d_model=16, n_heads=2, position="xpos", causal=False)
    with pytest.raises(ValueError, match="grows without bound"):
        XPosPosition.check_config(SimpleNamespace(causal=False), XPosOptions())
    XPosPosition.check_config(SimpleNamespace(causal=True), XPosOptions())


@pytest.mark.parametrize(("option", "value"), [("scale_base", 0.0), ("gamma", -1.0), ("base", 1.0)])
def test_xpos_options_are_validated(option: str, value: float) -> None:
    with pytest.raises(ValueError, match=option):
        BackboneConfig(d_model=16, n_heads=2, position="xpos", position_options={option: value})
