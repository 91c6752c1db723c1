"""The FlexAttention form (``attention/_flex.py``) of every mask-defined attention against float64 references.

On CPU FlexAttention runs eager (forward only), so the flex form of each entry is forced (``FLEX_PATH =
"always"``) and compared with the loop-built explicit masks of the entries' own tests and ``reference_attention``
(position biases, the Gaussian prior and adaptive span's ramp from their formulas). The dispatch tests check
that the CPU keeps today's kernels and that a (mocked) capable CUDA device selects the flex form. The tests
marked ``gpu`` run forward and backward in bf16 against the float64 reference within the benchmark's bf16 gate.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import Tensor

from rl_transformers.backbone import BackboneConfig, registry
from rl_transformers.backbone.attention import _flex
from rl_transformers.backbone.reference import reference_attention
from rl_transformers.bench.correctness import numeric_tolerance
from tests.backbone.test_global_local import bigbird_pattern, etc_pattern, longformer_pattern
from tests.backbone.test_local import (
    Pattern,
    block_2d_pattern,
    block_local_pattern,
    check_against_mask,
    local_pattern,
    make_inputs,
    make_layer,
    run_layer,
)
from tests.backbone.test_sparse import blockwise_pattern, combined, fixed_parts, strided_parts, windowed

pytestmark = pytest.mark.filterwarnings("ignore:.*torch.compile:UserWarning")
CAUSAL = pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])


@pytest.fixture
def flex(monkeypatch: pytest.MonkeyPatch) -> None:
    """Force the flex form (eager on CPU)."""
    monkeypatch.setattr(_flex, "FLEX_PATH", "always")


def loop_mask(
    pattern: Pattern, causal: bool, q_pos: Tensor, k_pos: Tensor, k_valid: Tensor, h: int
) -> Tensor:
    """(B, H, T, S) bool by loops, as ``test_local.reference_for``: valid & pattern & causal, or own key."""
    b, t = q_pos.shape
    s = k_pos.shape[1]
    mask = torch.zeros(b, h, t, s, dtype=torch.bool)
    for r in range(b):
        for head in range(h):
            for i in range(t):
                qp = int(q_pos[r, i])
                for j in range(s):
                    kp = int(k_pos[r, j])
                    ok = bool(k_valid[r, j]) and pattern(qp, kp, head) and (not causal or kp <= qp)
                    mask[r, head, i, j] = ok or j == s - t + i
    return mask


# ------------------------------------------------------------------------------------- patterns (forward)
ENTRIES: list[tuple[str, Pattern, dict[str, Any]]] = [
    ("local", local_pattern(3), dict(window=3)),
    ("block_local", block_local_pattern(4, 3), dict(block=4, flange=3)),
    (
        "block_local_2d",
        block_2d_pattern((3, 5), (2, 2), (1, 1)),
        dict(image_shape=(3, 5), query_shape=(2, 2), flange=(1, 1)),
    ),
    (
        "longformer",
        longformer_pattern(2, (1, 3), (0, 6)),
        dict(window=2, dilation=(1, 3), global_tokens=(0, 6)),
    ),
    ("etc", etc_pattern(3, 2), dict(window=3, n_global=2)),
]


@pytest.mark.usefixtures("flex")
@CAUSAL
@pytest.mark.parametrize(("name", "pattern", "options"), ENTRIES, ids=[e[0] for e in ENTRIES])
def test_flex_patterns_match_explicit_masks(name: str, pattern: Pattern, options: dict, causal: bool) -> None:
    with torch.no_grad():
        check_against_mask(name, pattern, causal, 29, 29, **options)
        check_against_mask(name, pattern, causal, 37, 5, **options)  # cached keys, padding, offsets


@pytest.mark.usefixtures("flex")
@CAUSAL
@pytest.mark.parametrize("combine", ["union", "alternate", "split_heads"])
def test_flex_strided_and_fixed_match_explicit_masks(causal: bool, combine: str) -> None:
    with torch.no_grad():
        for layer in (0, 1):
            strided = combined(*strided_parts(3), combine, layer, 3)
            opts = dict(stride=3, combine=combine, n_heads=3, layer=layer)
            check_against_mask("strided", strided, causal, 23, 23, **opts)
            fixed = combined(*fixed_parts(4, 2), combine, layer, 3)
            opts = dict(stride=4, summary=2, combine=combine, n_heads=3, layer=layer)
            check_against_mask("fixed", fixed, causal, 31, 5, **opts)
            bounded = windowed(strided, 5, causal)
            check_against_mask("strided", bounded, causal, 23, 23, stride=3, combine=combine, n_heads=3,
                               layer=layer, max_cache=5)  # fmt: skip


@pytest.mark.usefixtures("flex")
@CAUSAL
def test_flex_blockwise_and_bigbird_match_explicit_masks(causal: bool) -> None:
    with torch.no_grad():
        shifts = [[(i - h) % 3 for i in range(3)] for h in range(2)]
        pattern = blockwise_pattern(3, 2, shifts, causal)
        check_against_mask("blockwise", pattern, causal, 23, 23, n_blocks=3, block_size=2)
        check_against_mask("blockwise", pattern, causal, 30, 4, n_blocks=3, block_size=2)
        opts = dict(block=3, window_blocks=1, n_random=2, global_tokens=(0, 5))
        for s, t in ((25, 25), (33, 5)):
            n_total = int(make_inputs(2, 2, s, t)[4].max()) // 3 + 1
            check_against_mask(
                "bigbird", bigbird_pattern(3, 1, 2, (0, 5), causal, n_total), causal, s, t, **opts
            )


@pytest.mark.usefixtures("flex")
def test_flex_blockwise_whole_call_form_equals_the_blocked_form(monkeypatch: pytest.MonkeyPatch) -> None:
    att = make_layer("blockwise", True, n_blocks=3, block_size=None)
    x = make_inputs(2, 2, 19, 19)
    with torch.no_grad():
        got = run_layer(att, *x)
        monkeypatch.setattr(_flex, "FLEX_PATH", "never")
        want = run_layer(att, *x)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


# ------------------------------------------------------------------------------------------ position biases
def layer_with_position(name: str, position: str, causal: bool, **options: Any) -> Any:
    cfg = BackboneConfig(
        d_model=8, n_layers=2, n_heads=2, position=position, causal=causal, attention=name,
        attention_options=options,
    )  # fmt: skip
    scheme = registry.get("position", position).cls(cfg, cfg.options("position")).double()
    with torch.no_grad():  # learned schemes: move away from their initial values
        for p in scheme.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return registry.get("attention", name).cls(cfg, cfg.options("attention"), scheme, 0).double()


def independent_bias(position: str, att: Any, rel: Tensor) -> Tensor:
    """(B, H, T, S) bias from each paper's formula, for rel = q_pos - k_pos (B, T, S)."""
    scheme, h = att.position, att.n_heads
    d = rel.abs().double().unsqueeze(1)
    if position == "alibi":
        slopes = torch.tensor([2.0 ** (-8.0 * (i + 1) / h) for i in range(h)], dtype=torch.float64)
        return -slopes.view(1, -1, 1, 1) * d
    if position == "kerple_power":
        r1 = torch.nn.functional.softplus(scheme.rho1[0]).view(1, -1, 1, 1)
        r2 = (2 * torch.sigmoid(scheme.rho2[0])).view(1, -1, 1, 1)
        return -r1 * torch.where(d > 0, d.clamp_min(1) ** r2, torch.zeros_like(d))
    if position == "kerple_log":
        r1 = torch.nn.functional.softplus(scheme.rho1[0]).view(1, -1, 1, 1)
        r2 = torch.nn.functional.softplus(scheme.rho2[0]).view(1, -1, 1, 1)
        return -r1 * torch.log1p(r2 * d)
    if position == "sandwich":
        o = scheme.options
        omega = o.base ** (-torch.arange(0, o.dim, 2, dtype=torch.float64) / o.dim)
        profile = torch.cos(d.unsqueeze(-1) * omega).sum(-1) - o.dim / 2
        lams = torch.tensor([o.lam * h / (8 * (i + 1)) for i in range(h)], dtype=torch.float64)
        return lams.view(1, -1, 1, 1) * profile
    assert position == "t5"  # the table read through the scheme's own bucketing (tested in its own file)
    return (
        scheme.bias(torch.zeros(1, 1, dtype=torch.long), -rel.reshape(1, -1), 0, torch.float64)
        .view(1, h, *rel.shape)[0]
        .transpose(0, 1)
    )


