"""The chunked operators of ``_gated_ops`` against the recurrences written as plain loops over tokens (float64):
values and gradients of every input, with restarts at random positions inside chunks and a carried state, for
every chunk size."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rl_transformers.backbone.attention import _gated_ops as ops
from tests.backbone.gated_checks import label

torch.set_num_threads(1)
F64 = torch.float64
B, H, T, K, V = 2, 2, 13, 3, 4


def _segments(seed: int = 0) -> torch.Tensor:
    """(B, 1, T): row 0 continues its state throughout, row 1 restarts at random tokens (twice in a row once)."""
    g = torch.Generator().manual_seed(seed)
    starts = torch.rand(B, T, generator=g) < 0.3
    starts[0] = False
    starts[1, 0] = False
    starts[1, 5] = starts[1, 6] = True
    return starts.long().cumsum(1)[:, None, :]


def _restarts(segment: torch.Tensor) -> torch.Tensor:
    """(B, 1, T) bool: the token's segment differs from the one before it."""
    prev = torch.cat([torch.zeros_like(segment[..., :1]), segment[..., :-1]], -1)
    return segment != prev


def _inputs(seed: int, *shapes: tuple[int, ...]) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g, dtype=F64).requires_grad_(True) for s in shapes]


def _compare(fn, ref, inputs: list[torch.Tensor]) -> None:
    got, want = fn(*inputs), ref(*inputs)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11)
    g = torch.Generator().manual_seed(9)
    weights = [torch.randn(a.shape, generator=g, dtype=F64) for a in got]

    def loss(outs) -> torch.Tensor:
        return sum((a * w).sum() for a, w in zip(outs, weights))

    ours = torch.autograd.grad(loss(got), inputs, allow_unused=True)
    theirs = torch.autograd.grad(loss(want), inputs, allow_unused=True)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert (a is None) == (b is None), i
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10, msg=label(f"input {i}"))


def gated_loop(q, k, v, log_a, s0, segment):
    restart = _restarts(segment)
    s, outs = s0, []
    for t in range(q.shape[-2]):
        s = torch.where(restart[..., t, None, None], 0.0, s)
        s = log_a[..., t, :, None].exp() * s + k[..., t, :, None] * v[..., t, None, :]
        outs.append((q[..., t, None, :] @ s)[..., 0, :])
    return torch.stack(outs, -2), s


@pytest.mark.parametrize("chunk", [1, 3, 5, 64])
@pytest.mark.parametrize("diagonal", [True, False], ids=["key_decay", "scalar_decay"])
def test_gated_chunked_equals_the_loop(chunk: int, diagonal: bool) -> None:
    q, k, v, raw, s0 = _inputs(0, (B, H, T, K), (B, H, T, K), (B, H, T, V), (B, H, T, K if diagonal else 1),
                               (B, H, K, V))  # fmt: skip
    segment = _segments()

    def fn(q, k, v, raw, s0):
        return ops.gated_chunked(q, k, v, torch.nn.functional.logsigmoid(raw), s0, chunk, segment)

    def ref(q, k, v, raw, s0):
        return gated_loop(q, k, v, torch.nn.functional.logsigmoid(raw), s0, segment)

    _compare(fn, ref, [q, k, v, raw, s0])


def test_gated_chunked_without_segments_equals_the_loop() -> None:
    q, k, v, raw, s0 = _inputs(1, (B, H, T, K), (B, H, T, K), (B, H, T, V), (B, H, T, K), (B, H, K, V))
    zero = torch.zeros(B, 1, T, dtype=torch.long)
    logsig = torch.nn.functional.logsigmoid
    _compare(
        lambda q, k, v, r, s: ops.gated_chunked(q, k, v, logsig(r), s, 4),
        lambda q, k, v, r, s: gated_loop(q, k, v, logsig(r), s, zero),
        [q, k, v, raw, s0],
    )


def delta_loop(q, k, v, beta, log_a, s0, segment):
    """S_t = a_t (I - β_t k_t k_t^T) S_{t-1} + β_t k_t v_t^T (a_t = 1 without log_a)."""
    restart = _restarts(segment)
    s, outs = s0, []
    eye = torch.eye(k.shape[-1], dtype=F64)
    for t in range(q.shape[-2]):
        s = torch.where(restart[..., t, None, None], 0.0, s)
        kt, bt = k[..., t, :], beta[..., t, :, None]
        a = 1.0 if log_a is None else log_a[..., t, :, None].exp()
        s = (
            a * (eye - bt * kt[..., :, None] * kt[..., None, :]) @ s
            + bt * kt[..., :, None] * v[..., t, None, :]
        )
        outs.append((q[..., t, None, :] @ s)[..., 0, :])
    return torch.stack(outs, -2), s


