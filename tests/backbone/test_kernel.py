"""Random-feature attention: ``performer`` (FAVOR+, Choromanski 2021) and ``rfa`` (Peng 2021).

Error vs the exact softmax reference falls like a power of the feature count; orthogonal features beat iid ones;
causal chunked / streaming forms equal the masked quadratic form of the same features (written out here from the
papers' feature maps); the Performer stabiliser is exact and avoids overflow; seeded draws and redraws; RFA-Gate
equals its recurrence written out by hand.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from rl_transformers.backbone import Backbone, BackboneConfig, available, registry
from rl_transformers.backbone.attention.linear import LinearState
from rl_transformers.backbone.context import ForwardContext
from rl_transformers.backbone.reference import causal_mask, reference_attention
from tests.backbone import invariants as inv

torch.set_num_threads(1)
F64 = torch.float64


def _layer(name: str, causal: bool = True, d_model: int = 16, layer: int = 0, **options: object):
    cfg = BackboneConfig(
        d_model=d_model, n_layers=layer + 1, n_heads=2, position="none", causal=causal, attention=name,
        attention_options=options,
    )  # fmt: skip
    return Backbone(cfg).double().depth.blocks[layer].attention


def _ctx(b: int, t: int, valid: torch.Tensor | None = None, causal: bool = True) -> ForwardContext:
    valid = torch.ones(b, t, dtype=torch.bool) if valid is None else valid
    return ForwardContext(pos=torch.arange(t).expand(b, t), valid=valid, causal=causal)


def _run(att, q, k, v, causal: bool = True, valid=None, state=None):
    b, t = q.shape[0], q.shape[2]
    valid = torch.ones(b, k.shape[2], dtype=torch.bool) if valid is None else valid
    return att.core(q, k, v, None, None, valid, _ctx(b, t, valid[:, -t:], causal), state)


# -- the papers' feature maps, written out independently ------------------------------------------------------
def _favor(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Unstabilised FAVOR+: exp(w·x' - |x'|²/2) / √m, x' = x / D^{1/4}; w (H, m, D)."""
    x = x / x.shape[-1] ** 0.25
    proj = torch.einsum("bhtd,hmd->bhtm", x, w.to(x.dtype))
    return torch.exp(proj - 0.5 * (x * x).sum(-1, keepdim=True)) / math.sqrt(w.shape[1])