@pytest.mark.usefixtures("flex")
@CAUSAL
@pytest.mark.parametrize("position", ["alibi", "t5", "kerple_power", "kerple_log", "sandwich"])
def test_flex_position_biases_match_the_reference(position: str, causal: bool) -> None:
    att = layer_with_position("local", position, causal, window=4)
    q, k, v, q_pos, k_pos, k_valid = make_inputs(2, 2, 30, 9)
    with torch.no_grad():
        got = run_layer(att, q, k, v, q_pos, k_pos, k_valid)
        mask = loop_mask(local_pattern(4), causal, q_pos, k_pos, k_valid, 2)
        bias = independent_bias(position, att, q_pos[:, :, None] - k_pos[:, None, :])
    torch.testing.assert_close(got, reference_attention(q, k, v, mask=mask, bias=bias), atol=1e-12, rtol=0)


# -------------------------------------------------------------------------------- gaussian prior, adaptive span
@pytest.mark.usefixtures("flex")
@CAUSAL
@pytest.mark.parametrize(
    "options", [{}, {"max_cache": 4}, {"truncate_sigmas": 1.0}], ids=["dense", "cache", "cut"]
)
def test_flex_gaussian_prior_matches_the_reference(causal: bool, options: dict) -> None:
    att = make_layer("gaussian_prior", causal, sigma=2.5, **options)
    with torch.no_grad():
        att.rho.copy_(torch.tensor([0.4, 1.7], dtype=torch.float64))  # two different widths
    q, k, v, q_pos, k_pos, k_valid = make_inputs(2, 2, 27, 11)
    sigma = torch.log1p(torch.exp(att.rho.detach())).view(1, -1, 1, 1)
    rel = (q_pos[:, :, None] - k_pos[:, None, :]).unsqueeze(1).double()
    t, s = 11, 27
    col = torch.arange(t)[:, None] + s - t - torch.arange(s)  # i - j by column
    pattern: Pattern = lambda i, j, h: True  # noqa: E731
    if "truncate_sigmas" in options:
        w = math.ceil(float(sigma.max()))
        pattern = lambda i, j, h: abs(i - j) <= w  # noqa: E731
    mask = loop_mask(pattern, False, q_pos, k_pos, k_valid, 2) & ((col >= 0) | (not causal))
    if "max_cache" in options:
        mask = mask & (col <= 4)
    with torch.no_grad():
        got = run_layer(att, q, k, v, q_pos, k_pos, k_valid)
    want = reference_attention(q, k, v, mask=mask, bias=-(rel**2) / (2 * sigma**2))
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