@pytest.mark.parametrize("chunk", [1, 3, 5, 64])
@pytest.mark.parametrize("gated", [False, True], ids=["deltanet", "gated_deltanet"])
def test_delta_chunked_equals_the_loop(chunk: int, gated: bool) -> None:
    q, k, v, rb, ra, s0 = _inputs(2, (B, H, T, K), (B, H, T, K), (B, H, T, V), (B, H, T, 1), (B, H, T, 1),
                                  (B, H, K, V))  # fmt: skip
    segment = _segments(2)

    def prep(k, rb, ra):
        log_a = torch.nn.functional.logsigmoid(ra + 2.0) if gated else None
        return torch.nn.functional.normalize(k, dim=-1), torch.sigmoid(rb), log_a

    def fn(q, k, v, rb, ra, s0):
        kn, beta, log_a = prep(k, rb, ra)
        return ops.delta_chunked(q, kn, v, beta, log_a, s0, chunk, segment)

    def ref(q, k, v, rb, ra, s0):
        kn, beta, log_a = prep(k, rb, ra)
        return delta_loop(q, kn, v, beta, log_a, s0, segment)

    _compare(fn, ref, [q, k, v, rb, ra, s0])


def mlstm_loop(q, k, v, log_f, log_i, c0, n0, segment, floor: float = 1.0):
    """The unstabilised cell: C_t = f_t C_{t-1} + i_t k_t v_t^T, n_t = f_t n_{t-1} + i_t k_t,
    h_t = C_t^T q_t / max(|n_t·q_t|, floor) (the paper's floor is 1)."""
    restart = _restarts(segment)
    c, n, hs = c0, n0, []
    for t in range(q.shape[-2]):
        c = torch.where(restart[..., t, None, None], 0.0, c)
        n = torch.where(restart[..., t, None], 0.0, n)
        f, i = log_f[..., t].exp(), log_i[..., t].exp()
        c = f[..., None, None] * c + i[..., None, None] * k[..., t, :, None] * v[..., t, None, :]
        n = f[..., None] * n + i[..., None] * k[..., t, :]
        qt = q[..., t, :]
        den = (n * qt).sum(-1, keepdim=True).abs().clamp_min(floor)
        hs.append((qt[..., None, :] @ c)[..., 0, :] / den)
    return torch.stack(hs, -2), c, n


@pytest.mark.parametrize("chunk", [1, 3, 5, 64])
@pytest.mark.parametrize("forget", ["sigmoid", "exp"])
def test_mlstm_chunked_equals_the_loop(chunk: int, forget: str) -> None:
    q, k, v, rf, ri, c0, n0 = _inputs(3, (B, H, T, K), (B, H, T, K), (B, H, T, V), (B, H, T), (B, H, T),
                                      (B, H, K, V), (B, H, K))  # fmt: skip
    segment = _segments(3)
    m0 = torch.tensor([[0.5, -1.0], [2.0, 0.0]], dtype=F64)  # a stabilised carried state: C = e^{m0} C̃

    def gates(rf, ri):
        log_f = torch.nn.functional.logsigmoid(rf + 1.0) if forget == "sigmoid" else 0.1 * rf
        return log_f, 2.0 * ri

    def fn(q, k, v, rf, ri, c0, n0):
        log_f, log_i = gates(rf, ri)
        h, (c, n, m) = ops.mlstm_chunked(q, k, v, log_f, log_i, (c0, n0, m0), chunk, segment)
        return h, c * m.exp()[..., None, None], n * m.exp()[..., None]

    def ref(q, k, v, rf, ri, c0, n0):
        log_f, log_i = gates(rf, ri)
        return mlstm_loop(
            q, k, v, log_f, log_i, c0 * m0.exp()[..., None, None], n0 * m0.exp()[..., None], segment
        )

    _compare(fn, ref, [q, k, v, rf, ri, c0, n0])


def test_mlstm_large_input_gates_stay_finite() -> None:
    """Input-gate pre-activations of 800 overflow exp in float64 unstabilised; the chunked cell stays finite.
    Scaling every i_t by e^{800} scales C and n alike, so h equals the loop on the unshifted gates with the floor
    scaled by e^{-800} (0 in float64)."""
    q, k, v, ri = _inputs(4, (B, H, T, K), (B, H, T, K), (B, H, T, V), (B, H, T))
    segment = _segments(4)
    log_f = torch.full((B, H, T), -0.1, dtype=F64)
    empty = (
        torch.zeros(B, H, K, V, dtype=F64),
        torch.zeros(B, H, K, dtype=F64),
        torch.zeros(B, H, dtype=F64),
    )
    h, (c, n, m) = ops.mlstm_chunked(q, k, v, log_f, 800.0 + ri, empty, 4, segment)
    assert torch.isfinite(h).all() and torch.isfinite(c).all() and torch.isfinite(n).all()
    assert torch.isfinite(m).all() and m.min() > 790
    want, _, _ = mlstm_loop(q, k, v, log_f, ri, empty[0], empty[1], segment, floor=0.0)
    torch.testing.assert_close(h, want, rtol=1e-9, atol=1e-11)


