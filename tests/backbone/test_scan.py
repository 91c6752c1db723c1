"""``_scan``: the chunked associative scan == the recurrence h_t = a_t h_{t-1} + b_t written as a loop."""

from __future__ import annotations

import pytest
import torch

from rl_transformers.backbone.attention._scan import (
    _chunked_scan_reverse,
    gate_inputs,
    linear_scan,
    restarts,
    selective_scan,
)
from tests.backbone.recurrent_checks import context


def loop(a, b, h0):
    h, hs = h0, []
    for t in range(b.shape[1]):
        h = a[:, t] * h + b[:, t]
        hs.append(h)
    return torch.stack(hs, 1)


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
@pytest.mark.parametrize("chunk", [1, 2, 3, 4, 7, 64])
def test_scan_equals_the_loop_values_and_gradients(dtype, chunk) -> None:
    g = torch.Generator().manual_seed(0)
    a = torch.rand(2, 13, 3, generator=g, dtype=torch.float64).to(dtype)
    a[0, 5] = 0  # a restart inside a chunk
    b = torch.randn(2, 13, 3, generator=g, dtype=torch.float64).to(dtype)
    h0 = torch.randn(2, 3, generator=g, dtype=torch.float64).to(dtype)
    for t in (a, b, h0):
        t.requires_grad_(True)
    w = torch.randn(2, 13, 3, generator=g, dtype=torch.float64).to(dtype)
    got, want = linear_scan(a, b, h0, chunk), loop(a, b, h0)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    g_got = torch.autograd.grad((got * w.conj()).real.sum(), [a, b, h0])
    g_want = torch.autograd.grad((want * w.conj()).real.sum(), [a, b, h0])
    for x, y in zip(g_got, g_want):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)
    # a = 0 cuts exactly: nothing before t = 5 reaches row 0 from t = 5 on
    (gb,) = torch.autograd.grad(linear_scan(a, b, h0, chunk)[0, 5:].real.sum(), [b])
    assert torch.equal(gb[0, :5], torch.zeros_like(gb[0, :5]))


def test_no_initial_state_is_zeros() -> None:
    a, b = torch.rand(1, 6, 2, dtype=torch.float64), torch.randn(1, 6, 2, dtype=torch.float64)
    torch.testing.assert_close(linear_scan(a, b, None, 4), loop(a, b, torch.zeros(1, 2, dtype=torch.float64)))


def test_gate_inputs_restart_and_padding() -> None:
    starts = torch.tensor([[False, False, True, False], [True, False, False, True]])
    valid = torch.tensor([[True, True, True, False], [False, True, True, True]])
    ctx = context(starts, 4, 2, valid)
    cut = restarts(ctx)
    assert cut is not None and cut.tolist() == starts.tolist()
    a, b = gate_inputs(torch.full((2, 4, 1), 0.5), torch.ones(2, 4, 1), ctx)
    # padding leaves the state alone (a = 1, b = 0) unless the token is also a restart (a = 0)
    assert a[..., 0].tolist() == [[0.5, 0.5, 0.0, 1.0], [0.0, 0.5, 0.5, 0.0]]
    assert b[..., 0].tolist() == [[1.0, 1.0, 1.0, 0.0], [0.0, 1.0, 1.0, 1.0]]


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 64])
def test_reverse_scan_equals_the_backward_loop(dtype, chunk) -> None:
    """The adjoint's scan from the end, h_t = a_t h_{t+1} + b_t (h_T = 0), at every length up to 19."""
    g = torch.Generator().manual_seed(1)
    for n in range(1, 20):
        a = torch.randn(2, n, 3, generator=g, dtype=torch.float64).to(dtype)
        b = torch.randn(2, n, 3, generator=g, dtype=torch.float64).to(dtype)
        h, want = torch.zeros_like(b[:, 0]), []
        for t in reversed(range(n)):
            h = a[:, t] * h + b[:, t]
            want.append(h)
        torch.testing.assert_close(
            _chunked_scan_reverse(a, b, chunk), torch.stack(want[::-1], 1), rtol=1e-12, atol=1e-12
        )


def naive_selective(delta, u, a_mat, b_in, c_out, h0, starts, valid):
    """Mamba's recurrence token by token: a restart zeroes h (padded or not, as ``gate_inputs``), a padded
    token then leaves it as it is."""
    h, ys = h0, []
    for t in range(u.shape[1]):
        h = torch.where(starts[:, t, None, None], torch.zeros_like(h), h)
        new = (
            torch.exp(delta[:, t, :, None] * a_mat) * h
            + (delta[:, t] * u[:, t])[..., None] * b_in[:, t, None, :]
        )
        h = torch.where(valid[:, t, None, None], new, h)
        ys.append((h * c_out[:, t, None, :]).sum(-1))
    return torch.stack(ys, 1), h


@pytest.mark.parametrize("chunk", [1, 3, 64])
def test_selective_scan_equals_the_recurrence_values_and_gradients(chunk) -> None:
    g = torch.Generator().manual_seed(2)
    b, t, e, n = 2, 9, 4, 3
    kw = {"generator": g, "dtype": torch.float64}
    delta, u = torch.rand(b, t, e, **kw), torch.randn(b, t, e, **kw)
    a_mat, h0 = -torch.rand(e, n, **kw) * 3, torch.randn(b, e, n, **kw)
    b_in, c_out = torch.randn(b, t, n, **kw), torch.randn(b, t, n, **kw)
    starts = torch.zeros(b, t, dtype=torch.bool)
    starts[0, 4] = starts[1, 7] = True
    valid = torch.ones(b, t, dtype=torch.bool)
    valid[1, 2] = valid[0, 4] = False  # padding, once on a restart
    inputs = [delta, u, a_mat, b_in, c_out, h0]
    for x in inputs:
        x.requires_grad_(True)
    ctx = context(starts, t, b, valid)
    got = selective_scan(delta, u, a_mat, b_in, c_out, h0, ctx, chunk)
    want = naive_selective(delta, u, a_mat, b_in, c_out, h0, starts, valid)
    wy, wh = torch.randn(b, t, e, **kw), torch.randn(b, e, n, **kw)
    for x, y in zip(got, want):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)
    g_got = torch.autograd.grad((got[0] * wy).sum() + (got[1] * wh).sum(), inputs)
    g_want = torch.autograd.grad((want[0] * wy).sum() + (want[1] * wh).sum(), inputs)
    for i, (x, y) in enumerate(zip(g_got, g_want)):
        torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-10, msg=lambda m, i=i: f"input {i}: {m}")
