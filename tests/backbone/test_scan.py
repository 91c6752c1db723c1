"""``_scan``: the chunked associative scan == the recurrence h_t = a_t h_{t-1} + b_t written as a loop."""

from __future__ import annotations

import pytest
import torch

from rl_transformers.backbone.attention._scan import gate_inputs, linear_scan, restarts
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