# -- optional: the pure-PyTorch reference functions of fla-core (package ``fla``) -------------------------------
def _fla_naive(module: str):
    """``fla/ops/<module>/naive.py`` loaded by path (importing ``fla`` itself needs triton, i.e. a GPU build)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("fla")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("fla-core (package fla) is not installed: pip install fla-core --no-deps")
    path = Path(next(iter(spec.submodule_search_locations))) / "ops" / module / "naive.py"
    if not path.exists():
        pytest.skip(f"this fla-core has no {path}")
    loaded = importlib.util.spec_from_file_location(f"_fla_naive_{module}", path)
    assert loaded is not None and loaded.loader is not None
    mod = importlib.util.module_from_spec(loaded)
    try:
        loaded.loader.exec_module(mod)
    except ImportError as e:  # e.g. einops missing
        pytest.skip(f"fla-core's {module} reference does not import: {e}")
    return mod


def _close32(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)  # fla's references compute in float32


def _f32(seed: int, *shapes: tuple[int, ...]) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g) for s in shapes]


def test_matches_fla_retention() -> None:
    ref = _fla_naive("retention").naive_retention
    q, k, v = _f32(10, (B, 4, T, K), (B, 4, T, K), (B, 4, T, V))
    log_g = torch.log1p(-(2.0 ** (-5.0 - torch.arange(4.0))))[None, :, None, None].expand(B, 4, T, 1)
    got, _ = ops.gated_chunked(q * K**-0.5, k, v, log_g, torch.zeros(B, 4, K, V), 4)
    _close32(got, ref(q, k, v))


def test_matches_fla_gla() -> None:
    ref = _fla_naive("gla").naive_recurrent_gla
    q, k, v, raw, s0 = _f32(11, (B, T, H, K), (B, T, H, K), (B, T, H, V), (B, T, H, K), (B, H, K, V))
    gk = torch.nn.functional.logsigmoid(raw)
    want, s_want = ref(q, k, v, gk, initial_state=s0, output_final_state=True)
    t = [z.transpose(1, 2) for z in (q, k, v, gk)]
    got, s_got = ops.gated_chunked(t[0] * K**-0.5, t[1], t[2], t[3], s0, 4)
    _close32(got.transpose(1, 2), want)
    _close32(s_got, s_want)


def test_matches_fla_simple_gla() -> None:
    ref = _fla_naive("simple_gla").naive_recurrent_simple_gla
    q, k, v, raw, s0 = _f32(12, (B, T, H, K), (B, T, H, K), (B, T, H, V), (B, T, H), (B, H, K, V))
    g = torch.nn.functional.logsigmoid(raw)
    want, s_want = ref(q, k, v, g, scale=1.0, initial_state=s0, output_final_state=True)
    t = [z.transpose(1, 2) for z in (q, k, v)]
    got, s_got = ops.gated_chunked(t[0], t[1], t[2], g.transpose(1, 2)[..., None], s0, 5)
    _close32(got.transpose(1, 2), want)
    _close32(s_got, s_want)


def test_matches_fla_delta_rule() -> None:
    ref = _fla_naive("delta_rule").delta_rule_recurrence
    q, k, v, raw, s0 = _f32(13, (B, H, T, K), (B, H, T, K), (B, H, T, V), (B, H, T), (B, H, K, V))
    k, beta = torch.nn.functional.normalize(k, dim=-1), torch.sigmoid(raw)
    want, s_want = ref(q, k, v, beta, initial_state=s0)
    got, s_got = ops.delta_chunked(q * K**-0.5, k, v, beta[..., None], None, s0, 4)
    _close32(got, want)
    _close32(s_got, s_want)


def test_matches_fla_gated_delta_rule() -> None:
    ref = _fla_naive("gated_delta_rule").naive_recurrent_gated_delta_rule
    q, k, v, rb, rg, s0 = _f32(
        14, (B, T, H, K), (B, T, H, K), (B, T, H, V), (B, T, H), (B, T, H), (B, H, K, V)
    )
    k, beta, g = (
        torch.nn.functional.normalize(k, dim=-1),
        torch.sigmoid(rb),
        torch.nn.functional.logsigmoid(rg),
    )
    want, s_want = ref(q, k, v, beta, g, scale=1.0, initial_state=s0, output_final_state=True)
    t = [z.transpose(1, 2) for z in (q, k, v, beta, g)]
    got, s_got = ops.delta_chunked(t[0], t[1], t[2], t[3][..., None], t[4][..., None], s0, 4)
    _close32(got.transpose(1, 2), want)
    _close32(s_got, s_want)


def test_matches_mlstm_kernels_native_step() -> None:
    """The mLSTM cell against the native PyTorch recurrent step of ``mlstm-kernels`` (xLSTM's kernels), float64,
    its ε set to 0, from a stabilised carried state."""
    native = pytest.importorskip(
        "mlstm_kernels.torch.recurrent.native_step", reason="mlstm-kernels is not installed"
    )
    q, k, v, rf, ri, c0, n0 = _inputs(15, (B, H, T, K), (B, H, T, K), (B, H, T, V), (B, H, T), (B, H, T),
                                      (B, H, K, V), (B, H, K))  # fmt: skip
    m0 = torch.tensor([[0.5, -1.0], [2.0, 0.0]], dtype=F64)
    with torch.no_grad():
        state, hs = (c0, n0, m0[..., None]), []
        for t in range(T):
            h, state = native.mlstm_recurrent_step__native_fw(
                *state, q[..., t, :], k[..., t, :], v[..., t, :], ri[..., t, None], rf[..., t, None], eps=0.0,
                dtype_state=F64,
            )  # fmt: skip
            hs.append(h)
        got, (c, n, m) = ops.mlstm_chunked(q * K**-0.5, k, v, F.logsigmoid(rf), ri, (c0, n0, m0), 4)
    torch.testing.assert_close(got, torch.stack(hs, -2), rtol=1e-10, atol=1e-11)
    scale, their_scale = m.exp(), state[2].exp()
    torch.testing.assert_close(
        c * scale[..., None, None], state[0] * their_scale[..., None], rtol=1e-10, atol=1e-11
    )
    torch.testing.assert_close(n * scale[..., None], state[1] * their_scale, rtol=1e-10, atol=1e-11)


def _stepped(fn, state, *seqs: torch.Tensor | None):
    """fn(*token slices, state) -> (out, state) applied to one token at a time of each (..., T, ·) sequence."""
    outs = []
    for t in range(T):
        out, state = fn(*(None if x is None else x[..., t : t + 1, :] for x in seqs), state)
        outs.append(out)
    return torch.cat(outs, -2), state


def test_one_token_steps_equal_the_loops() -> None:
    """The one-token path (acting) of each operator, stepped from a carried state, equals the loops."""
    q, k, v, ra, rb, s0, n0 = _inputs(16, (B, H, T, K), (B, H, T, K), (B, H, T, V), (B, H, T, K), (B, H, T, 1),
                                      (B, H, K, V), (B, H, K))  # fmt: skip
    zero = torch.zeros(B, 1, T, dtype=torch.long)
    log_a, beta, kn = F.logsigmoid(ra), torch.sigmoid(rb), F.normalize(k, dim=-1)

    def gated(q_, k_, v_, a_, s):
        return ops.gated_chunked(q_, k_, v_, a_, s, 64)

    got, s = _stepped(gated, s0, q, k, v, log_a)
    want, s_want = gated_loop(q, k, v, log_a, s0, zero)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-11)
    torch.testing.assert_close(s, s_want, rtol=1e-10, atol=1e-11)

    def delta(q_, k_, v_, b_, a_, s):
        return ops.delta_chunked(q_, k_, v_, b_, a_, s, 64)

    for gate in (None, log_a[..., :1]):
        got, s = _stepped(delta, s0, q, kn, v, beta, gate)
        want, s_want = delta_loop(q, kn, v, beta, gate, s0, zero)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-11)
        torch.testing.assert_close(s, s_want, rtol=1e-10, atol=1e-11)

    def mlstm(q_, k_, v_, f_, i_, st):
        return ops.mlstm_chunked(q_, k_, v_, f_[..., 0], i_[..., 0], st, 64)

    log_f, log_i = F.logsigmoid(ra[..., :1] + 1.0), 2.0 * rb
    got, (c, n, m) = _stepped(mlstm, (s0, n0, torch.zeros(B, H, dtype=F64)), q, k, v, log_f, log_i)
    want, c_want, n_want = mlstm_loop(q, k, v, log_f[..., 0], log_i[..., 0], s0, n0, zero)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-11)
    torch.testing.assert_close(c * m.exp()[..., None, None], c_want, rtol=1e-10, atol=1e-11)
    torch.testing.assert_close(n * m.exp()[..., None], n_want, rtol=1e-10, atol=1e-11)
