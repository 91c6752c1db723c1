"""Distance-bias schemes (t5, alibi, kerple_power, kerple_log, sandwich) against per-pair references.

Each reference is written here from the paper's formula with explicit loops over (head, i, j) in float64, and
is compared (a) with the scheme's ``bias`` / ``logits`` hooks, (b) with a whole 1-layer Backbone, whose
attention output must equal ``reference_attention(q, k, v, mask, bias=reference_bias)`` on the layer's own
projections, with and without a sliding window (``full`` with ``max_cache``; chunked == full run there too).
"""

from __future__ import annotations

import math

import pytest
import torch

from rl_transformers.backbone import Backbone, BackboneConfig
from rl_transformers.backbone.position.bias import alibi_slopes, t5_bucket
from rl_transformers.backbone.reference import causal_mask, reference_attention
from tests.backbone import invariants as inv

torch.set_num_threads(1)
NAMES = ["t5", "alibi", "kerple_power", "kerple_log", "sandwich"]


# -- independent references (python floats, loops) -----------------------------------------------------------
def ref_t5_bucket(n: int, bidirectional: bool, n_buckets: int, max_distance: int) -> int:
    """T5's bucket of the distance n = query - key, written out case by case."""
    ret = 0
    if bidirectional:
        n_buckets //= 2
        if n < 0:
            ret += n_buckets
        n = abs(n)
    else:
        n = max(n, 0)
    max_exact = n_buckets // 2
    if n < max_exact:
        return ret + n
    large = max_exact + int(
        math.log(n / max_exact) / math.log(max_distance / max_exact) * (n_buckets - max_exact)
    )
    return ret + min(large, n_buckets - 1)


