"""``local``, ``block_local``, ``block_local_2d`` against explicit masks built by loops from the papers' definitions.

Also holds the helpers shared by test_sparse.py and test_global_local.py: the loop-built reference, inputs with
per-row position offsets / key padding / a cache-like prefix, a "scores" position scheme with a bias and a value
term, and the largest-tensor tracker of the memory tests.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from rl_transformers.backbone import BackboneConfig, registry
from rl_transformers.backbone.context import ForwardContext
from rl_transformers.backbone.position.base import Position
from rl_transformers.backbone.reference import reference_attention
from tests.backbone import invariants as inv

torch.set_num_threads(1)
LENGTHS = [1, 7, 13, 33]
Pattern = Callable[[int, int, int], bool]


# --------------------------------------------------------------------------------------------------- helpers
class ScoresPosition(Position):
    """Test scheme of kind "scores": logits q·k/sqrt(D) - m_h·|i - j| and a value term Σ_j p_ij e(i - j)."""

    kind = "scores"
    shift_invariant = True

    def slopes(self, device: torch.device) -> Tensor:
        return 0.3 * (torch.arange(self.n_heads, device=device, dtype=torch.float64) + 1)

    def embedding(self, rel: Tensor) -> Tensor:
        freq = torch.arange(1, self.d_head + 1, device=rel.device, dtype=torch.float64) / self.d_head
        return torch.sin(rel.unsqueeze(-1).double() * freq)

    def logits(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        rel = (q_pos.unsqueeze(-1) - k_pos.unsqueeze(-2)).abs().double().unsqueeze(1)
        slope = self.slopes(q.device).view(1, -1, *([1] * (rel.dim() - 2)))
        return torch.matmul(q, k.transpose(-1, -2)) * self.scale - (slope * rel).to(q.dtype)

    def value_term(self, probs: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        e = self.embedding(q_pos.unsqueeze(-1) - k_pos.unsqueeze(-2)).unsqueeze(1).to(probs.dtype)
        return (probs.unsqueeze(-1) * e).sum(-2)


def make_layer(
    name: str,
    causal: bool,
    n_heads: int = 2,
    d_head: int = 4,
    layer: int = 0,
    scores: bool = False,
    **options: Any,
) -> Any:
    """One attention layer in float64 (position "none", or the test "scores" scheme)."""
    cfg = BackboneConfig(
        d_model=n_heads * d_head,
        n_layers=2,
        n_heads=n_heads,
        position="none",
        causal=causal,
        attention=name,
        attention_options=options,
    )
    position = ScoresPosition(cfg, None) if scores else registry.get("position", "none").cls(cfg, None)
    return registry.get("attention", name).cls(cfg, cfg.options("attention"), position, layer).double()


def make_inputs(
    b: int, h: int, s: int, t: int, d: int = 4, seed: int = 0, offsets: tuple[int, ...] = (0, 5, 2)
) -> tuple[Tensor, ...]:
    """q (B,H,T,D), k, v (B,H,S,D), q_pos (B,T), k_pos, k_valid (B,S): the T queries are the last T keys.

    Row b's positions start at offsets[b]; row 0 has a padded key in the middle; row 1 starts with a cleared,
    cache-like prefix (invalid keys with position 0) when S > T.
    """
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, t, d, generator=g, dtype=torch.float64)
    k = torch.randn(b, h, s, d, generator=g, dtype=torch.float64)
    v = torch.randn(b, h, s, d, generator=g, dtype=torch.float64)
    k_pos = torch.stack([torch.arange(s) + offsets[i % len(offsets)] for i in range(b)])
    k_valid = torch.ones(b, s, dtype=torch.bool)
    if s > 3:
        k_valid[0, s // 2] = False
    if b > 1 and s > t:
        n = min(3, s - t)
        k_valid[1, :n] = False
        k_pos[1, :n] = 0
    return q, k, v, k_pos[:, s - t :], k_pos, k_valid


def reference_for(
    pattern: Pattern, causal: bool, q: Tensor, k: Tensor, v: Tensor, q_pos: Tensor, k_pos: Tensor,
    k_valid: Tensor, scores: Position | None = None,
) -> Tensor:  # fmt: skip
    """Dense float64 reference under the mask built by loops: key j visible from query t iff it is valid, the
    pattern allows (query position, key position, head) and (causal) it is not in the future - or j is the
    query's own key."""
    b, h, t, _ = q.shape
    s = k.shape[2]
    qps, kps, valid = q_pos.tolist(), k_pos.tolist(), k_valid.tolist()
    mask = torch.zeros(b, h, t, s, dtype=torch.bool)
    for r, head, i in itertools.product(range(b), range(h), range(t)):
        qp = qps[r][i]
        row = []
        for j in range(s):
            kp = kps[r][j]
            allowed = valid[r][j] and pattern(qp, kp, head) and (not causal or kp <= qp)
            row.append(allowed or j == s - t + i)
        mask[r, head, i] = torch.tensor(row)
    if scores is None:
        return reference_attention(q, k, v, mask=mask)
    rel = q_pos[:, :, None] - k_pos[:, None, :]
    bias = -scores.slopes(q.device).view(1, -1, 1, 1) * rel.abs().unsqueeze(1).double()
    out, probs = reference_attention(q, k, v, mask=mask, bias=bias, return_probs=True)
    return out + torch.einsum("bhts,btsd->bhtd", probs, scores.embedding(rel))


