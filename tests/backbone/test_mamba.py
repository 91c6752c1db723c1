"""``mamba``: the parallel scan == one token at a time == the paper's recurrence written out (float64), and the
optional ``mambapy`` package's block with the same weights."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from rl_transformers.backbone import BackboneConfig
from tests.backbone import recurrent_checks as rc


def naive(m, x: Tensor, starts: Tensor) -> Tensor:
    """Gu & Dao 2023, Algorithm 2 with the block of Fig. 3, one token at a time: a buffer of the last K inputs
    for the convolution, h_t = exp(Δ_t A) h_{t-1} + Δ_t B_t x_t, y_t = C_t h_t + D x_t, gated by SiLU(z_t)."""
    k, e, n, r = m.options.d_conv, m.d_inner, m.d_state, m.dt_rank
    w, wb = m.conv1d.weight[:, 0], m.conv1d.bias  # (E, K)
    a_mat = -torch.exp(m.A_log)
    ys = []
    for b in range(x.shape[0]):
        buf = [torch.zeros(e, dtype=x.dtype) for _ in range(k)]
        h = torch.zeros(e, n, dtype=x.dtype)
        for t in range(x.shape[1]):
            if starts[b, t]:
                buf = [torch.zeros(e, dtype=x.dtype) for _ in range(k)]
                h = torch.zeros_like(h)
            u, z = (m.in_proj.weight @ x[b, t]).split(e)
            buf = [*buf[1:], u]  # oldest first
            c = wb + sum(w[:, j] * buf[j] for j in range(k))
            c = c * torch.sigmoid(c)
            proj = m.x_proj.weight @ c
            dt, bv, cv = proj[:r], proj[r : r + n], proj[r + n :]
            delta = torch.log1p(torch.exp(m.dt_proj.weight @ dt + m.dt_proj.bias))
            h = torch.exp(delta[:, None] * a_mat) * h + (delta * c)[:, None] * bv[None, :]
            y = h @ cv + m.D * c
            ys.append(m.out_proj.weight @ (y * z * torch.sigmoid(z)))
    return torch.stack(ys).view(x.shape)


@pytest.mark.parametrize("d_conv", [4, 2, 1])
def test_mamba_matches_its_recurrence(d_conv: int) -> None:
    rc.check_all(rc.make_mixer("mamba", d_state=3, d_conv=d_conv, chunk_size=4), naive)


def test_a_restart_inside_a_short_chunk_clears_the_convolution_state() -> None:
    """Chunks shorter than the kernel with a restart: the carried inputs of the old episode are dropped."""
    m = rc.make_mixer("mamba", d_state=3, d_conv=4)
    x = torch.randn(2, 6, rc.D_MODEL, dtype=torch.float64)
    starts = torch.zeros(2, 6, dtype=torch.bool)
    starts[0, 3] = True
    with torch.no_grad():
        want = naive(m, x, starts)
        state, ys = None, []
        for lo, hi in ((0, 2), (2, 4), (4, 5), (5, 6)):
            y, state = rc.parallel(m, x[:, lo:hi], starts[:, lo:hi], state)
            ys.append(y)
    torch.testing.assert_close(torch.cat(ys, 1), want, rtol=1e-10, atol=1e-10)


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match="dt_min"):
        BackboneConfig(attention="mamba", position="none", attention_options={"dt_min": 0.5, "dt_max": 0.1})
    with pytest.raises(ValueError, match="d_conv"):
        BackboneConfig(attention="mamba", position="none", attention_options={"d_conv": 0})
    with pytest.raises(ValueError, match=r"memory=None"):
        BackboneConfig(attention="mamba", position="none", memory="xl")


def test_matches_mambapy() -> None:
    """``mambapy``'s MambaBlock (its own parallel scan and its step function) with our weights."""
    mamba = pytest.importorskip("mambapy.mamba", reason="optional reference package mambapy not installed")
    m = rc.make_mixer("mamba", d_state=4)
    cfg = mamba.MambaConfig(d_model=rc.D_MODEL, n_layers=1, d_state=4, expand_factor=2, d_conv=4)
    ref = mamba.MambaBlock(cfg).double()
    ref.load_state_dict(m.state_dict())
    x = torch.randn(2, 8, rc.D_MODEL, dtype=torch.float64)
    with torch.no_grad():
        got, _ = rc.parallel(m, x)
        torch.testing.assert_close(got, ref(x), rtol=1e-10, atol=1e-10)
        cache = (None, torch.zeros(2, 2 * rc.D_MODEL, 3, dtype=torch.float64))
        ys = []
        for t in range(x.shape[1]):
            y, cache = ref.step(x[:, t], cache)
            ys.append(y)
    torch.testing.assert_close(got, torch.stack(ys, 1), rtol=1e-10, atol=1e-10)


def test_inside_a_backbone() -> None:
    rc.check_backbone("mamba")


@pytest.mark.parametrize("d_conv", [4, 1])
def test_padded_tokens_leave_the_state_as_it_is(d_conv: int) -> None:
    """Right padding, then a next chunk == the same real tokens without padding: the convolution's carried
    inputs skip the padded ones, the scan's state stays."""
    m = rc.make_mixer("mamba", d_state=3, d_conv=d_conv)
    x = torch.randn(2, 6, rc.D_MODEL, dtype=torch.float64)
    pad = torch.randn(2, 3, rc.D_MODEL, dtype=torch.float64)
    nxt = torch.randn(2, 4, rc.D_MODEL, dtype=torch.float64)
    valid = torch.tensor([[True] * 6 + [False] * 3, [True] * 6 + [False] * 3])
    with torch.no_grad():
        y, state = rc.parallel(m, x)
        ctx = rc.context(None, 9, 2, valid)
        y_pad, state_pad = m(torch.cat([x, pad], 1), ctx, m.init_state(2, None, torch.float64))
        torch.testing.assert_close(y_pad[:, :6], y, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(state_pad.conv, state.conv, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(state_pad.h, state.h, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(
            rc.parallel(m, nxt, None, state_pad)[0], rc.parallel(m, nxt, None, state)[0]
        )