@torch.no_grad()
def ref_pair_bias(position, name: str, h: int, n: int, layer: int) -> float:
    """b_h(n) for the distance n = i - j, from each paper's formula."""
    n_heads = position.n_heads
    if name == "alibi":
        return -(2.0 ** (-8.0 * (h + 1) / n_heads)) * abs(n)  # slopes of a power-of-two H (tests use H = 2)
    if name == "t5":
        o = position.options
        return float(
            position.table[ref_t5_bucket(n, not position.cfg.causal, o.n_buckets, o.max_distance), h]
        )
    if name == "kerple_power":
        r1 = math.log1p(math.exp(float(position.rho1[layer, h])))
        r2 = 2 / (1 + math.exp(-float(position.rho2[layer, h])))
        return -r1 * abs(n) ** r2
    if name == "kerple_log":
        r1 = math.log1p(math.exp(float(position.rho1[layer, h])))
        r2 = math.log1p(math.exp(float(position.rho2[layer, h])))
        return -r1 * math.log(1 + r2 * abs(n))
    if name == "sandwich":
        o = position.options
        lam = o.lam * n_heads / (8 * (h + 1)) if o.head_scales else o.lam
        dot = sum(math.cos(n / o.base ** (2 * k / o.dim)) for k in range(o.dim // 2))
        return lam * (dot - o.dim / 2)
    raise AssertionError(name)


def ref_bias(position, name: str, q_pos: torch.Tensor, k_pos: torch.Tensor, layer: int = 0) -> torch.Tensor:
    """(B, H, Tq, Tk) float64 bias from per-pair loops."""
    b, tq, tk = q_pos.shape[0], q_pos.shape[-1], k_pos.shape[-1]
    out = torch.zeros(b, position.n_heads, tq, tk, dtype=torch.float64)
    for bi in range(b):
        for h in range(position.n_heads):
            for i in range(tq):
                for j in range(tk):
                    n = int(q_pos[bi, i] - k_pos[bi, j])
                    out[bi, h, i, j] = ref_pair_bias(position, name, h, n, layer)
    return out


# -- helpers -------------------------------------------------------------------------------------------------
def backbone(name: str, causal: bool = True, n_layers: int = 1, seed: int = 0, **attention) -> Backbone:
    torch.manual_seed(seed)
    options = {"dim": 16} if name == "sandwich" else {}  # d' = 16: an oscillating profile at tiny distances
    if name == "t5":
        options = {"n_buckets": 8, "max_distance": 12}  # exact, log-spaced and clipped buckets at L <= 20
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
    with torch.no_grad():  # non-trivial learned values (t5 table, kerple ρ)
        for p in bb.position.parameters():
            p.normal_(0.0, 0.7)
    return bb


def positions(
    b: int, tq: int, tk: int, start: tuple[int, ...] = (3, 11)
) -> tuple[torch.Tensor, torch.Tensor]:
    """Bottom-right aligned positions: the Tq queries are the last Tq of Tk consecutive keys of each row."""
    k_pos = torch.stack([torch.arange(s, s + tk) for s in start[:b]])
    return k_pos[:, tk - tq :], k_pos


def layer_io(bb: Backbone, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(input, output) of the first attention layer in a forward pass of ``bb``."""
    att = bb.depth.blocks[0].attention
    seen: dict[str, torch.Tensor] = {}
    handle = att.register_forward_hook(lambda m, args, out: seen.update(x=args[0], y=out[0]))
    with torch.no_grad():
        bb(x)
    handle.remove()
    return seen["x"], seen["y"]


def reference_layer(
    bb: Backbone, h_in: torch.Tensor, mask: torch.Tensor | None, bias: torch.Tensor
) -> torch.Tensor:
    att = bb.depth.blocks[0].attention
    q, k, v = (att.split_heads(proj(h_in)) for proj in (att.q_proj, att.k_proj, att.v_proj))
    out = reference_attention(q, k, v, mask=mask, bias=bias)
    return att.o_proj(att.merge_heads(out))


# -- hooks vs per-pair reference -----------------------------------------------------------------------------
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("name", NAMES)
def test_bias_hook_matches_pair_reference(name: str, causal: bool) -> None:
    position = backbone(name, causal=causal, n_layers=2).position
    q_pos, k_pos = positions(2, 5, 9)
    if not causal:  # queries in the middle of the keys: future keys too
        q_pos = k_pos[:, 2:7]
    for layer in (0, 1):
        got = position.bias(q_pos, k_pos, layer, torch.float64)
        torch.testing.assert_close(got, ref_bias(position, name, q_pos, k_pos, layer), atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_logits_with_block_dims_equal_qk_plus_bias(name: str) -> None:
    """Kernels call logits on sub-blocks: q (B, H, nb, Tq, D), positions (B, nb, Tq)."""
    position = backbone(name).position
    q, k = torch.randn(2, 2, 3, 4, 8, dtype=torch.float64), torch.randn(2, 2, 3, 6, 8, dtype=torch.float64)
    k_pos = torch.arange(36).view(2, 3, 6) * 2  # non-consecutive positions across blocks
    q_pos = k_pos[..., 2:] + 1
    got = position.logits(q, k, q_pos, k_pos, 0)
    for blk in range(3):
        want = q[:, :, blk] @ k[:, :, blk].transpose(-1, -2) / math.sqrt(8)
        want = want + ref_bias(position, name, q_pos[:, blk], k_pos[:, blk])
        torch.testing.assert_close(got[:, :, blk], want, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_shift_invariant(name: str) -> None:
    position = backbone(name).position
    assert position.shift_invariant
    q, k = torch.randn(2, 2, 4, 8, dtype=torch.float64), torch.randn(2, 2, 7, 8, dtype=torch.float64)
    q_pos, k_pos = positions(2, 4, 7)
    base = position.logits(q, k, q_pos, k_pos, 0)
    for c in (1, 37, 100_000):
        torch.testing.assert_close(position.logits(q, k, q_pos + c, k_pos + c, 0), base, atol=1e-12, rtol=0)


# -- whole backbone vs reference_attention -------------------------------------------------------------------
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("name", NAMES)
def test_backbone_layer_matches_reference_attention(name: str, causal: bool) -> None:
    bb = backbone(name, causal=causal)
    length = 14  # beyond t5's max_distance=12: every bucket kind is used
    x = torch.randn(2, length, 16, dtype=torch.float64)
    h_in, y = layer_io(bb, x)
    pos = torch.arange(length).expand(2, length)
    bias = ref_bias(bb.position, name, pos, pos)
    mask = causal_mask(length) if causal else None
    torch.testing.assert_close(y, reference_layer(bb, h_in, mask, bias), atol=1e-10, rtol=0)


@pytest.mark.parametrize("name", NAMES)
def test_sliding_window_streams_and_matches_windowed_reference(name: str) -> None:
    """Su's super-baseline: w past keys + a relative bias; chunked == full == windowed reference."""
    w, length = 4, 13
    bb = backbone(name, max_cache=w)
    x = torch.randn(2, length, 16, dtype=torch.float64)
    with torch.no_grad():
        full = bb(x).y
        for sizes in inv.chunkings(length):
            got, _ = inv.run_chunks(bb, x, sizes)
            torch.testing.assert_close(got, full, atol=1e-9, rtol=0)
    h_in, y = layer_io(bb, x)
    pos = torch.arange(length).expand(2, length)
    i, j = torch.arange(length)[:, None], torch.arange(length)[None, :]
    mask = (j <= i) & (i - j <= w)
    torch.testing.assert_close(
        y, reference_layer(bb, h_in, mask, ref_bias(bb.position, name, pos, pos)), atol=1e-10, rtol=0
    )


# -- scheme-specific facts -----------------------------------------------------------------------------------
def test_alibi_slopes_including_the_non_power_of_two_rule() -> None:
    assert alibi_slopes(8) == [2.0**-k for k in range(1, 9)]
    assert alibi_slopes(2) == [2.0**-4, 2.0**-8]
    # H = 6: the 4 slopes of H = 4, then every other slope of H = 8 (2^-1, 2^-3).
    assert alibi_slopes(6) == [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3]
    slopes12 = alibi_slopes(12)
    assert slopes12[:8] == alibi_slopes(8)
    assert slopes12[8:] == pytest.approx([2.0**-0.5, 2.0**-1.5, 2.0**-2.5, 2.0**-3.5])


def test_alibi_bias_values_by_hand() -> None:
    cfg = BackboneConfig(d_model=12, n_layers=1, n_heads=6, position="alibi", causal=False)
    position = Backbone(cfg).position
    pos = torch.arange(3)[None]
    bias = position.bias(pos, pos, 0, torch.float64)
    # head 4 (slope 1/2): -|i - j| / 2
    assert bias[0, 4].tolist() == [[0.0, -0.5, -1.0], [-0.5, 0.0, -0.5], [-1.0, -0.5, 0.0]]


@pytest.mark.parametrize("bidirectional", [False, True], ids=["causal", "bidirectional"])
@pytest.mark.parametrize(("n_buckets", "max_distance"), [(32, 128), (8, 12), (6, 40)])
def test_t5_buckets_match_reference(bidirectional: bool, n_buckets: int, max_distance: int) -> None:
    rel = torch.arange(-300, 301)
    got = t5_bucket(rel, bidirectional, n_buckets, max_distance).tolist()
    want = [ref_t5_bucket(n, bidirectional, n_buckets, max_distance) for n in rel.tolist()]
    assert got == want
    assert min(got) >= 0 and max(got) == n_buckets - 1


def test_t5_bucket_values_by_hand() -> None:
    def bucket(n: int, bidirectional: bool = False) -> int:
        return int(t5_bucket(torch.tensor(n), bidirectional, 32, 128))

    # causal: 16 exact buckets, then 16 log-spaced ones up to 128
    assert [bucket(n) for n in (0, 1, 15, 16, 32, 64, 127, 128, 10_000)] == [0, 1, 15, 16, 21, 26, 31, 31, 31]
    assert bucket(-5) == 0  # future keys (masked in a causal model) share bucket 0
    # bidirectional: 8 exact buckets per side, future keys in the upper half
    assert [bucket(n, True) for n in (0, 3, -3, 8, -8, 1000, -1000)] == [0, 3, 19, 8, 24, 15, 31]


def test_t5_table_is_shared_across_layers() -> None:
    position = backbone("t5", n_layers=3).position
    q_pos, k_pos = positions(2, 5, 9)
    assert sum(p.numel() for p in position.parameters()) == 8 * 2
    b0 = position.bias(q_pos, k_pos, 0)
    torch.testing.assert_close(position.bias(q_pos, k_pos, 2), b0)


def test_kerple_power_starts_as_alibi_and_log_is_not_zero_at_init() -> None:
    cfg = dict(d_model=32, n_layers=2, n_heads=4)
    power = Backbone(BackboneConfig(**cfg, position="kerple_power")).position.double()
    alibi = Backbone(BackboneConfig(**cfg, position="alibi")).position
    log = Backbone(BackboneConfig(**cfg, position="kerple_log")).position.double()
    q_pos, k_pos = positions(2, 6, 10)
    # (parameters are created in float32: equal up to float32 rounding of r1)
    torch.testing.assert_close(
        power.bias(q_pos, k_pos, 1, torch.float64),
        alibi.bias(q_pos, k_pos, 1, torch.float64),
        atol=0,
        rtol=1e-6,
    )
    # r1 = r2 = 1 at init: -log(1 + |i - j|)
    want = (
        -torch.log1p((q_pos[:, :, None] - k_pos[:, None, :]).abs().double())
        .unsqueeze(1)
        .expand(-1, 4, -1, -1)
    )
    torch.testing.assert_close(log.bias(q_pos, k_pos, 0, torch.float64), want, atol=0, rtol=1e-6)


@pytest.mark.parametrize("name", ["kerple_power", "kerple_log"])
def test_kerple_parameters_stay_in_range_and_bias_is_monotone(name: str) -> None:
    position = backbone(name, n_layers=2).position
    with torch.no_grad():
        position.rho1.copy_(torch.tensor([[-30.0, 30.0], [0.0, 5.0]]))
        position.rho2.copy_(torch.tensor([[-30.0, 30.0], [5.0, -5.0]]))
    for layer in (0, 1):
        r1, r2 = position.r1(layer), position.r2(layer)
        assert (r1 > 0).all() and (r2 > 0).all()
        if name == "kerple_power":
            assert (r2 <= 2).all()
        dist = torch.arange(0, 500)
        bias = position.bias(torch.tensor([[499]]), (499 - dist)[None], layer, torch.float64)[0, :, 0]
        assert torch.isfinite(bias).all() and (bias <= 0).all() and (bias[:, 0] == 0).all()
        assert (bias[:, 1:] <= bias[:, :-1]).all(), "bias must not increase with distance"


def test_sandwich_profile_is_maximal_at_zero_and_symmetric() -> None:
    position = backbone("sandwich", causal=False).position
    pos = torch.arange(40)[None]
    bias = position.bias(pos, pos, 0, torch.float64)
    assert (bias[0, :, 20, 20] == 0).all()
    assert (bias <= 1e-12).all()
    torch.testing.assert_close(bias, bias.transpose(-1, -2))
    # head scales λ_h = λ·H/(8h): head 2 is half of head 1
    torch.testing.assert_close(bias[:, 1], bias[:, 0] / 2)


@pytest.mark.parametrize("name", ["t5", "kerple_power", "kerple_log"])
def test_learned_bias_parameters_receive_gradients(name: str) -> None:
    bb = backbone(name, n_layers=2)
    bb.train()
    x = torch.randn(2, 14, 16, dtype=torch.float64)
    bb(x).y.pow(2).mean().backward()
    params = dict(bb.position.named_parameters())
    assert params, "scheme has no learned parameters"
    for pname, p in params.items():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname
        if p.dim() == 2 and name != "t5":  # per layer and head: every entry is used
            assert (p.grad != 0).all(), f"{pname} has entries without gradient"
        else:
            assert p.grad.abs().sum() > 0, pname


def test_float32_bias_stays_accurate_for_long_streams() -> None:
    """Positions around 10^6: the bias depends on small distances only, computed without cancellation."""
    cfg = BackboneConfig(d_model=16, n_layers=1, n_heads=2, position="alibi")
    position = Backbone(cfg).position
    q = torch.randn(1, 2, 3, 8)
    k = torch.randn(1, 2, 5, 8)
    q_pos, k_pos = positions(1, 3, 5, start=(0,))
    far = position.logits(q, k, q_pos + 1_000_000, k_pos + 1_000_000, 0)
    torch.testing.assert_close(far, position.logits(q, k, q_pos, k_pos, 0), atol=0, rtol=0)


def test_t5_old_option_name_is_a_clear_error() -> None:
    """``num_buckets`` (the name before the backbone's ``n_`` count prefix) is gone: a config.json that still
    uses it is refused with an error naming the option and the new name, not loaded with another meaning."""
    from rl_transformers.utils.config_json import from_dict, to_jsonable
    from rl_transformers.utils.errors import UserError

    new = BackboneConfig(d_model=16, n_heads=2, position="t5", position_options={"n_buckets": 8})
    saved = to_jsonable(new)
    assert from_dict(BackboneConfig, saved) == new
    saved["position_options"] = {"num_buckets": 8}  # as an old config.json stores it
    with pytest.raises((UserError, ValueError), match=r"unknown option 'num_buckets'.*'n_buckets'"):
        from_dict(BackboneConfig, saved)
    with pytest.raises(UserError, match=r"unknown option 'num_buckets'.*Did you mean 'n_buckets'"):
        BackboneConfig(d_model=16, n_heads=2, position="t5", position_options={"num_buckets": 8})