def _rfa(x: torch.Tensor, w: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """Normalised trig features: [sin(w·x'), cos(w·x')] / √m, x' = x/|x| / √τ."""
    x = x / x.norm(dim=-1, keepdim=True) / tau.sqrt()[None, :, None, None]
    proj = torch.einsum("bhtd,hmd->bhtm", x, w.to(x.dtype))
    return torch.cat([proj.sin(), proj.cos()], -1) / math.sqrt(w.shape[1])


def _kernel_attention(fq, fk, v, mask=None, tau=None):
    """Σ_j (φq_i·φk_j) v_j / Σ_j φq_i·φk_j over the allowed keys.

    With ``tau`` (normalised RFA) the normaliser is clipped to [exp(-2/τ) n_i, n_i], n_i = number of keys seen:
    the range of the true Σ_j exp(-|q'-k'|²/2) for unit vectors scaled by τ^{-1/2}.
    """
    sim = fq @ fk.transpose(-1, -2)
    if mask is not None:
        sim = sim * mask
    den = sim.sum(-1, keepdim=True)
    if tau is not None:
        n = torch.ones_like(sim).mul(mask if mask is not None else 1).sum(-1, keepdim=True)
        den = torch.minimum(torch.maximum(den, torch.exp(-2 / tau)[None, :, None, None] * n), n)
    return (sim @ v) / den


def _qkv(seed: int, t: int = 32, s: int | None = None, scale: float = 1.0, b: int = 2):
    g = torch.Generator().manual_seed(seed)
    s = t if s is None else s
    q = torch.randn(b, 2, t, 8, generator=g, dtype=F64) * scale
    k = torch.randn(b, 2, s, 8, generator=g, dtype=F64) * scale
    return q, k, torch.randn(b, 2, s, 8, generator=g, dtype=F64)


def _rel_error(name: str, m: int, seed: int, scale: float, causal: bool = False, **options) -> float:
    att = _layer(name, causal=causal, n_features=m, seed=seed, **options)
    q, k, v = _qkv(1000 + seed, scale=scale)
    with torch.no_grad():
        y, _ = _run(att, q, k, v, causal)
    mask = causal_mask(q.shape[2]) if causal else None
    if name == "rfa" and options.get("normalize", True):
        tau = float(options.get("temperature", 1.0))
        ref = reference_attention(F.normalize(q, dim=-1), F.normalize(k, dim=-1), v, mask=mask, scale=1 / tau)
    else:
        ref = reference_attention(q, k, v, mask=mask)
    return float((y - ref).norm() / ref.norm())


ERROR_CASES = [
    pytest.param("performer", dict(), 0.25, False, id="performer-orthogonal"),
    pytest.param("performer", dict(orthogonal=False), 0.25, False, id="performer-iid"),
    pytest.param("performer", dict(), 0.25, True, id="performer-causal"),
    pytest.param("rfa", dict(), 1.0, False, id="rfa-normalized"),
    pytest.param("rfa", dict(), 1.0, True, id="rfa-causal"),
    pytest.param("rfa", dict(normalize=False), 0.25, False, id="rfa-raw"),
]


@pytest.mark.parametrize("name,options,scale,causal", ERROR_CASES)
def test_error_vs_softmax_falls_with_features(name: str, options: dict, scale: float, causal: bool) -> None:
    ms = [16, 64, 256, 1024]
    errors = [sum(_rel_error(name, m, s, scale, causal, **options) for s in range(4)) / 4 for m in ms]
    x, y = torch.tensor(ms, dtype=F64).log(), torch.tensor(errors).log()
    slope = float(((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum())
    assert -0.8 < slope < -0.3, (slope, errors)  # Monte-Carlo rate m^(-1/2)
    assert errors[-1] < errors[0] / 3, errors


def test_orthogonal_features_beat_iid_at_equal_count() -> None:
    orth = [_rel_error("performer", 16, s, 0.5) for s in range(24)]
    iid = [_rel_error("performer", 16, s, 0.5, orthogonal=False) for s in range(24)]  # same inputs per seed
    assert sum(orth) < 0.95 * sum(iid), (sum(orth) / 24, sum(iid) / 24)


def test_orthogonal_blocks_are_orthogonal_with_chi_norms() -> None:
    w = _layer("performer", n_features=20).features  # D = 8: blocks of rows 0-7, 8-15, 16-19
    for lo, hi in ((0, 8), (8, 16), (16, 20)):
        block = F.normalize(w[:, lo:hi], dim=-1)
        gram = block @ block.transpose(-1, -2)
        torch.testing.assert_close(gram, torch.eye(hi - lo, dtype=F64).expand_as(gram), atol=1e-6, rtol=0)
    iid = F.normalize(_layer("performer", n_features=8, orthogonal=False).features, dim=-1)
    assert (iid @ iid.transpose(-1, -2) - torch.eye(8, dtype=F64)).abs().max() > 0.1
    norms2 = _layer("performer", n_features=2048).features.pow(2).sum(-1)
    assert norms2.std() > 1.0 and abs(float(norms2.mean()) - 8.0) < 0.3  # chi²_8: mean 8, sd 4


@pytest.mark.parametrize("name", ["performer", "rfa"])
@pytest.mark.parametrize("t,chunk", [(1, 64), (23, 1), (23, 4), (23, 64)])
def test_causal_forms_equal_masked_quadratic_of_paper_features(name: str, t: int, chunk: int) -> None:
    att = _layer(name, n_features=12, chunk_size=chunk)
    q, k, v = _qkv(t, t=t, scale=0.7)
    tau = None
    if name == "performer":
        fq, fk = _favor(q, att.features), _favor(k, att.features)
    else:
        tau = att.log_temperature.detach().exp()
        fq, fk = _rfa(q, att.features, tau), _rfa(k, att.features, tau)
    ref = _kernel_attention(fq, fk, v, causal_mask(t), tau)
    y, _ = _run(att, q, k, v)
    torch.testing.assert_close(y, ref, atol=1e-10, rtol=0)
    state, ys = att.init_state(2, None, F64), []  # token by token with the carried (S, z)
    for i in range(t):
        yi, state = _run(att, q[:, :, i : i + 1], k[:, :, i : i + 1], v[:, :, i : i + 1], state=state)
        ys.append(yi)
    torch.testing.assert_close(torch.cat(ys, 2), ref, atol=1e-10, rtol=0)
    assert state.s.shape == (2, 2, att.n_features, 8)


def test_rfa_normaliser_is_clipped_to_the_true_range() -> None:
    att = _layer("rfa", n_features=4, temperature=0.25, learn_temperature=False)  # few features, sharp kernel
    q, k, v = _qkv(3, t=20)
    y, _ = _run(att, q, k, v)
    tau = att.log_temperature.exp()  # 0.25 (stored as float32 log τ)
    fq, fk = _rfa(q, att.features, tau), _rfa(k, att.features, tau)
    torch.testing.assert_close(y, _kernel_attention(fq, fk, v, causal_mask(20), tau), atol=1e-10, rtol=0)
    assert not torch.allclose(y, _kernel_attention(fq, fk, v, causal_mask(20)))  # the clip was active
    assert y.abs().max() <= math.exp(2 / 0.25) * v.abs().max()


@pytest.mark.parametrize("name", ["performer", "rfa"])
def test_noncausal_padding_and_prefix(name: str) -> None:
    att = _layer(name, causal=False, n_features=16)
    q, k, v = _qkv(5, t=6, s=9)
    valid = torch.ones(2, 9, dtype=torch.bool)
    valid[0, [0, 7]] = False
    y, _ = _run(att, q, k, v, causal=False, valid=valid)
    v2 = v.clone()
    v2[0, :, [0, 7]] += 50.0
    y2, _ = _run(att, q, k, v2, causal=False, valid=valid)
    real = torch.ones(6, dtype=torch.bool)
    real[7 - 3] = False  # new token 4 (key 7) is padding
    torch.testing.assert_close(y2[0, :, real], y[0, :, real], atol=1e-10, rtol=0)
    torch.testing.assert_close(y2[1], y[1], atol=0, rtol=0)
    assert not torch.allclose(y2[0, :, ~real], y[0, :, ~real])  # a padded query still sees its own key
    if name == "performer":
        mask = valid[:, None, None, :] | torch.eye(9, dtype=torch.bool)[-6:]
        ref = _kernel_attention(_favor(q, att.features), _favor(k, att.features), v, mask)
        torch.testing.assert_close(y, ref, atol=1e-10, rtol=0)


def test_performer_stabiliser_is_exact_and_avoids_overflow() -> None:
    att = _layer("performer", d_model=256, n_features=32).float()  # D = 128: exponents reach |w|² ≈ 128
    w = att.features.double()
    g = torch.Generator().manual_seed(0)
    pick = torch.randint(0, 2, (1, 2, 10), generator=g)  # tokens sit near one of two feature vectors
    centres = torch.stack([w[h, pick[0, h]] for h in range(2)])[None]  # (1, 2, 10, 128)
    q = centres * 128**0.25 + 0.3 * torch.randn(1, 2, 10, 128, generator=g, dtype=F64)
    k = centres * 128**0.25 + 0.3 * torch.randn(1, 2, 10, 128, generator=g, dtype=F64)
    v = torch.randn(1, 2, 10, 128, generator=g, dtype=F64)
    ref = _kernel_attention(_favor(q, w), _favor(k, w), v, causal_mask(10))  # float64: still representable
    naive32 = _kernel_attention(
        _favor(q.float(), w.float()), _favor(k.float(), w.float()), v.float(), causal_mask(10)
    )
    assert not torch.isfinite(naive32).all()  # the unstabilised float32 form overflows here
    for chunk in (1, 3, 64):
        att.options = type(att.options)(n_features=32, chunk_size=chunk)
        y, _ = _run(att, q.float(), k.float(), v.float())
        assert torch.isfinite(y).all()
        torch.testing.assert_close(y.double(), ref, atol=2e-4, rtol=2e-4)


def test_features_are_seeded_per_layer_and_redrawn_as_buffers() -> None:
    a = _layer("performer", n_features=8, layer=1, seed=3)
    b = _layer("performer", n_features=8, layer=1, seed=3)
    torch.testing.assert_close(a.features, b.features, atol=0, rtol=0)
    assert not torch.allclose(a.features, _layer("performer", n_features=8, layer=0, seed=3).features)
    assert not torch.allclose(a.features, _layer("performer", n_features=8, layer=1, seed=4).features)
    assert "features" in a.state_dict() and "n_draws" in a.state_dict()

    bb = inv.tiny_backbone(attention="rfa", attention_options={"redraw_every": 2, "n_features": 8})
    att = bb.depth.blocks[0].attention
    x = torch.randn(1, 4, 16, dtype=F64)
    first = att.features.clone()
    bb.eval()
    for _ in range(3):
        state = bb(x).state
    torch.testing.assert_close(att.features, first, atol=0, rtol=0)  # evaluation never redraws
    assert set(vars(state.layers[0])) == {"s", "z"}  # features live on the module, not in the state
    bb.train()
    bb(x)
    torch.testing.assert_close(att.features, first, atol=0, rtol=0)
    bb(x)
    assert int(att.n_draws) == 1 and not torch.allclose(att.features, first)
    torch.testing.assert_close(att.features, att.draw_features(1).double(), atol=0, rtol=0)  # seeded redraw


def test_rfa_gate_equals_the_gated_recurrence() -> None:
    att = _layer("rfa", n_features=8, gate=True, chunk_size=3)
    b, t = 2, 11
    x = torch.randn(b, t, 16, dtype=F64)
    y, state = att(x, _ctx(b, t), att.init_state(b, None, F64))
    with torch.no_grad():
        tau = att.log_temperature.exp()
        fq = _rfa(att.split_heads(att.q_proj(x)), att.features, tau)
        fk = _rfa(att.split_heads(att.k_proj(x)), att.features, tau)
        v = att.split_heads(att.v_proj(x))
        g = torch.sigmoid(att.gate_proj(x)).transpose(1, 2)  # (B, H, T): one gate per head and token
        s = torch.zeros(b, 2, 16, 8, dtype=F64)
        z = torch.zeros(b, 2, 16, dtype=F64)
        n = torch.zeros(b, 2, 1, dtype=F64)  # gate-weighted key count
        outs = []
        for i in range(t):
            gi = g[:, :, i, None]
            s = gi[..., None] * s + (1 - gi[..., None]) * fk[:, :, i, :, None] * v[:, :, i, None, :]
            z = gi * z + (1 - gi) * fk[:, :, i]
            n = gi * n + (1 - gi)
            num = (fq[:, :, i, None, :] @ s).squeeze(-2)
            den = (fq[:, :, i] * z).sum(-1, keepdim=True)
            den = torch.minimum(torch.maximum(den, torch.exp(-2 / tau)[None, :, None] * n), n)
            outs.append(num / den)
        ref = att.o_proj(att.merge_heads(torch.stack(outs, 2)))
    torch.testing.assert_close(y, ref, atol=1e-10, rtol=0)
    torch.testing.assert_close(state.s[:, :, :16], s, atol=1e-10, rtol=0)
    torch.testing.assert_close(state.z[:, :, :16], z, atol=1e-10, rtol=0)
    torch.testing.assert_close(state.z[:, :, 16:], n, atol=1e-10, rtol=0)  # the count feature


def test_rfa_gate_streams_resets_and_trains() -> None:
    bb = inv.tiny_backbone(attention="rfa", attention_options={"gate": True, "chunk_size": 4})
    inv.check_streaming(bb, length=13)
    inv.check_causal(bb)
    inv.check_reset(bb)
    inv.check_state_ops(bb)
    inv.check_gradients(bb)
    assert bb.depth.blocks[0].attention.gate_proj.weight.grad is not None
    bb.collect_info = True
    gate = bb(torch.randn(1, 3, 16, dtype=F64)).info["backbone/rfa_gate/layer0"]
    assert 0.5 < float(gate) < 1.0  # σ(gate_bias=2) ≈ 0.88 at initialisation


@pytest.mark.parametrize(
    "name,options",
    [("performer", {}), ("rfa", {}), ("rfa", {"gate": True})],
    ids=["performer", "rfa", "rfa-gate"],
)
def test_xl_memory_prefix(name: str, options: dict) -> None:
    bb = inv.tiny_backbone(
        attention=name, attention_options=options, memory="xl", memory_options={"mem_len": 16}
    )
    x = torch.randn(2, 12, 16, dtype=F64)
    with torch.no_grad():
        full = bb(x).y
        for sizes in inv.chunkings(12):
            torch.testing.assert_close(inv.run_chunks(bb, x, sizes)[0], full, atol=1e-10, rtol=0)


def test_configuration_errors_are_explained() -> None:
    with pytest.raises(ValueError, match="gate=True is a causal recurrence"):
        BackboneConfig(attention="rfa", causal=False, attention_options={"gate": True})
    with pytest.raises(ValueError, match="Did you mean 'n_features'"):
        BackboneConfig(attention="performer", attention_options={"n_feature": 8})
    with pytest.raises(ValueError, match="n_features must be a positive int"):
        BackboneConfig(attention="performer", attention_options={"n_features": 0})
    with pytest.raises(ValueError, match="redraw_every"):
        BackboneConfig(attention="rfa", attention_options={"redraw_every": -1})
    with pytest.raises(ValueError, match="temperature"):
        BackboneConfig(attention="rfa", attention_options={"temperature": 0.0})


@pytest.mark.parametrize("name", ["linear", "rfa", "performer"])
def test_only_qk_and_input_position_schemes(name: str) -> None:
    cls = registry.get("attention", name).cls
    assert cls.position_kinds == {"none", "input", "qk"}
    assert isinstance(inv.tiny_backbone(attention=name, position="rope").init_state(1).layers[0], LinearState)
    logit_schemes = [
        p for p in available()["position"] if registry.get("position", p).cls.kind in ("bias", "scores")
    ]
    for position in logit_schemes:
        with pytest.raises(ValueError, match="cannot use position"):
            BackboneConfig(attention=name, position=position)
