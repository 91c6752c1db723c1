"""``strided``, ``fixed`` (Sparse Transformer) and ``blockwise`` (BlockBERT) against explicit loop-built masks.

Helpers (loop reference, inputs with per-row offsets / padding / cached keys, "scores" scheme, largest-tensor
tracker) come from test_local.py.
"""

from __future__ import annotations

import pytest
import torch

from rl_transformers.backbone import BackboneConfig
from rl_transformers.backbone.attention import _dense, _residue_flash
from tests.backbone import invariants as inv
from tests.backbone.test_local import (
    LENGTHS,
    Pattern,
    check_against_mask,
    check_streaming_bounded,
    largest_tensor,
    make_inputs,
    make_layer,
    reference_for,
    run_layer,
    support,
)

COMBINES = ["union", "alternate", "split_heads"]
CAUSAL = pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])


def strided_parts(l: int) -> tuple[Pattern, Pattern]:  # noqa: E741 - the paper's symbol
    """A(1): 0 <= i - j <= l (both sides when bidirectional); A(2): (i - j) mod l == 0."""
    return (lambda i, j, h: abs(i - j) <= l), (lambda i, j, h: (i - j) % l == 0)


def fixed_parts(l: int, c: int) -> tuple[Pattern, Pattern]:  # noqa: E741
    """A(1): floor(j / l) == floor(i / l); A(2): j mod l in {l - c, ..., l - 1}."""
    return (lambda i, j, h: j // l == i // l), (lambda i, j, h: j % l >= l - c)


def combined(a1: Pattern, a2: Pattern, combine: str, layer: int, n_heads: int) -> Pattern:
    def allowed(i: int, j: int, h: int) -> bool:
        if combine == "union":
            return a1(i, j, h) or a2(i, j, h)
        if combine == "alternate":
            return a1(i, j, h) if layer % 2 == 0 else a2(i, j, h)
        return a1(i, j, h) if h < (n_heads + 1) // 2 else a2(i, j, h)

    return allowed


# ------------------------------------------------------------------------------------------ strided / fixed
@pytest.mark.usefixtures("kernel_path")
@CAUSAL
@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("combine", COMBINES)
def test_strided_matches_explicit_mask(causal: bool, length: int, combine: str) -> None:
    for layer in (0, 1):
        pattern = combined(*strided_parts(3), combine, layer, 3)
        opts = dict(stride=3, combine=combine, n_heads=3, layer=layer)
        check_against_mask("strided", pattern, causal, length, length, **opts)
        check_against_mask("strided", pattern, causal, length + 8, 5, **opts)


def count_flash_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Force the chunked fused forms (as ``kernel_path`` "fused") and count the calls of strided's flash form."""
    monkeypatch.setattr(_dense, "DENSE_PATH", "never")
    monkeypatch.setattr(_dense, "FUSED_MIN_LEN", 0)
    monkeypatch.setattr(_dense, "FUSED_CHUNK", 3)
    calls = [0]
    apply = _residue_flash.ResidueCausal.apply

    def counted(*args: object) -> torch.Tensor:
        calls[0] += 1
        return apply(*args)

    monkeypatch.setattr(_residue_flash.ResidueCausal, "apply", counted)
    return calls


def all_valid_inputs(b: int, h: int, length: int, offset: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Every key valid, rows sharing the positions offset .. offset + length - 1: the flash form's case."""
    q, k, v, _, _, _ = make_inputs(b, h, length, length, seed=seed)
    pos = (torch.arange(length) + offset).expand(b, length)
    return q, k, v, pos, pos, torch.ones(b, length, dtype=torch.bool)


@pytest.mark.parametrize("band_block", [1, 3, 32])
@pytest.mark.parametrize("stride", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("length", [1, 2, 7, 13, 33, 70])
def test_strided_flash_form_matches_explicit_mask(
    monkeypatch: pytest.MonkeyPatch, stride: int, length: int, band_block: int
) -> None:
    """The flash form (classes as one causal SDPA call + band windows, merged by log-sum-exp) against the float64
    loop-built reference, for ``union`` and both layers of ``alternate``; every band block size (windows of
    several blocks, the first blocks reaching before key 0). Padding / per-row offsets / split heads take the
    chunked form, also checked here."""

    calls = count_flash_calls(monkeypatch)
    monkeypatch.setattr(_residue_flash, "RESIDUE_BAND_BLOCK", band_block)
    expected = 0
    for combine, layer in (("union", 0), ("alternate", 0), ("alternate", 1), ("split_heads", 0)):
        pattern = combined(*strided_parts(stride), combine, layer, 3)
        att = make_layer("strided", True, n_heads=3, layer=layer, stride=stride, combine=combine)
        for x in (all_valid_inputs(2, 3, length, offset=5), make_inputs(2, 3, length, length)):
            want = reference_for(pattern, True, *x)
            torch.testing.assert_close(run_layer(att, *x), want, atol=1e-12, rtol=0)
        expected += combine == "union" or (combine == "alternate" and layer == 1)  # A(1)-only: the band
    assert calls[0] == expected


@pytest.mark.parametrize("stride", [1, 3, 5])
@pytest.mark.parametrize("combine", ["union", "alternate"])
def test_strided_flash_form_gradients_match_dense(
    monkeypatch: pytest.MonkeyPatch, stride: int, combine: str
) -> None:
    """Gradients of q, k, v through the flash form's own backward (flash backward with the merged output and
    log-sum-exp + the band windows) equal float64 autograd through the dense T x S form; gradcheck on a small
    call."""

    calls = count_flash_calls(monkeypatch)
    monkeypatch.setattr(_residue_flash, "RESIDUE_BAND_BLOCK", 4)
    att = make_layer("strided", True, n_heads=2, stride=stride, combine=combine, layer=1)
    q, k, v, q_pos, k_pos, k_valid = all_valid_inputs(2, 2, 29, offset=3, seed=1)
    w = torch.randn(q.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))

    def grads(path: str) -> list[torch.Tensor]:
        monkeypatch.setattr(_dense, "DENSE_PATH", path)
        x = [t.clone().requires_grad_() for t in (q, k, v)]
        out = run_layer(att, *x, q_pos, k_pos, k_valid)
        return [out, *torch.autograd.grad((out * w).sum(), x)]

    fast = grads("never")
    assert calls[0] == 1
    for got, want in zip(fast, grads("always")):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    small = [t[:1, :, :11].clone().requires_grad_() for t in (q, k, v)]
    rest = [t[:1, :11] for t in (q_pos, k_pos, k_valid)]
    monkeypatch.setattr(_dense, "DENSE_PATH", "never")
    assert torch.autograd.gradcheck(lambda a, b, c: run_layer(att, a, b, c, *rest), small)
    assert calls[0] > 1


@pytest.mark.usefixtures("kernel_path")
@CAUSAL
@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("combine", COMBINES)
def test_fixed_matches_explicit_mask(causal: bool, length: int, combine: str) -> None:
    for layer in (0, 1):
        for l, c in ((4, 2), (3, 1)):  # noqa: E741
            pattern = combined(*fixed_parts(l, c), combine, layer, 3)
            opts = dict(stride=l, summary=c, combine=combine, n_heads=3, layer=layer)
            check_against_mask("fixed", pattern, causal, length, length, **opts)
            check_against_mask("fixed", pattern, causal, length + 8, 5, **opts)


@pytest.mark.usefixtures("kernel_path")
@pytest.mark.parametrize("length", [13, 33])
@pytest.mark.parametrize("combine", COMBINES)
@pytest.mark.parametrize("name", ["strided", "fixed"])
def test_rows_sharing_positions_match_explicit_mask(name: str, combine: str, length: int) -> None:
    """Rows with the same positions (offset 5, a padded key): the case the chunked fused forms take."""
    for layer in (0, 1):
        parts = strided_parts(3) if name == "strided" else fixed_parts(4, 2)
        opts = dict(stride=3) if name == "strided" else dict(stride=4, summary=2)
        att = make_layer(name, True, n_heads=3, layer=layer, combine=combine, **opts)
        x = make_inputs(2, 3, length, length, offsets=(5,))
        want = reference_for(combined(*parts, combine, layer, 3), True, *x)
        torch.testing.assert_close(run_layer(att, *x), want, atol=1e-12, rtol=0)


@pytest.mark.usefixtures("kernel_path")
@CAUSAL
@pytest.mark.parametrize("name", ["strided", "fixed"])
def test_combine_modes_give_the_documented_unions(causal: bool, name: str) -> None:
    opts = dict(stride=4, summary=2) if name == "fixed" else dict(stride=4)
    a1 = support(name, causal, 19, combine="alternate", layer=0, **opts)  # even layer: A(1) only
    a2 = support(name, causal, 19, combine="alternate", layer=1, **opts)  # odd layer: A(2) only
    union = support(name, causal, 19, combine="union", **opts)
    split = support(name, causal, 19, combine="split_heads", n_heads=4, **opts)
    assert not torch.equal(a1, a2)
    torch.testing.assert_close(union, a1 | a2)
    torch.testing.assert_close(split[:2], a1[:1].expand(2, -1, -1))
    torch.testing.assert_close(split[2:], a2[:1].expand(2, -1, -1))


def test_causal_factorisation_reaches_every_past_position_in_two_hops() -> None:
    """Child et al.: with A(1) then A(2) (two layers / heads), every j <= i is reachable from i."""
    for name, opts in (("strided", dict(stride=4)), ("fixed", dict(stride=4, summary=1))):
        a1 = support(name, True, 25, combine="alternate", layer=0, **opts)[0].double()
        a2 = support(name, True, 25, combine="alternate", layer=1, **opts)[0].double()
        reach = (a2 @ a1) > 0  # layer 2 (A(2)) reads layer-1 outputs (A(1))
        assert torch.equal(reach, torch.ones(25, 25).tril().bool()), name


@pytest.mark.usefixtures("kernel_path")
@pytest.mark.parametrize("name", ["strided", "fixed"])
def test_scores_position_scheme_on_strided_parts(name: str) -> None:
    for causal in (True, False):
        parts = fixed_parts(4, 2) if name == "fixed" else strided_parts(3)
        opts = dict(stride=4, summary=2) if name == "fixed" else dict(stride=3)
        pattern = combined(*parts, "union", 0, 2)
        check_against_mask(name, pattern, causal, 23, 23, scores=True, **opts)
        check_against_mask(name, pattern, causal, 23, 6, scores=True, **opts)


@pytest.mark.usefixtures("kernel_path")
def test_strided_and_fixed_stream_exactly() -> None:
    check_streaming_bounded("strided", stride=3)  # A(2) looks back without bound: full cache
    check_streaming_bounded("fixed", stride=4, summary=2)
    # alternate: even layers only need the last l keys
    bb = inv.tiny_backbone(attention="strided", attention_options={"stride": 3, "combine": "alternate"})
    inv.check_streaming(bb, length=17)
    caches = [bb.depth.attention_for(i).max_cache for i in range(2)]
    assert caches == [3, None]


def test_split_heads_needs_two_heads() -> None:
    with pytest.raises(ValueError, match="split_heads"):
        BackboneConfig(
            d_model=8, n_heads=1, attention="strided", attention_options={"combine": "split_heads"}
        )
    with pytest.raises(ValueError, match="Did you mean 'union'"):
        BackboneConfig(attention="fixed", attention_options={"combine": "unoin"})
    with pytest.raises(ValueError, match="summary=5 must be <= stride=4"):
        BackboneConfig(attention="fixed", attention_options={"stride": 4, "summary": 5})


# ------------------------------------------------------------------------------------------------- blockwise
def blockwise_pattern(n: int, size: int, perms: list[list[int]], causal: bool) -> Pattern:
    """Block i (within its super-block of n blocks) attends block perms[h][i] of the same super-block; causal: a
    future target falls back to the own block (then causal inside it)."""

    def allowed(i: int, j: int, h: int) -> bool:
        qb, kb = i // size, j // size
        if qb // n != kb // n:
            return False
        target = perms[h][qb % n]
        if causal and target > qb % n:
            target = qb % n
        return kb % n == target

    return allowed


@pytest.mark.usefixtures("kernel_path")
@CAUSAL
@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize(("n", "size"), [(3, 2), (2, 4)])
def test_blockwise_matches_explicit_mask(causal: bool, length: int, n: int, size: int) -> None:
    shifts = [[(i - h) % n for i in range(n)] for h in range(2)]  # default: head h shifts by h
    pattern = blockwise_pattern(n, size, shifts, causal)
    check_against_mask("blockwise", pattern, causal, length, length, n_blocks=n, block_size=size)
    check_against_mask("blockwise", pattern, causal, length + 7, 4, n_blocks=n, block_size=size)
    perms = ((2, 0, 1), (1, 2, 0)) if n == 3 else ((1, 0), (0, 1))
    pattern = blockwise_pattern(n, size, [list(p) for p in perms], causal)
    check_against_mask(
        "blockwise", pattern, causal, length, length, n_blocks=n, block_size=size, permutations=perms
    )


@pytest.mark.usefixtures("kernel_path")
@CAUSAL
@pytest.mark.parametrize("length", [7, 13])
def test_blockwise_whole_sequence_form(causal: bool, length: int) -> None:
    """block_size=None: the call's keys are cut into n equal blocks by index (BlockBERT)."""
    n = 3
    size = -(-length // n)
    att = make_layer("blockwise", causal, n_blocks=n, block_size=None)
    q, k, v, _, _, valid = make_inputs(1, 2, length, length)
    pos = torch.arange(length)[None] + 4  # blocks follow the index, whatever the positions
    got = run_layer(att, q, k, v, pos, pos, valid)
    fixed = make_layer("blockwise", causal, n_blocks=n, block_size=size)
    idx = torch.arange(length)[None]
    torch.testing.assert_close(got, run_layer(fixed, q, k, v, idx, idx, valid), atol=1e-12, rtol=0)
    bb = inv.tiny_backbone(attention="blockwise", attention_options={"block_size": None})
    state = bb(torch.randn(1, 3, 16, dtype=torch.float64)).state
    with pytest.raises(ValueError, match="block_size"):
        bb(torch.randn(1, 2, 16, dtype=torch.float64), state=state)


@pytest.mark.usefixtures("kernel_path")
@CAUSAL
def test_blockwise_identity_and_one_block_equals_full(causal: bool) -> None:
    x = torch.randn(2, 13, 16, dtype=torch.float64)
    full = inv.tiny_backbone(attention="full", causal=causal)
    for opts in (
        {"n_blocks": 1, "block_size": None},
        {"n_blocks": 1, "block_size": 13, "permutations": ((0,),)},
    ):
        bb = inv.tiny_backbone(attention="blockwise", attention_options=opts, causal=causal)
        with torch.no_grad():
            torch.testing.assert_close(bb(x).y, full(x).y, atol=1e-12, rtol=0)


def test_blockwise_causal_fallback_is_documented_behaviour() -> None:
    sup = support("blockwise", True, 8, n_blocks=2, block_size=2, permutations=((1, 0),))
    assert sup[0, 1].nonzero().flatten().tolist() == [0, 1]  # block 0 -> block 1 is future: own block, causal
    assert sup[0, 3].nonzero().flatten().tolist() == [0, 1, 3]  # block 1 -> block 0 (+ itself)
    assert sup[0, 5].nonzero().flatten().tolist() == [4, 5]  # next super-block: block 0 -> own block, causal
    assert sup[0, 6].nonzero().flatten().tolist() == [4, 5, 6]
    with pytest.raises(ValueError, match="not a permutation of range"):
        BackboneConfig(attention="blockwise", attention_options={"permutations": ((0, 0),)})
    with pytest.raises(ValueError, match="1 or n_heads=4 permutations"):
        BackboneConfig(attention="blockwise", attention_options={"permutations": ((0, 1), (1, 0))})


@pytest.mark.usefixtures("kernel_path")
def test_blockwise_streams_with_bounded_cache() -> None:
    check_streaming_bounded("blockwise", n_blocks=3, block_size=2, bound=5)


# --------------------------------------------------------------------------------------------------- memory
@CAUSAL
def test_memory_is_far_below_length_squared(causal: bool) -> None:
    length = 8192
    cases = {
        "strided": dict(stride=128),
        "fixed": dict(stride=128, summary=4),
        "blockwise": dict(n_blocks=2, block_size=64),
    }
    for name, options in cases.items():
        largest = largest_tensor(name, causal, length, **options)
        assert largest <= length * length // 8, f"{name}: a tensor of {largest} elements"
    half = largest_tensor("blockwise", causal, length // 2, n_blocks=2, block_size=64)
    assert largest <= 2.2 * half


# ------------------------------------------------------------------------------------------- shared mask
def test_dense_pattern_mask_is_built_once_per_forward_and_rebuilt_for_new_keys() -> None:
    from types import SimpleNamespace

    from rl_transformers.backbone.attention._dense import dense_pattern

    att = SimpleNamespace(causal=True, training=False, attn_dropout=torch.nn.Dropout(0.0))
    att.position = SimpleNamespace(modifies_scores=False, scale=None)
    calls = []

    def allow(qp: torch.Tensor, kp: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return (qp - kp) % 3 == 0

    q, k, v = torch.randn(2, 2, 4, 8), torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8)
    q_pos, k_pos = torch.arange(2, 6).expand(2, -1), torch.arange(6).expand(2, -1)
    valid = torch.ones(2, 6, dtype=torch.bool)
    ctx = SimpleNamespace(extras={})
    first = dense_pattern(att, q, k, v, q_pos, k_pos, valid, allow, ctx, ("p",))
    again = dense_pattern(att, q, k, v, q_pos, k_pos, valid, allow, ctx, ("p",))
    assert len(calls) == 1 and torch.equal(first, again)
    other = valid.clone()
    other[0, 1] = False
    dense_pattern(att, q, k, v, q_pos, k_pos, other, allow, ctx, ("p",))
    assert len(calls) == 2  # new k_valid tensor: rebuilt, never the stale mask
    out = dense_pattern(att, q, k, v, q_pos, k_pos, other, allow, ctx, ("p",))
    assert len(calls) == 2
    ref = torch.zeros(
        2, 1, 4, 6, dtype=torch.bool
    )  # independent reference: the mask by loops, masked softmax
    for b in range(2):
        for i, qp in enumerate(q_pos[b].tolist()):
            for j, kp in enumerate(k_pos[b].tolist()):
                ref[b, 0, i, j] = bool(other[b, j]) and kp <= qp and (qp - kp) % 3 == 0
    logits = (q @ k.transpose(-1, -2)) / 8**0.5
    expected = torch.softmax(logits.masked_fill(~ref, float("-inf")), -1) @ v
    assert torch.allclose(out, expected, atol=1e-5)


# ------------------------------------------------------------------------------- bounded cache (max_cache)
def windowed(pattern: Pattern, window: int, causal: bool) -> Pattern:
    """The pattern over the keys at most ``window`` steps back (both sides when bidirectional)."""
    return lambda i, j, h: pattern(i, j, h) and (0 <= i - j <= window if causal else abs(i - j) <= window)


@pytest.mark.usefixtures("kernel_path")
@CAUSAL
@pytest.mark.parametrize("combine", COMBINES)
def test_max_cache_restricts_the_pattern_to_the_window(causal: bool, combine: str) -> None:
    for window in (2, 5, 11):
        for layer in (0, 1):
            strided = windowed(combined(*strided_parts(3), combine, layer, 3), window, causal)
            opts = dict(stride=3, combine=combine, n_heads=3, layer=layer, max_cache=window)
            check_against_mask("strided", strided, causal, 23, 23, **opts)
            check_against_mask("strided", strided, causal, 31, 5, **opts)
            fixed = windowed(combined(*fixed_parts(4, 2), combine, layer, 3), window, causal)
            opts = dict(stride=4, summary=2, combine=combine, n_heads=3, layer=layer, max_cache=window)
            check_against_mask("fixed", fixed, causal, 23, 23, **opts)
            check_against_mask("fixed", fixed, causal, 31, 5, **opts)


@pytest.mark.usefixtures("kernel_path")
def test_max_cache_streams_exactly_with_a_bounded_cache() -> None:
    """The policy's bound (bound_context): chunked == one pass, and the cache keeps max_cache keys, not all."""
    check_streaming_bounded("strided", length=23, bound=5, stride=3, max_cache=5)
    check_streaming_bounded("fixed", length=23, bound=6, stride=4, summary=2, max_cache=6)
    bb = inv.tiny_backbone(
        attention="strided", attention_options={"stride": 3, "combine": "alternate", "max_cache": 2}
    )
    assert [bb.depth.attention_for(i).max_cache for i in range(2)] == [2, 2]  # min(bound, local reach)
    with pytest.raises(ValueError, match="max_cache"):
        BackboneConfig(attention="fixed", attention_options={"max_cache": 0})
