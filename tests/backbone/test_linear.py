"""``linear`` attention (Katharopoulos 2020): the three causal forms agree, the memory-efficient custom backward
equals autograd of the per-step form, gradcheck, the paper's formula, padding, the XL prefix and the state."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from rl_transformers.backbone import Backbone, BackboneConfig
from rl_transformers.backbone.attention import _linear_ops as ops
from rl_transformers.backbone.attention.base import visible_mask
from rl_transformers.backbone.attention.linear import LinearState
from rl_transformers.backbone.context import ForwardContext
from tests.backbone import invariants as inv

torch.set_num_threads(1)
F64 = torch.float64


def _layer(causal: bool = True, **options: object):
    cfg = BackboneConfig(
        d_model=16, n_layers=1, n_heads=2, position="none", causal=causal, attention="linear",
        attention_options=options,
    )  # fmt: skip
    return Backbone(cfg).double().depth.blocks[0].attention


def _ctx(b: int, t: int, valid: torch.Tensor | None = None, causal: bool = True) -> ForwardContext:
    valid = torch.ones(b, t, dtype=torch.bool) if valid is None else valid
    return ForwardContext(pos=torch.arange(t).expand(b, t), valid=valid, causal=causal)


def _phi(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x > 0, x + 1, torch.exp(x))  # elu(x) + 1, written out


def _paper(q, k, v, causal: bool, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Eq. 2 / 4 of the paper with explicit loops: V'_i = Σ_j sim(Q_i, K_j) V_j / Σ_j sim(Q_i, K_j), sim = φ·φ.

    Keys are the last T of S (bottom-right alignment); ``valid`` (B, S) drops padded keys except a query's own.
    """
    b, h, t, _ = q.shape
    s = k.shape[2]
    out = torch.zeros(b, h, t, v.shape[-1], dtype=F64)
    for bi in range(b):
        for hi in range(h):
            for i in range(t):
                num, den = torch.zeros(v.shape[-1], dtype=F64), torch.zeros((), dtype=F64)
                for j in range(s):
                    own = j == s - t + i
                    if (causal and j > s - t + i) or (valid is not None and not valid[bi, j] and not own):
                        continue
                    sim = _phi(q[bi, hi, i]) @ _phi(k[bi, hi, j])
                    num, den = num + sim * v[bi, hi, j], den + sim
                out[bi, hi, i] = num / den
    return out


def _materialised(q, k, v, s0):
    """Per-step states S_i (..., T, F, E) stored explicitly (what the custom op avoids)."""
    states = s0.unsqueeze(-3) + torch.cumsum(k.unsqueeze(-1) * v.unsqueeze(-2), dim=-3)
    return (q.unsqueeze(-2) @ states).squeeze(-2), states[..., -1, :, :]


def _inputs(t: int, dtype: torch.dtype, seed: int = 0, f: int = 6, e: int = 5):
    g = torch.Generator().manual_seed(seed)
    q, k = (_phi(torch.randn(2, 3, t, f, generator=g, dtype=F64)) for _ in range(2))
    v = torch.randn(2, 3, t, e, generator=g, dtype=F64)
    s0 = _phi(torch.randn(2, 3, f, e, generator=g, dtype=F64))
    return tuple(x.to(dtype) for x in (q, k, v, s0))


def _normalised(form, q, k, v, s0, *args):
    """Run a numerator form with the ones column appended; return num / den and the state."""
    z0 = torch.ones_like(s0[..., :1]) * 3.0
    out, state = form(q, k, torch.cat([v, torch.ones_like(v[..., :1])], -1), torch.cat([s0, z0], -1), *args)
    return out[..., :-1] / out[..., -1:], state


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (F64, 1e-10)], ids=["f32", "f64"])
@pytest.mark.parametrize("chunk", [1, 5, 16, 64])
@pytest.mark.parametrize("t", [1, 7, 63, 100])
def test_parallel_chunked_recurrent_agree(t: int, chunk: int, dtype: torch.dtype, tol: float) -> None:
    q, k, v, s0 = _inputs(t, dtype, seed=t * 100 + chunk)
    par, s_par = _normalised(ops.causal_linear_quadratic, q, k, v, s0)
    chk, s_chk = _normalised(ops.causal_linear_chunked, q, k, v, s0, chunk)
    rec, s_rec = _normalised(ops.causal_linear_recurrent, q, k, v, s0)
    for got, got_s in ((chk, s_chk), (rec, s_rec)):
        torch.testing.assert_close(got, par, atol=tol, rtol=tol)
        torch.testing.assert_close(got_s, s_par, atol=tol, rtol=tol)


