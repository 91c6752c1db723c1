"""``longformer``, ``bigbird`` and ``etc`` against explicit loop-built masks, degenerate equalities, streaming.

Helpers (loop reference, inputs with per-row offsets / padding / cached keys, "scores" scheme, largest-tensor
tracker) come from test_local.py.
"""

from __future__ import annotations

import pytest
import torch

from rl_transformers.backbone import BackboneConfig
from rl_transformers.backbone.attention.global_local import GlobalWindowCache
from rl_transformers.backbone.attention.global_local_bigbird import random_blocks
from tests.backbone import invariants as inv
from tests.backbone.test_local import (
    LENGTHS,
    Pattern,
    check_against_mask,
    check_streaming_bounded,
    largest_tensor,
    make_inputs,
    make_layer,
    run_layer,
    support,
)

CAUSAL = pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])


def longformer_pattern(w: int, dilations: tuple[int, ...], globals_: tuple[int, ...]) -> Pattern:
    """Global rows and columns are full; otherwise keys at multiples of d_h within w·d_h of the query."""

    def allowed(i: int, j: int, h: int) -> bool:
        if i in globals_ or j in globals_:
            return True
        d = dilations[h % len(dilations)]
        return abs(i - j) <= w * d and (i - j) % d == 0

    return allowed


def etc_pattern(r: int, n_global: int) -> Pattern:
    """g2g, g2l, l2g full; l2l within radius r."""
    return lambda i, j, h: i < n_global or j < n_global or abs(i - j) <= r


def bigbird_pattern(
    block: int,
    window: int,
    n_random: int,
    globals_: tuple[int, ...],
    causal: bool,
    n_total: int,
    seed: int = 0,
) -> Pattern:
    """Global rows / columns; key blocks within ``window`` blocks of the query block; its random blocks."""

    def allowed(i: int, j: int, h: int) -> bool:
        if i in globals_ or j in globals_:
            return True
        qb, kb = i // block, j // block
        if abs(qb - kb) <= window:
            return True
        return kb in random_blocks(seed, qb, window, n_random, causal, n_total)

    return allowed


# ----------------------------------------------------------------------------------------------- longformer
@pytest.mark.usefixtures("kernel_path")
@CAUSAL
@pytest.mark.parametrize("length", LENGTHS)
def test_longformer_matches_explicit_mask(causal: bool, length: int) -> None:
    for w, dil, glob in ((2, (1, 3), (0, 6)), (1, (2,), ()), (3, (1,), (4,))):
        pattern = longformer_pattern(w, dil, glob)
        opts = dict(window=w, dilation=dil, global_tokens=glob)
        check_against_mask("longformer", pattern, causal, length, length, **opts)
        check_against_mask("longformer", pattern, causal, length + 8, 5, **opts)


def test_longformer_globals_are_symmetric_and_dilation_skips_keys() -> None:
    for causal in (True, False):
        sup = support("longformer", causal, 16, window=2, dilation=(1, 2), global_tokens=(3,))
        row = torch.arange(16) <= 3 if causal else torch.ones(16, dtype=torch.bool)
        assert torch.equal(sup[:, 3], row.expand(2, -1))  # the global query sees everything (causal: past)
        col = torch.arange(16) >= 3 if causal else torch.ones(16, dtype=torch.bool)
        assert torch.equal(sup[:, :, 3], col.expand(2, -1))  # every query sees the global key
    sup = support("longformer", True, 16, window=2, dilation=(1, 2), global_tokens=())
    assert sup[0, 10].nonzero().flatten().tolist() == [8, 9, 10]
    assert sup[1, 10].nonzero().flatten().tolist() == [6, 8, 10]  # dilation 2: offsets 0, 2, 4


