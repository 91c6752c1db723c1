"""``routing`` (Routing Transformer): cluster mask vs an independent reference, one cluster == full, local
heads, commitment loss, EMA k-means, streaming with per-key cluster ids."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from rl_transformers.backbone import Backbone, BackboneConfig
from rl_transformers.backbone.attention import _dense
from rl_transformers.backbone.attention.base import dense_attention
from rl_transformers.backbone.attention.routing import band_attention, cluster_attention
from rl_transformers.backbone.context import ForwardContext
from rl_transformers.backbone.reference import reference_attention
from tests.backbone import invariants as inv

torch.set_num_threads(1)


def _layer(causal: bool = True, position: str = "none", **options: object):
    cfg = BackboneConfig(
        d_model=16, n_layers=1, n_heads=2, position=position, causal=causal, attention="routing",
        attention_options=options,
    )  # fmt: skip
    return Backbone(cfg).double().eval().depth.blocks[0].attention


def _ctx(b: int, t: int, causal: bool = True) -> ForwardContext:
    return ForwardContext(
        pos=torch.arange(t).expand(b, t), valid=torch.ones(b, t, dtype=torch.bool), causal=causal
    )


def _nearest(x: torch.Tensor, mu: torch.Tensor) -> torch.Tensor:
    """Cluster id (B, H, N) = argmin_c |x/|x| - μ_c|, computed by distances (not dot products)."""
    xn = x / x.norm(dim=-1, keepdim=True)
    dist = (xn.unsqueeze(-2) - mu[None, :, None]).pow(2).sum(-1)  # (B, H, N, k)
    return dist.argmin(-1)


def _cluster_mask(cq, ck, valid, causal, s_off=0, max_cache=None):
    """(B, H, T, S) by loops: same cluster, visible, plus always the own key."""
    b, h, t = cq.shape
    s = ck.shape[2]
    mask = torch.zeros(b, h, t, s, dtype=torch.bool)
    for bi in range(b):
        for hi in range(h):
            for i in range(t):
                gi = i + s_off
                for j in range(s):
                    ok = bool(valid[bi, j]) and int(cq[bi, hi, i]) == int(ck[bi, hi, j])
                    ok = ok and (j <= gi or not causal) and (max_cache is None or gi - j <= max_cache)
                    mask[bi, hi, i, j] = ok or j == gi
    return mask


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("path", ["blocked", "dense", "fused"])
def test_cluster_attention_matches_reference(
    causal: bool, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if path == "fused":  # the blocks through the fused kernel, in chunks of 2 query slots
        monkeypatch.setattr(_dense, "FUSED_MIN_LEN", 0)
        monkeypatch.setattr(_dense, "FUSED_CHUNK", 2)
        path = "blocked"
    else:
        monkeypatch.setattr(_dense, "FUSED_MIN_LEN", 10**9)
    torch.manual_seed(0)
    att = _layer(causal=causal, n_clusters=3)
    b, h, t, s, d = 2, 2, 9, 13, 8  # 4 keys before the queries (cache / memory)
    q, k, v = torch.randn(b, h, t, d), torch.randn(b, h, s, d), torch.randn(b, h, s, d)
    q, k, v = q.double(), k.double(), v.double()
    valid = torch.ones(b, s, dtype=torch.bool)
    valid[0, [2, 7]] = False
    mu = att.centroids
    cq, ck = _nearest(q, mu), _nearest(k, mu)
    pos_q, pos_k = torch.arange(4, s).expand(b, t), torch.arange(s).expand(b, s)
    got = cluster_attention(att, q, k, v, pos_q, pos_k, valid, cq, ck, 3, [0, 1], max_cache=6, path=path)
    mask = _cluster_mask(cq, ck, valid, causal, s_off=s - t, max_cache=6)
    torch.testing.assert_close(got, reference_attention(q, k, v, mask=mask), atol=1e-10, rtol=0)


@pytest.mark.parametrize("position", ["alibi", "shaw"])
def test_blocked_path_with_gathered_positions(position: str) -> None:
    torch.manual_seed(1)
    att = _layer(causal=True, position=position, n_clusters=3)
    for p in att.position.parameters():
        p.data.normal_(0, 0.3)
    b, h, t, d = 2, 2, 12, 8
    q, k, v = (torch.randn(b, h, t, d, dtype=torch.float64) for _ in range(3))
    pos = (torch.arange(t) + 3).expand(b, t)
    valid = torch.ones(b, t, dtype=torch.bool)
    cq, ck = _nearest(q, att.centroids), _nearest(k, att.centroids)
    got = cluster_attention(att, q, k, v, pos, pos, valid, cq, ck, 3, [0, 1], path="blocked")
    ref, _ = dense_attention(q, k, v, _cluster_mask(cq, ck, valid, True), att.position, pos, pos, 0)
    torch.testing.assert_close(got, ref, atol=1e-10, rtol=0)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_one_cluster_equals_full_attention(causal: bool) -> None:
    x = torch.randn(2, 11, 16, dtype=torch.float64)
    routed = inv.tiny_backbone(attention="routing", attention_options={"n_clusters": 1}, causal=causal)
    full = inv.tiny_backbone(attention="full", causal=causal)  # same seed: same weights
    full.load_state_dict(routed.state_dict(), strict=False)
    with torch.no_grad():
        torch.testing.assert_close(routed(x).y, full(x).y, atol=1e-10, rtol=0)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_local_heads_are_a_sliding_window(causal: bool) -> None:
    torch.manual_seed(2)
    att = _layer(causal=causal, local_heads=1, local_window=3, n_clusters=2)
    b, t, d = 2, 14, 8
    q, k, v = (torch.randn(b, 2, t, d, dtype=torch.float64) for _ in range(3))
    pos = torch.arange(t).expand(b, t)
    valid = torch.ones(b, t, dtype=torch.bool)
    valid[1, 5] = False
    out, _ = att.core(q, k, v, pos, pos, valid, _ctx(b, t, causal), None)
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    near = ((i - j >= 0) & (i - j <= 3)) if causal else (i - j).abs() <= 3
    mask = (near & valid[:, None, None, :]) | (i == j)
    torch.testing.assert_close(out[:, :1], reference_attention(q[:, :1], k[:, :1], v[:, :1], mask=mask))
    # the other head routes
    cq, ck = _nearest(q[:, 1:], att.centroids), _nearest(k[:, 1:], att.centroids)
    mask_r = _cluster_mask(cq, ck, valid, causal)
    torch.testing.assert_close(out[:, 1:], reference_attention(q[:, 1:], k[:, 1:], v[:, 1:], mask=mask_r))
    # band kernel with a cache prefix and a bound
    got = band_attention(att, q[:, :1, 4:], k[:, :1], v[:, :1], pos[:, 4:], pos, valid, 3, [0], max_cache=2)
    ii = torch.arange(4, t)[:, None]
    near = ((ii - j >= 0) & (ii - j <= 2)) if causal else ((ii - j).abs() <= 3) & (ii - j <= 2)
    mask = (near & valid[:, None, None, :]) | (ii == j)
    torch.testing.assert_close(got, reference_attention(q[:, :1, 4:], k[:, :1], v[:, :1], mask=mask))


def test_commitment_loss_value_and_gradient() -> None:
    torch.manual_seed(3)
    opts = {"n_clusters": 3, "commitment_weight": 0.5}
    bb = inv.tiny_backbone(attention="routing", n_layers=1, attention_options=opts).train()
    att = bb.depth.blocks[0].attention
    mu0 = att.centroids.clone()
    x = torch.randn(2, 10, 16, dtype=torch.float64)
    bb.collect_info = True
    out = bb(x)
    torch.testing.assert_close(
        out.aux_losses["routing_commitment"], 0.5 * out.info["backbone/routing_commitment"]
    )
    loss = out.info["backbone/routing_commitment"]
    weighted = out.aux_losses["routing_commitment"]
    assert torch.isfinite(loss) and loss > 0
    # the formula, from the layer's own projections
    h = bb.depth.blocks[0].norm1(x)
    q = att.q_proj(h).view(2, 10, 2, 8).transpose(1, 2)
    k = att.k_proj(h).view(2, 10, 2, 8).transpose(1, 2)
    pos = torch.arange(10).expand(2, 10)
    q, k = att.position.transform_q(q, pos, 0), att.position.transform_k(k, pos, 0)
    dist = []
    for x_ in (q, k):
        xn = F.normalize(x_, dim=-1)
        d = (xn.unsqueeze(-2) - mu0[None, :, None]).pow(2).sum(-1)
        dist.append(d.min(-1).values)
    expected = (dist[0].sum() + dist[1].sum()) / (2 * 2 * 10 * 2)
    torch.testing.assert_close(loss, expected.detach(), atol=1e-10, rtol=0)
    weighted.backward()
    assert att.q_proj.weight.grad.abs().sum() > 0 and att.k_proj.weight.grad.abs().sum() > 0
    assert att.v_proj.weight.grad is None or att.v_proj.weight.grad.abs().sum() == 0


def test_ema_centroids_move_to_the_data_in_training_only() -> None:
    torch.manual_seed(4)
    att = _layer(n_clusters=2, decay=0.5)
    b, t, d = 4, 16, 8
    # two well separated directions; each head sees the same data
    base = F.normalize(torch.randn(2, d, dtype=torch.float64), dim=-1)
    pick = torch.randint(0, 2, (b, t))
    data = base[pick] + 0.05 * torch.randn(b, t, d, dtype=torch.float64)
    q = k = data[:, None].expand(b, 2, t, d).contiguous()
    pos = torch.arange(t).expand(b, t)
    valid = torch.ones(b, t, dtype=torch.bool)

    def loss_and_mu() -> tuple[float, torch.Tensor]:
        ctx = _ctx(b, t)
        att.core(q, k, q, pos, pos, valid, ctx, None)
        return float(ctx.aux["routing_commitment"]), att.centroids.clone()

    att.eval()
    loss0, mu0 = loss_and_mu()
    _, mu_eval = loss_and_mu()
    torch.testing.assert_close(mu_eval, mu0)  # eval: no update
    att.train()
    losses = [loss_and_mu()[0] for _ in range(8)]
    assert losses[-1] < 0.2 * loss0, (loss0, losses)
    assert all(a >= b_ - 1e-12 for a, b_ in itertools.pairwise(losses))
    mu = att.centroids
    torch.testing.assert_close(mu.norm(dim=-1), torch.ones(2, 2, dtype=torch.float64))
    best = (mu @ base.T).amax(dim=1)  # each data direction has a centroid next to it
    assert (best > 0.99).all(), best


@pytest.mark.parametrize(
    "options",
    [dict(n_clusters=3), dict(n_clusters=2, local_heads=1, local_window=3), dict(n_clusters=2, max_cache=5)],
    ids=["routing", "with-local-head", "max_cache"],
)
def test_streaming_with_cluster_ids_in_the_cache(options: dict) -> None:
    bb = inv.tiny_backbone(attention="routing", position="rope", attention_options=options)
    inv.check_streaming(bb, length=20)
    inv.check_causal(bb, length=16, t=7)
    inv.check_reset(bb)
    _, state = inv.run_chunks(bb, torch.randn(2, 20, 16, dtype=torch.float64), [7, 13])
    cache = state.layers[0]
    n_routing = 2 - options.get("local_heads", 0)
    assert cache.clusters.shape == (2, n_routing, cache.length)
    if "max_cache" in options:
        assert cache.length == options["max_cache"]


def test_incompatible_options_raise_at_construction() -> None:
    with pytest.raises(ValueError, match="local_heads=2 must be < n_heads=2"):
        _layer(local_heads=2)
    with pytest.raises(ValueError, match=r"routing_commitment.*recompute"):
        BackboneConfig(attention="routing", block="reversible")
    BackboneConfig(attention="routing", block="reversible", block_options={"recompute": False})


def _dense_routing(q, k, v, mask, scale):
    """Explicit float64 masked softmax (differentiable reference)."""
    logits = torch.matmul(q, k.transpose(-1, -2)) * scale
    return torch.matmul(torch.softmax(logits.masked_fill(~mask, float("-inf")), dim=-1), v)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("case", ["self", "cache+padding", "one-cluster", "strided-inputs"])
def test_flash_path_matches_reference_forward_and_gradients(causal: bool, case: str) -> None:
    """The clusters' slots as one CPU flash call (+ own key by log-sum-exp) vs the explicit mask, float64."""
    from rl_transformers.backbone.attention import _routing_flash

    if not _routing_flash.HAS_CPU_FLASH:
        pytest.skip("no CPU flash kernel")
    torch.manual_seed(5)
    n_clusters = 1 if case == "one-cluster" else 3
    att = _layer(causal=causal, n_clusters=n_clusters)
    b, h, t, d = 2, 2, 23, 8
    s = t + 6 if case == "cache+padding" else t
    if case == "strided-inputs":  # the layer's (B, T, H, D) layout, heads sliced (local heads first)
        leaves = [torch.randn(b, n, h + 1, d, dtype=torch.float64, requires_grad=True) for n in (t, s, s)]
        q, k, v = (x.transpose(1, 2)[:, 1:] for x in leaves)
    else:
        q = torch.randn(b, h, t, d, dtype=torch.float64, requires_grad=True)
        k = torch.randn(b, h, s, d, dtype=torch.float64, requires_grad=True)
        v = torch.randn(b, h, s, d, dtype=torch.float64, requires_grad=True)
    valid = torch.ones(b, s, dtype=torch.bool)
    if case == "cache+padding":
        valid[0, [1, 7, s - 3]] = False  # one of them is a query's own key (still attended)
        valid[1, :4] = False
    cq, ck = _nearest(q.detach(), att.centroids), _nearest(k.detach(), att.centroids)
    pos_q, pos_k = torch.arange(s - t, s).expand(b, t), torch.arange(s).expand(b, s)
    got = cluster_attention(att, q, k, v, pos_q, pos_k, valid, cq, ck, n_clusters, [0, 1], path="flash")
    mask = _cluster_mask(cq, ck, valid, causal, s_off=s - t)
    ref = _dense_routing(q, k, v, mask, att.position.scale)
    torch.testing.assert_close(got, ref, atol=1e-10, rtol=0)
    g = torch.randn_like(ref)
    grads = torch.autograd.grad(got, (q, k, v), g)
    ref_grads = torch.autograd.grad(ref, (q, k, v), g)
    for a, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(a, r, atol=1e-10, rtol=0)