@pytest.mark.parametrize("chunk", [1, 4, 64])
@pytest.mark.parametrize("t", [1, 7, 63])
def test_layer_chunk_sizes_agree_with_paper_formula(t: int, chunk: int) -> None:
    att = _layer(chunk_size=chunk)
    g = torch.Generator().manual_seed(t)
    q, k, v = (torch.randn(1, 2, t, 8, generator=g, dtype=F64) for _ in range(3))
    y, _ = att.core(q, k, v, None, None, torch.ones(1, t, dtype=torch.bool), _ctx(1, t), None)
    torch.testing.assert_close(y, _paper(q, k, v, causal=True), atol=1e-10, rtol=0)


def test_custom_backward_equals_autograd_of_per_step_form() -> None:
    q, k, v, s0 = (x.requires_grad_() for x in _inputs(37, F64, seed=3))
    g = torch.Generator().manual_seed(4)
    w_out, w_state = (
        torch.randn(2, 3, 37, 5, generator=g, dtype=F64),
        torch.randn(2, 3, 6, 5, generator=g, dtype=F64),
    )

    def loss(out, state):
        return (out * w_out).sum() + (state * w_state).sum()

    out, state = ops.causal_linear_chunked(q, k, v, s0, 8)
    grads = torch.autograd.grad(loss(out, state), (q, k, v, s0))
    ref_out, ref_state = _materialised(q, k, v, s0)
    ref = torch.autograd.grad(loss(ref_out, ref_state), (q, k, v, s0))
    torch.testing.assert_close(out, ref_out, atol=1e-10, rtol=0)
    torch.testing.assert_close(state, ref_state, atol=1e-10, rtol=0)
    for name, a, b in zip(["q", "k", "v", "s0"], grads, ref):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0, msg=lambda m, n=name: f"grad {n}: {m}")


@pytest.mark.parametrize("chunk", [1, 3, 16])
def test_gradcheck_custom_op(chunk: int) -> None:
    g = torch.Generator().manual_seed(chunk)
    q, k, v = (torch.randn(1, 2, 7, 3, generator=g, dtype=F64, requires_grad=True) for _ in range(3))
    s0 = torch.randn(1, 2, 3, 3, generator=g, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *a: ops.CausalLinearFn.apply(*a, chunk), (q, k, v, s0))