@pytest.mark.usefixtures("flex")
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_flex_adaptive_span_matches_the_reference(dynamic: bool) -> None:
    att = make_layer("adaptive_span", True, max_span=8, ramp=3, dynamic=dynamic)
    with torch.no_grad():
        if dynamic:
            att.span_proj.weight.normal_()
        else:
            att.span_frac.copy_(torch.tensor([0.2, 0.55], dtype=torch.float64))
    q, k, v, q_pos, k_pos, k_valid = make_inputs(2, 2, 31, 12)
    with torch.no_grad():
        spans = att.spans(q).unsqueeze(-1)  # (B, H, T, 1)
        got = run_layer(att, q, k, v, q_pos, k_pos, k_valid)
    dist = (q_pos[:, :, None] - k_pos[:, None, :]).unsqueeze(1).double()
    ramp = ((3 + spans - dist) / 3).clamp(0, 1)
    col = torch.arange(12)[:, None] + 31 - 12 - torch.arange(31)
    mask = (loop_mask(lambda i, j, h: True, False, q_pos, k_pos, k_valid, 2) & (col >= 0) & (ramp > 0)) | (
        col == 0
    )
    want = reference_attention(q, k, v, mask=mask, bias=ramp.clamp_min(1e-30).log())
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


# ----------------------------------------------------------------------------------------------------- dispatch
DISPATCH: list[tuple[str, str, dict[str, Any]]] = [
    ("local", "local", dict(window=3)),
    ("block_local", "local", {}),
    ("block_local_2d", "local", {}),
    ("strided", "sparse", {}),
    ("fixed", "sparse", dict(max_cache=6)),
    ("blockwise", "sparse", {}),
    ("longformer", "global_local", {}),
    ("etc", "global_local", {}),
    ("bigbird", "global_local", {}),
    ("gaussian_prior", "prior", {}),
    ("adaptive_span", "adaptive_span", dict(max_span=4, ramp=2)),
]