@pytest.mark.usefixtures("kernel_path")
@CAUSAL
def test_longformer_window_at_least_length_equals_full(causal: bool) -> None:
    x = torch.randn(2, 11, 16, dtype=torch.float64)
    full = inv.tiny_backbone(attention="full", causal=causal)
    for name, opts in (
        ("longformer", {"window": 11, "global_tokens": (0, 4)}),
        ("bigbird", {"block": 3, "window_blocks": 4}),
        ("etc", {"window": 11, "n_global": 3}),
    ):
        bb = inv.tiny_backbone(attention=name, attention_options=opts, causal=causal)
        with torch.no_grad():
            torch.testing.assert_close(bb(x).y, full(x).y, atol=1e-12, rtol=0, msg=name)


def test_longformer_streams_with_bounded_window_and_global_store() -> None:
    opts = dict(window=2, dilation=(1, 2), global_tokens=(0, 7))
    check_streaming_bounded("longformer", length=23, bound=7, **opts)  # max(w·max d = 4, last global 7)
    bb = inv.tiny_backbone(attention="longformer", attention_options=opts)
    x = torch.randn(2, 23, 16, dtype=torch.float64)
    with torch.no_grad():
        _, state = inv.run_chunks(bb, x, [1] * 23)
    layer0 = state.layers[0]
    assert isinstance(layer0, GlobalWindowCache) and layer0.valid.all()  # both global keys kept
    assert layer0.window.length == 7


# ------------------------------------------------------------------------------------------------------- etc
@pytest.mark.usefixtures("kernel_path")
@CAUSAL
@pytest.mark.parametrize("length", LENGTHS)
def test_etc_matches_explicit_mask(causal: bool, length: int) -> None:
    for r, g in ((2, 2), (3, 0), (1, 5)):
        opts = dict(window=r, n_global=g)
        check_against_mask("etc", etc_pattern(r, g), causal, length, length, **opts)
        check_against_mask("etc", etc_pattern(r, g), causal, length + 8, 5, **opts)


def test_etc_without_globals_equals_local() -> None:
    x = make_inputs(2, 2, 19, 19)
    for causal in (True, False):
        etc = make_layer("etc", causal, window=3, n_global=0)
        local = make_layer("local", causal, window=3)
        torch.testing.assert_close(run_layer(etc, *x), run_layer(local, *x), atol=1e-12, rtol=0)


def test_etc_streams_with_bounded_state() -> None:
    check_streaming_bounded("etc", length=23, bound=4, window=4, n_global=3)


# --------------------------------------------------------------------------------------------------- bigbird
@pytest.mark.usefixtures("kernel_path")
@CAUSAL
@pytest.mark.parametrize("length", LENGTHS)
def test_bigbird_matches_explicit_mask(causal: bool, length: int) -> None:
    for block, wb, r, glob in ((3, 1, 2, (0, 5)), (2, 0, 3, ()), (4, 1, 1, (2,))):
        opts = dict(block=block, window_blocks=wb, n_random=r, global_tokens=glob)
        for s, t in ((length, length), (length + 8, 5)):
            x = make_inputs(2, 2, s, t)
            n_total = int(x[4].max()) // block + 1  # bidirectional: blocks of the call's keys
            pattern = bigbird_pattern(block, wb, r, glob, causal, n_total)
            check_against_mask("bigbird", pattern, causal, s, t, **opts)


def test_bigbird_random_blocks_are_seeded_past_and_outside_the_window() -> None:
    for m in range(40):
        picked = random_blocks(3, m, 1, 2, True, 0)
        assert len(picked) == min(2, max(0, m - 1)) and all(b < m - 1 for b in picked)
        assert picked == random_blocks(3, m, 1, 2, True, 0)
        both = random_blocks(3, m, 1, 2, False, 40)
        assert len(both) == 2 and all(abs(b - m) > 1 for b in both)
    draws = {tuple(random_blocks(seed, 30, 1, 2, True, 0)) for seed in range(8)}
    assert len(draws) > 1  # the seed matters
    a = support("bigbird", True, 40, block=2, n_random=2, seed=0)
    b = support("bigbird", True, 40, block=2, n_random=2, seed=0)
    c = support("bigbird", True, 40, block=2, n_random=2, seed=1)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(a[0], a[1])  # random blocks are shared by the heads