def run_layer(
    att: Any, q: Tensor, k: Tensor, v: Tensor, q_pos: Tensor, k_pos: Tensor, k_valid: Tensor
) -> Tensor:
    ctx = ForwardContext(pos=q_pos, valid=k_valid[:, -q.shape[2] :], causal=att.causal)
    return att.attend(q, k, v, q_pos, k_pos, k_valid, ctx)


def check_against_mask(
    name: str, pattern: Pattern, causal: bool, s: int, t: int, scores: bool = False, n_heads: int = 2,
    layer: int = 0, **options: Any,
) -> None:  # fmt: skip
    att = make_layer(name, causal, n_heads=n_heads, scores=scores, layer=layer, **options)
    x = make_inputs(2, n_heads, s, t)
    got = run_layer(att, *x)
    want = reference_for(pattern, causal, *x, scores=att.position if scores else None)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


def support(name: str, causal: bool, length: int, n_heads: int = 2, layer: int = 0, **options: Any) -> Tensor:
    """(H, L, L) bool: which keys each query attends, read off the kernel itself (q = 0 gives uniform weights
    over the visible keys; one-hot values reveal them)."""
    att = make_layer(name, causal, n_heads=n_heads, d_head=length, layer=layer, **options)
    q = torch.zeros(1, n_heads, length, length, dtype=torch.float64)
    k = torch.zeros_like(q)
    v = torch.eye(length, dtype=torch.float64).expand(1, n_heads, length, length)
    pos = torch.arange(length)[None]
    out = run_layer(att, q, k, v, pos, pos, torch.ones(1, length, dtype=torch.bool))
    return out[0] > 1e-12


class Largest(TorchDispatchMode):
    """Tracks the largest tensor (element count) any op creates."""

    def __init__(self) -> None:
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for x in tree_flatten(out)[0]:
            if isinstance(x, Tensor):
                self.numel = max(self.numel, x.numel())
        return out


def largest_tensor(name: str, causal: bool, length: int, n_heads: int = 2, **options: Any) -> int:
    att = make_layer(name, causal, n_heads=n_heads, d_head=16, **options).float()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, n_heads, length, 16, generator=g) for _ in range(3))
    pos = torch.arange(length)[None]
    tracker = Largest()
    with torch.no_grad(), tracker:
        out = run_layer(att, q, k, v, pos, pos, torch.ones(1, length, dtype=torch.bool))
    assert torch.isfinite(out).all()
    return tracker.numel