def spy_flex(monkeypatch: pytest.MonkeyPatch, module: str) -> list[str]:
    """Replace the entry module's ``flex_pattern`` with a recorder (returns zeros)."""
    import importlib

    mod = importlib.import_module(f"rl_transformers.backbone.attention.{module}")
    calls: list[str] = []

    def record(att: Any, q: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        calls.append(att.registry_name)
        return torch.zeros_like(q)

    monkeypatch.setattr(mod, "flex_pattern", record)
    return calls


def dispatch_inputs(t: int = 40) -> tuple[Tensor, ...]:
    return make_inputs(1, 2, t, t, d=16)


@pytest.mark.parametrize(("name", "module", "options"), DISPATCH, ids=[e[0] for e in DISPATCH])
def test_cpu_dispatch_keeps_todays_kernels(
    name: str, module: str, options: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_flex, "FLEX_MIN_LEN", 1)
    calls = spy_flex(monkeypatch, module)
    att = make_layer(name, True, d_head=16, **options).float()  # a dtype flex takes: the device decides
    x = [t.float() if t.is_floating_point() else t for t in dispatch_inputs()]
    with torch.no_grad():
        out = run_layer(att, *x)
    assert calls == [] and not _flex.flex_available(torch.device("cpu"))
    assert out.abs().sum() > 0


@pytest.mark.parametrize(("name", "module", "options"), DISPATCH, ids=[e[0] for e in DISPATCH])
def test_capable_cuda_device_selects_the_flex_form(
    name: str, module: str, options: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_flex, "FLEX_MIN_LEN", 1)
    monkeypatch.setattr(_flex, "flex_available", lambda device: True)  # the capability check, mocked
    calls = spy_flex(monkeypatch, module)
    att = make_layer(name, True, d_head=16, **options).float()  # 16 / 32-bit inputs, as on a GPU
    if name == "adaptive_span":  # spans shorter than the call: the ramp matters (else plain SDPA)
        with torch.no_grad():
            att.span_frac.fill_(0.5)
    x = [t.float() if t.is_floating_point() else t for t in dispatch_inputs()]
    with torch.no_grad():
        run_layer(att, *x)
    assert calls == [name]


def test_flex_is_not_selected_where_it_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_flex, "flex_available", lambda device: True)
    q = torch.zeros(1, 2, _flex.FLEX_MIN_LEN, 16)
    att = make_layer("local", True, d_head=16)
    assert _flex.use_flex(att, q)
    assert not _flex.use_flex(att, q[:, :, :-1])  # short call (streaming steps, RL windows)
    assert not _flex.use_flex(att, torch.zeros(1, 2, _flex.FLEX_MIN_LEN, 12))  # head dim the kernel refuses
    assert not _flex.use_flex(att, q.double())  # float64 (the references) keeps today's kernels
    assert not _flex.use_flex(make_layer("local", True, d_head=16, scores=True), q)  # "scores" scheme
    att.attn_dropout.p = 0.1
    assert not _flex.use_flex(att.train(), q)  # attention dropout
    monkeypatch.setattr(_flex, "FLEX_PATH", "never")
    assert not _flex.use_flex(att.eval(), q)