@pytest.mark.usefixtures("kernel_path")
def test_bigbird_streams_exactly_with_full_cache() -> None:
    check_streaming_bounded("bigbird", length=23, block=3, n_random=1, global_tokens=(1,))


# ------------------------------------------------------------------------------------------------ all three
@pytest.mark.usefixtures("kernel_path")
@CAUSAL
def test_scores_position_scheme(causal: bool) -> None:
    check_against_mask(
        "longformer", longformer_pattern(2, (1, 2), (0, 5)), causal, 23, 23, scores=True,
        window=2, dilation=(1, 2), global_tokens=(0, 5),
    )  # fmt: skip
    check_against_mask("etc", etc_pattern(2, 2), causal, 23, 7, scores=True, window=2, n_global=2)
    x = make_inputs(2, 2, 23, 23)
    pattern = bigbird_pattern(3, 1, 2, (1,), causal, int(x[4].max()) // 3 + 1)
    check_against_mask(
        "bigbird", pattern, causal, 23, 23, scores=True, block=3, n_random=2, global_tokens=(1,)
    )


@pytest.mark.usefixtures("kernel_path")
def test_gradcheck_with_globals_and_random_blocks() -> None:
    q, k, v, q_pos, k_pos, k_valid = make_inputs(1, 2, 8, 8, d=2)
    for x in (q, k, v):
        x.requires_grad_(True)
    for name, opts in (
        ("longformer", dict(window=1, global_tokens=(0, 4))),
        ("bigbird", dict(block=2, window_blocks=0, n_random=1, global_tokens=(1,))),
    ):
        att = make_layer(name, True, d_head=2, scores=True, **opts)
        fn = lambda q, k, v, att=att: run_layer(att, q, k, v, q_pos, k_pos, k_valid)  # noqa: E731
        assert torch.autograd.gradcheck(fn, (q, k, v)), name


@CAUSAL
def test_memory_is_far_below_length_squared(causal: bool) -> None:
    length = 8192
    cases = {
        "longformer": dict(window=64, dilation=(1, 2), global_tokens=(0, 100)),
        "etc": dict(window=64, n_global=4),
        "bigbird": dict(block=64, n_random=2, global_tokens=(0,)),
    }
    for name, options in cases.items():
        largest = largest_tensor(name, causal, length, **options)
        assert largest <= length * length // 8, f"{name}: a tensor of {largest} elements"
    half = largest_tensor("longformer", causal, length // 2, **cases["longformer"])
    assert largest_tensor("longformer", causal, length, **cases["longformer"]) <= 2.2 * half


def test_options_are_validated() -> None:
    with pytest.raises(ValueError, match="repeated positions"):
        BackboneConfig(attention="longformer", attention_options={"global_tokens": (1, 1)})
    with pytest.raises(ValueError, match="1 or n_heads=4 values"):
        BackboneConfig(attention="longformer", attention_options={"dilation": (1, 2)})
    with pytest.raises(ValueError, match="n_random must be an int >= 0"):
        BackboneConfig(attention="bigbird", attention_options={"n_random": -1})


@pytest.mark.usefixtures("kernel_path")
@CAUSAL
def test_bigbird_max_cache_restricts_the_pattern_to_the_window(causal: bool) -> None:
    for window in (3, 7):
        opts = dict(block=3, window_blocks=1, n_random=2, global_tokens=(0, 5), max_cache=window)
        for s, t in ((23, 23), (31, 5)):
            x = make_inputs(2, 2, s, t)
            full = bigbird_pattern(3, 1, 2, (0, 5), causal, int(x[4].max()) // 3 + 1)

            def pattern(i: int, j: int, h: int, full=full, w=window) -> bool:
                return full(i, j, h) and (0 <= i - j <= w if causal else abs(i - j) <= w)

            check_against_mask("bigbird", pattern, causal, s, t, **opts)


@pytest.mark.usefixtures("kernel_path")
def test_bigbird_max_cache_streams_with_a_bounded_cache() -> None:
    check_streaming_bounded(
        "bigbird", length=23, bound=7, block=3, n_random=1, global_tokens=(1,), max_cache=7
    )