def test_flash_path_is_taken_for_long_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """ "auto" takes the flash form for long calls (forced at a small size) and agrees with the blocked path."""
    from rl_transformers.backbone.attention import _routing_flash

    if not _routing_flash.HAS_CPU_FLASH:
        pytest.skip("no CPU flash kernel")
    calls = []
    real = _routing_flash.RoutingFlash.apply
    monkeypatch.setattr(_routing_flash.RoutingFlash, "apply", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(_dense, "FUSED_MIN_LEN", 0)
    monkeypatch.setattr(_dense, "DENSE_MAX_KEYS", 0)
    torch.manual_seed(6)
    att = _layer(causal=True, n_clusters=4)
    b, h, t, d = 1, 2, 40, 8
    q, k, v = (torch.randn(b, h, t, d, dtype=torch.float64) for _ in range(3))
    pos, valid = torch.arange(t).expand(b, t), torch.ones(b, t, dtype=torch.bool)
    cq, ck = _nearest(q, att.centroids), _nearest(k, att.centroids)
    got = cluster_attention(att, q, k, v, pos, pos, valid, cq, ck, 4, [0, 1])
    assert calls, "the flash form was not taken"
    ref = cluster_attention(att, q, k, v, pos, pos, valid, cq, ck, 4, [0, 1], path="dense")
    torch.testing.assert_close(got, ref, atol=1e-10, rtol=0)
    # max_cache: not this form's pattern, falls back
    calls.clear()
    cluster_attention(att, q, k, v, pos, pos, valid, cq, ck, 4, [0, 1], max_cache=5)
    assert not calls


def test_flash_path_float32_gradients_are_finite_and_close() -> None:
    """float32 (the masked slots' large negative logits must give exact zeros, no inf / nan)."""
    from rl_transformers.backbone.attention import _routing_flash

    if not _routing_flash.HAS_CPU_FLASH:
        pytest.skip("no CPU flash kernel")
    torch.manual_seed(7)
    att = _layer(causal=True, n_clusters=4)
    b, h, t, d = 2, 2, 64, 8
    x64 = [torch.randn(b, h, t, d, dtype=torch.float64) * 3 for _ in range(3)]
    x32 = [x.float().requires_grad_(True) for x in x64]
    x64 = [x.requires_grad_(True) for x in x64]
    cq, ck = _nearest(x64[0].detach(), att.centroids), _nearest(x64[1].detach(), att.centroids)
    pos, valid = torch.arange(t).expand(b, t), torch.ones(b, t, dtype=torch.bool)
    got = cluster_attention(att.float(), *x32, pos, pos, valid, cq, ck, 4, [0, 1], path="flash")
    ref = _dense_routing(*x64, _cluster_mask(cq, ck, valid, True), att.position.scale)
    torch.testing.assert_close(got.double(), ref, atol=2e-5, rtol=0)
    g = torch.randn_like(ref)
    for a, r in zip(torch.autograd.grad(got, x32, g.float()), torch.autograd.grad(ref, x64, g), strict=True):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a.double(), r, atol=1e-4, rtol=0)