def check_streaming_bounded(name: str, length: int = 23, bound: int | None = None, **options: Any) -> None:
    """Chunked == full (every chunking), reset row == fresh, and the per-layer cache never exceeds ``bound``."""
    bb = inv.tiny_backbone(attention=name, attention_options=options, position="rope")
    inv.check_streaming(bb, length=length)
    inv.check_reset(bb, prefix=9, length=10)
    x = torch.randn(2, length, bb.cfg.d_model, dtype=torch.float64)
    with torch.no_grad():
        _, state = inv.run_chunks(bb, x, [4] * (length // 4) + ([length % 4] if length % 4 else []))
    for layer_state in state.layers:
        cache = getattr(layer_state, "window", layer_state)
        assert cache.length == (length if bound is None else min(bound, length))


# ----------------------------------------------------------------------------------------------------- local
def local_pattern(w: int) -> Pattern:
    return lambda i, j, h: abs(i - j) <= w


@pytest.mark.usefixtures("kernel_path")
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("window", [0, 1, 3])
def test_local_matches_explicit_mask(causal: bool, length: int, window: int) -> None:
    check_against_mask("local", local_pattern(window), causal, length, length, window=window)
    # small compute blocks: many blocks, padding of the last one
    check_against_mask("local", local_pattern(window), causal, length, length, window=window, block=2)


@pytest.mark.usefixtures("kernel_path")
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize(("s", "t"), [(20, 5), (33, 1), (13, 4)])
def test_local_with_cached_keys(causal: bool, s: int, t: int) -> None:
    check_against_mask("local", local_pattern(3), causal, s, t, window=3)


def test_local_window_convention_is_w_keys_plus_self() -> None:
    causal = support("local", True, 12, window=3)
    bidir = support("local", False, 12, window=3)
    assert causal[0, 9].nonzero().flatten().tolist() == [6, 7, 8, 9]  # itself and the w = 3 keys before it
    assert bidir[1, 5].nonzero().flatten().tolist() == [2, 3, 4, 5, 6, 7, 8]  # 2w + 1 keys
    assert causal[0, 1].nonzero().flatten().tolist() == [0, 1]


@pytest.mark.usefixtures("kernel_path")
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_local_window_at_least_length_equals_full(causal: bool) -> None:
    x = torch.randn(2, 11, 16, dtype=torch.float64)
    local = inv.tiny_backbone(attention="local", attention_options={"window": 11}, causal=causal)
    full = inv.tiny_backbone(attention="full", causal=causal)
    with torch.no_grad():
        torch.testing.assert_close(local(x).y, full(x).y, atol=1e-12, rtol=0)
    narrow = inv.tiny_backbone(attention="local", attention_options={"window": 2}, causal=causal)
    with torch.no_grad():
        assert not torch.allclose(narrow(x).y, full(x).y)


@pytest.mark.usefixtures("kernel_path")
def test_local_streaming_keeps_w_keys() -> None:
    check_streaming_bounded("local", window=3, bound=3)


# ----------------------------------------------------------------------------------------------- block_local
def block_local_pattern(block: int, flange: int) -> Pattern:
    def allowed(i: int, j: int, h: int) -> bool:
        start = (i // block) * block  # first position of the query's block
        return start - flange <= j <= start + block - 1 + flange

    return allowed


@pytest.mark.usefixtures("kernel_path")
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize(("block", "flange"), [(4, 3), (5, 0), (1, 2)])
def test_block_local_matches_explicit_mask(causal: bool, length: int, block: int, flange: int) -> None:
    pattern = block_local_pattern(block, flange)
    check_against_mask("block_local", pattern, causal, length, length, block=block, flange=flange)
    check_against_mask("block_local", pattern, causal, length + 9, 5, block=block, flange=flange)


def test_block_local_blocks_follow_absolute_positions() -> None:
    sup = support("block_local", True, 12, block=4, flange=2)[0]
    assert sup[5].nonzero().flatten().tolist() == [2, 3, 4, 5]  # block [4, 8) with flange 2, causal
    assert sup[8].nonzero().flatten().tolist() == [6, 7, 8]


@pytest.mark.usefixtures("kernel_path")
def test_block_local_streaming_is_exact_with_bounded_cache() -> None:
    check_streaming_bounded("block_local", block=4, flange=3, bound=6)


# -------------------------------------------------------------------------------------------- block_local_2d
def block_2d_pattern(image: tuple[int, int], query: tuple[int, int], flange: tuple[int, int]) -> Pattern:
    (height, width), (qh, qw), (fh, fw) = image, query, flange

    def allowed(i: int, j: int, h: int) -> bool:
        if i // (height * width) != j // (height * width):  # different images
            return False
        ri, ci = divmod(i % (height * width), width)
        rj, cj = divmod(j % (height * width), width)
        top, left = (ri // qh) * qh, (ci // qw) * qw  # the query block's corner
        return top - fh <= rj <= top + qh - 1 + fh and left - fw <= cj <= left + qw - 1 + fw

    return allowed


SHAPES_2D = [((3, 5), (2, 2), (1, 1)), ((4, 4), (2, 3), (0, 1)), ((2, 7), (1, 2), (1, 3))]


@pytest.mark.usefixtures("kernel_path")
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("shapes", SHAPES_2D, ids=["3x5", "4x4", "2x7"])
def test_block_local_2d_matches_direct_coordinate_check(causal: bool, length: int, shapes: tuple) -> None:
    image, query, flange = shapes
    pattern = block_2d_pattern(image, query, flange)
    opts = dict(image_shape=image, query_shape=query, flange=flange)
    check_against_mask("block_local_2d", pattern, causal, length, length, **opts)
    check_against_mask("block_local_2d", pattern, causal, length + 6, 4, **opts)


@pytest.mark.usefixtures("kernel_path")
def test_block_local_2d_infers_the_width_without_streaming() -> None:
    inferred = make_layer("block_local_2d", False, image_shape=None)
    fixed = make_layer("block_local_2d", False, image_shape=(4, 4))
    x = make_inputs(1, 2, 16, 16)
    torch.testing.assert_close(run_layer(inferred, *x), run_layer(fixed, *x), atol=1e-12, rtol=0)
    bb = inv.tiny_backbone(attention="block_local_2d", attention_options={"image_shape": None})
    state = bb(torch.randn(1, 4, 16, dtype=torch.float64)).state
    with pytest.raises(ValueError, match="image_shape"):
        bb(torch.randn(1, 2, 16, dtype=torch.float64), state=state)


@pytest.mark.usefixtures("kernel_path")
def test_block_local_2d_streaming_is_exact_with_bounded_cache() -> None:
    opts = dict(image_shape=(3, 5), query_shape=(2, 2), flange=(1, 1))
    check_streaming_bounded("block_local_2d", bound=2 * 5 + 2, **opts)


def test_block_local_2d_on_a_stream_never_links_a_row_start_to_its_predecessor() -> None:
    """The defaults on a 1D stream (the study's use), through any depth: the first column of a raster row never
    depends on the step before it (the previous row's last column is outside every memory rectangle that
    precedes it), and no step depends on a step of an earlier image. The memory probe's 0.90 at k = 1 is this:
    1/W of the steps cannot see their predecessor (docs/encoder_study.md)."""
    bb = inv.tiny_backbone(attention="block_local_2d", n_layers=3)
    height, width = bb.cfg.options("attention").image_shape
    with torch.no_grad():
        for p in bb.parameters():
            p.normal_(0.0, 0.5)  # no zero-initialised output path hides a dependency
    length = 2 * height * width
    x = torch.randn(1, length, bb.cfg.d_model, dtype=torch.float64, requires_grad=True)
    y = bb(x, state=bb.init_state(1)).y
    for t in (1, width - 1, width, 3 * width, height * width, height * width + width, length - 1):
        (grad,) = torch.autograd.grad(y[0, t].sum(), x, retain_graph=True)
        seen = grad[0].abs().sum(-1) > 0
        assert bool(seen[t - 1]) == (t % width != 0), t
        assert not seen[: t - t % (height * width)].any(), t  # nothing from an earlier image


# ------------------------------------------------------------------------------------- all three, shared paths
@pytest.mark.usefixtures("kernel_path")
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_scores_position_scheme_on_blocks(causal: bool) -> None:
    check_against_mask("local", local_pattern(3), causal, 13, 13, scores=True, window=3)
    check_against_mask("local", local_pattern(2), causal, 20, 6, scores=True, window=2)
    check_against_mask(
        "block_local", block_local_pattern(4, 2), causal, 13, 13, scores=True, block=4, flange=2
    )
    shapes = SHAPES_2D[0]
    opts = dict(image_shape=shapes[0], query_shape=shapes[1], flange=shapes[2])
    check_against_mask("block_local_2d", block_2d_pattern(*shapes), causal, 33, 33, scores=True, **opts)


@pytest.mark.usefixtures("kernel_path")
def test_gradcheck_banded_kernel() -> None:
    att = make_layer("local", True, scores=True, window=2, block=2)
    q, k, v, q_pos, k_pos, k_valid = make_inputs(2, 2, 7, 5)
    for x in (q, k, v):
        x.requires_grad_(True)
    fn = lambda q, k, v: run_layer(att, q, k, v, q_pos, k_pos, k_valid)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v))


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_memory_grows_with_window_not_length(causal: bool) -> None:
    length = 8192
    cases = {
        "local": dict(window=64),
        "block_local": dict(block=64, flange=64),
        "block_local_2d": dict(image_shape=(64, 128), query_shape=(4, 4), flange=(2, 2)),
    }
    for name, options in cases.items():
        largest = largest_tensor(name, causal, length, **options)
        assert largest <= length * length // 8, f"{name}: a tensor of {largest} elements"
        half = largest_tensor(name, causal, length // 2, **options)
        assert largest <= 2.2 * half, f"{name}: largest tensor grows faster than L ({half} -> {largest})"
    # the tracker does see an L x L score matrix when one is made
    dense = largest_tensor("local", causal, 512, window=512, block=512)
    assert dense >= 512 * 512


def test_options_are_validated() -> None:
    with pytest.raises(ValueError, match="window must be an int >= 0"):
        BackboneConfig(attention="local", attention_options={"window": -1})
    with pytest.raises(ValueError, match="query_shape"):
        BackboneConfig(attention="block_local_2d", attention_options={"query_shape": (0, 2)})
    with pytest.raises(ValueError, match="Did you mean 'flange'"):
        BackboneConfig(attention="block_local", attention_options={"flang": 2})