class _LargestTensor(TorchDispatchMode):
    """Records the largest tensor produced by any op."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for o in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(o, torch.Tensor):
                self.largest = max(self.largest, o.numel())
        return out


def test_custom_op_never_forms_per_step_states() -> None:
    t, f, e, chunk = 64, 8, 8, 8
    q, k, v, s0 = (x.requires_grad_() for x in _inputs(t, F64, f=f, e=e))
    per_step = 2 * 3 * t * f * e  # (B, H, T, F, E)
    with _LargestTensor() as mode:
        out, state = ops.causal_linear_chunked(q, k, v, s0, chunk)
        (out.sum() + state.sum()).backward()
    assert mode.largest <= per_step // 4, mode.largest
    with _LargestTensor() as naive:  # the detector does see the per-step form
        _materialised(q, k, v, s0)
    assert naive.largest >= per_step


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_padding_prefix_and_noncausal_match_paper(causal: bool) -> None:
    att = _layer(causal=causal, chunk_size=4)
    b, t, s = 2, 6, 9  # 3 prefix keys (XL memory) before the 6 new tokens
    g = torch.Generator().manual_seed(7)
    q = torch.randn(b, 2, t, 8, generator=g, dtype=F64)
    k, v = (torch.randn(b, 2, s, 8, generator=g, dtype=F64) for _ in range(2))
    valid = torch.ones(b, s, dtype=torch.bool)
    valid[0, [1, 5]] = False  # a padded prefix key and a padded new token
    valid[1, 3] = False  # the first new token of row 1 is padding and (causally) sees only itself
    y, _ = att.core(q, k, v, None, None, valid, _ctx(b, t, valid[:, -t:], causal), None)
    torch.testing.assert_close(y, _paper(q, k, v, causal, valid), atol=1e-10, rtol=0)
    assert torch.isfinite(y).all()
    # padded keys contribute nothing to the real queries
    v2 = v.clone()
    v2[0, :, 5] += 100.0
    v2[1, :, 3] -= 100.0
    y2, _ = att.core(q, k, v2, None, None, valid, _ctx(b, t, valid[:, -t:], causal), None)
    real = valid[:, -t:]
    torch.testing.assert_close(y2[0, :, real[0]], y[0, :, real[0]], atol=1e-10, rtol=0)
    torch.testing.assert_close(y2[1, :, real[1]], y[1, :, real[1]], atol=1e-10, rtol=0)
    assert visible_mask(t, valid, causal)[1, 0, 0, 3]  # same "sees itself" rule as the dense kernels


def test_streaming_with_chunks_and_padding_equals_full_run() -> None:
    bb = inv.tiny_backbone(attention="linear", attention_options={"chunk_size": 3})
    x = torch.randn(2, 13, 16, dtype=F64)
    pad = torch.ones(2, 13, dtype=torch.bool)
    pad[0, [2, 9]] = False
    with torch.no_grad():
        full = bb(x, key_padding_mask=pad).y
        state, ys, start = bb.init_state(2), [], 0
        for size in (1, 5, 2, 5):
            out = bb(x[:, start : start + size], state=state, key_padding_mask=pad[:, start : start + size])
            ys.append(out.y)
            state, start = out.state, start + size
    torch.testing.assert_close(torch.cat(ys, 1), full, atol=1e-10, rtol=0)


def test_xl_memory_prefix_is_folded_into_the_state() -> None:
    bb = inv.tiny_backbone(attention="linear", memory="xl", memory_options={"mem_len": 32}, position="rope")
    x = torch.randn(2, 12, 16, dtype=F64)
    with torch.no_grad():
        full = bb(x).y  # a memory at least as long as the sequence: chunked == full causal run
        for sizes in inv.chunkings(12):
            got, _ = inv.run_chunks(bb, x, sizes)
            torch.testing.assert_close(got, full, atol=1e-10, rtol=0)


def test_state_is_constant_size_and_resets_to_empty() -> None:
    bb = inv.tiny_backbone(attention="linear")
    for length in (1, 5, 40):
        state = bb(torch.randn(3, length, 16, dtype=F64)).state
        layer = state.layers[0]
        assert isinstance(layer, LinearState)
        assert layer.s.shape == (3, 2, 8, 8) and layer.z.shape == (3, 2, 8)
    cleared = layer.reset(torch.tensor([False, True, False]))
    assert cleared.s[1].abs().sum() == 0 and cleared.z[1].abs().sum() == 0
    torch.testing.assert_close(cleared.s[[0, 2]], layer.s[[0, 2]])
    empty = bb.init_state(3).layers[0]
    assert empty.s.abs().sum() == 0 and empty.z.abs().sum() == 0


def test_float32_layer_matches_float64() -> None:
    att = _layer(chunk_size=16)
    q, k, v = (torch.randn(2, 2, 50, 8, dtype=F64) for _ in range(3))
    valid = torch.ones(2, 50, dtype=torch.bool)
    y64, _ = att.core(q, k, v, None, None, valid, _ctx(2, 50), None)
    y32, _ = att.float().core(q.float(), k.float(), v.float(), None, None, valid, _ctx(2, 50), None)
    assert y32.dtype == torch.float32
    torch.testing.assert_close(y32.double(), y64, atol=1e-5, rtol=1e-5)


def test_gradients_reach_every_input_through_the_layer() -> None:
    att = _layer(chunk_size=4)
    q, k, v = (torch.randn(1, 2, 10, 8, dtype=F64, requires_grad=True) for _ in range(3))
    y, _ = att.core(q, k, v, None, None, torch.ones(1, 10, dtype=torch.bool), _ctx(1, 10), None)
    y.pow(2).sum().backward()
    ref_q, ref_k, ref_v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    _paper_vec(ref_q, ref_k, ref_v).pow(2).sum().backward()
    for a, b in ((q, ref_q), (k, ref_k), (v, ref_v)):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-10, rtol=0)


def _paper_vec(q, k, v):
    """Eq. 4 vectorised with a causal mask (a plain-autograd reference for gradients)."""
    sim = _phi(q) @ _phi(k).transpose(-1, -2)
    sim = sim * torch.ones(q.shape[2], q.shape[2], dtype=torch.bool).tril()
    return (sim @ v) / sim.sum(-1, keepdim=True)


def test_bad_chunk_size_is_explained() -> None:
    with pytest.raises(ValueError, match="chunk_size must be a positive int"):
        BackboneConfig(attention="linear", attention_options={"chunk_size": 0})
    assert F.elu(torch.tensor(-1.0)) + 1 == _phi(torch.tensor(-1.0))