def test_commitment_weight_defaults_to_the_reference_and_is_checked() -> None:
    """1e-4 as lucidrains/routing-transformer: at 1 the loss (~1.7 at the start) swamped the PPO loss (~0.06)."""
    torch.manual_seed(5)
    bb = inv.tiny_backbone(attention="routing", n_layers=1, attention_options={"n_clusters": 3}).train()
    bb.collect_info = True
    out = bb(torch.randn(2, 10, 16, dtype=torch.float64))
    raw = out.info["backbone/routing_commitment"]
    assert raw > 0
    torch.testing.assert_close(out.aux_losses["routing_commitment"], 1e-4 * raw)
    with pytest.raises(ValueError, match="commitment_weight must be a number >= 0, got -1"):
        inv.tiny_backbone(attention="routing", attention_options={"commitment_weight": -1})


def _predecessor_blind(options: dict) -> int:
    """How many steps of a random 64-step stream do not depend on the step before them (one layer)."""
    bb = inv.tiny_backbone(attention="routing", n_layers=1, attention_options=options)
    with torch.no_grad():
        for p in bb.parameters():
            if p.dtype.is_floating_point:
                p.normal_(0.0, 0.5)  # no zero-initialised output path hides a dependency
    x = torch.randn(1, 64, bb.cfg.d_model, dtype=torch.float64, requires_grad=True)
    y = bb(x, state=bb.init_state(1)).y
    grads = [torch.autograd.grad(y[0, t].sum(), x, retain_graph=True)[0][0, t - 1] for t in range(1, 64)]
    return sum(int(g.abs().max() == 0) for g in grads)


def test_routing_heads_alone_do_not_see_every_predecessor_and_a_local_head_does() -> None:
    """Why ``routing`` (default ``local_heads=0``) fails the memory probe at k = 1 (0.75): a step attends only
    to the keys of its own cluster, and the step before it is often in another one. Roy et al. 2020 (arXiv
    2003.05997) mix routing heads with local ones; one local head links every step to its predecessor."""
    assert _predecessor_blind({}) > 8
    assert _predecessor_blind({"local_heads": 1}) == 0