@pytest.mark.slow
@pytest.mark.usefixtures("flex")
def test_compiled_flex_on_cpu_matches_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled kernel (Triton on CUDA, C++ on CPU): one representative, ~30 s of compilation on CPU."""
    monkeypatch.setattr(_flex, "FLEX_COMPILE", True)
    att = layer_with_position("block_local", "alibi", True, block=4, flange=3).float()
    q, k, v, q_pos, k_pos, k_valid = (
        x.float() if x.is_floating_point() else x for x in make_inputs(2, 2, 40, 40)
    )
    with torch.no_grad():
        got = run_layer(att, q, k, v, q_pos, k_pos, k_valid)
        mask = loop_mask(block_local_pattern(4, 3), True, q_pos, k_pos, k_valid, 2)
        bias = independent_bias("alibi", att, q_pos[:, :, None] - k_pos[:, None, :])
    want = reference_attention(q, k, v, mask=mask, bias=bias)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=0)


COMPILED = [
    ("bigbird", dict(block=3, window_blocks=1, n_random=2, global_tokens=(0, 5))),
    ("blockwise", dict(n_blocks=3, block_size=2)),
    ("strided", dict(stride=3, combine="split_heads")),
    ("fixed", dict(stride=4, summary=2, combine="split_heads")),
    ("longformer", dict(window=2, dilation=(1, 3), global_tokens=(0, 6))),
    ("gaussian_prior", dict(sigma=2.0)),
    ("adaptive_span", dict(max_span=8, ramp=3)),
]


@pytest.mark.slow
@pytest.mark.usefixtures("flex")
@pytest.mark.parametrize(("name", "options"), COMPILED, ids=[c[0] for c in COMPILED])
def test_compiled_masks_and_scores_equal_the_eager_form(
    name: str, options: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each entry's mask and score modifiers traced by Dynamo (the block mask and the kernel compiled, as on
    CUDA) give the eager form's output: the predicates' indexing and per-head reads compile. Inductor's CPU
    vectorisation miscompiles some block-mask kernels (a C++ error mixing int and float masks, torch 2.13),
    so the block mask's CPU code here is scalar (simdlen 1); CUDA compiles both with Triton."""
    import torch._inductor.config

    build = _flex.build_block_mask

    def scalar_block_mask(*args: Any) -> Any:
        with torch._inductor.config.patch({"cpp.simdlen": 1}):
            return build(*args)

    monkeypatch.setattr(_flex, "build_block_mask", scalar_block_mask)
    att = make_layer(name, True, **options).float()
    x = [t.float() if t.is_floating_point() else t for t in make_inputs(2, 2, 40, 40)]
    with torch.no_grad():
        eager = run_layer(att, *x)
        monkeypatch.setattr(_flex, "FLEX_COMPILE", True)
        compiled = run_layer(att, *x)
    torch.testing.assert_close(compiled, eager, atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------------------------- GPU (bf16)
GPU_ENTRIES: list[tuple[str, str, dict[str, Any]]] = [
    ("local", "none", dict(window=64)),
    ("local", "alibi", dict(window=64)),
    ("local", "t5", dict(window=64)),
    ("local", "kerple_power", dict(window=64)),
    ("local", "kerple_log", dict(window=64)),
    ("local", "sandwich", dict(window=64)),
    ("block_local", "none", {}),
    ("block_local_2d", "none", dict(image_shape=(32, 32))),
    ("strided", "none", dict(stride=32)),
    ("fixed", "none", dict(stride=32)),
    ("blockwise", "none", {}),
    ("longformer", "none", dict(dilation=(1, 2))),
    ("bigbird", "none", {}),
    ("etc", "none", {}),
    ("gaussian_prior", "none", {}),
    ("gaussian_prior", "none", dict(truncate_sigmas=6.0)),
    ("adaptive_span", "none", dict(max_span=128, ramp=32)),
]


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("name", "position", "options"), GPU_ENTRIES, ids=[f"{e[0]}-{e[1]}" for e in GPU_ENTRIES]
)
def test_gpu_flex_forward_and_backward_within_the_bf16_gate(
    name: str, position: str, options: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bf16 flex form vs the float64 dense form of the same layer (one T x S masked softmax, ``_dense``):
    output and the gradients of q, k, v and the layer's parameters, max |x - x64| / max |x64| <= the gate."""
    from rl_transformers.backbone.attention import _dense

    dev = torch.device("cuda")
    assert _flex.flex_available(dev)
    cfg = BackboneConfig(
        d_model=128, n_layers=2, n_heads=2, position=position, causal=True, attention=name,
        attention_options=options,
    )  # fmt: skip
    scheme = registry.get("position", position).cls(cfg, cfg.options("position")).to(dev)
    att = registry.get("attention", name).cls(cfg, cfg.options("attention"), scheme, 0).to(dev)
    t = 1024
    g = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (torch.randn(2, 2, t, 64, device=dev, generator=g) for _ in range(3))
    pos = torch.arange(t, device=dev).expand(2, t)
    valid = torch.ones(2, t, dtype=torch.bool, device=dev)
    dy = torch.randn(2, 2, t, 64, device=dev, generator=g)

    def run(dtype: torch.dtype) -> list[Tensor]:
        att.to(dtype)
        scheme.to(dtype)
        att.zero_grad()
        scheme.zero_grad()
        xs = [x.to(dtype).requires_grad_() for x in (q, k, v)]
        out = run_layer(att, *xs, pos, pos, valid)
        out.backward(dy.to(dtype))
        params = [p.grad for p in [*att.parameters(), *scheme.parameters()] if p.grad is not None]
        return [out, *(x.grad for x in xs), *params]

    assert _flex.use_flex(att, q.to(torch.bfloat16))  # the flex form is the one measured
    got = [x.double() for x in run(torch.bfloat16)]
    monkeypatch.setattr(_flex, "FLEX_PATH", "never")
    monkeypatch.setattr(_dense, "DENSE_PATH", "always")
    want = run(torch.float64)
    tol = numeric_tolerance(name, torch.bfloat16)
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        err = float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
        assert err <= tol, f"{name}/{position}: relative error {err:.3g} > {tol}"
