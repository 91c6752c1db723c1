"""``mamba2`` (Dao & Gu 2024, arXiv 2405.21060): the chunked layer equals the SSD recurrence with its short
convolution written as a loop (values and gradients, with restarts), for every chunk size, and streams exactly."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rl_transformers.backbone import BackboneConfig
from tests.backbone import gated_checks as rc

torch.set_num_threads(1)


def naive(att, x, starts):
    """x, B, C = SiLU(conv(projections)); h_t = exp(-Δ_t e^{A_log}) h_{t-1} + Δ_t B_t x_t^T; y_t = C_t^T h_t + D x_t;
    Y = RMSNorm(y ⊙ SiLU(z)). The convolution sees the last d_conv inputs since the episode's start."""
    b, t, _ = x.shape
    h, p, w = att.n_heads, att.d_head, att.options.d_conv
    q, k, v = (proj(x).view(b, t, h, p) for proj in (att.q_proj, att.k_proj, att.v_proj))
    xbc = torch.cat([v, k, q], dim=-1)
    window = torch.zeros(b, w, h, 3 * p, dtype=x.dtype)  # the last w inputs, newest last
    s = torch.zeros(b, h, p, p, dtype=x.dtype)
    ys = []
    for n in range(t):
        window = torch.where(starts[:, n, None, None, None], 0.0, window)
        s = torch.where(starts[:, n, None, None, None], 0.0, s)
        window = torch.cat([window[:, 1:], xbc[:, n, None]], dim=1)
        conv = F.silu(torch.einsum("bwhe,hwe->bhe", window, att.conv_weight) + att.conv_bias)
        xs, bs, cs = conv.split(p, dim=-1)
        dt = F.softplus(att.dt_proj(x[:, n]) + att.dt_bias)  # (B, H)
        a = torch.exp(-dt * att.A_log.exp())
        s = a[..., None, None] * s + (dt[..., None] * bs)[..., :, None] * xs[..., None, :]
        y = torch.einsum("bhn,bhnp->bhp", cs, s) + att.D[:, None] * xs
        y = y * F.silu(att.z_proj(x[:, n])).view(b, h, p)
        y = y / torch.sqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6) * att.norm.weight[:, 0]
        ys.append(y.reshape(b, h * p))
    return att.o_proj(torch.stack(ys, 1))


@pytest.mark.parametrize("chunk, d_conv", [(1, 4), (4, 4), (64, 4), (4, 1), (3, 2)])
def test_chunked_equals_the_paper(chunk: int, d_conv: int) -> None:
    att = rc.layer("mamba2", chunk_size=chunk, d_conv=d_conv)
    with torch.no_grad():  # larger steps Δ than the initialisation's, so the decay bites within the window
        att.dt_bias.add_(3.0)
    rc.check_naive(att, naive)


def test_chunk_size_is_a_schedule() -> None:
    rc.check_chunk_sizes("mamba2")


def test_stream_equals_one_pass() -> None:
    rc.check_stream("mamba2", chunk_size=4)


def test_reset_zeroes_the_rows() -> None:
    rc.check_reset_rows("mamba2")


def test_a_restart_cuts_the_past() -> None:
    rc.check_reset_cuts("mamba2", chunk_size=4)


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="d_conv"):
        BackboneConfig(attention="mamba2", position="none", attention_options={"d_conv": 0})
    with pytest.raises(ValueError, match="memory=None"):
        BackboneConfig(attention="mamba2", position="none", memory="xl")


def test_window_with_starts_equals_the_stream() -> None:
    rc.check_backbone_starts("mamba2", chunk_size=4)


def test_bfloat16_keeps_a_float32_state() -> None:
    rc.check_low_precision("mamba2", chunk_size=16)
