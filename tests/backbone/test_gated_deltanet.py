"""``gated_deltanet`` (Yang et al. 2024, arXiv 2412.06464): the chunked layer equals the gated delta rule written as
a loop (values and gradients, with restarts), for every chunk size, and streams exactly."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.backbone import gated_checks as rc
from tests.backbone.test_deltanet import delta_loop

torch.set_num_threads(1)


def naive(att, x, starts):
    """Eq. 10: S_t = α_t S_{t-1}(I - β_t k_t k_t^T) + β_t v_t k_t^T, α_t = exp(-softplus(x W_α + b) e^{A_log});
    Y = SiLU(x W_g) ⊙ RMSNorm(S_t q_t)."""
    b, t, _ = x.shape
    alpha = torch.exp(-F.softplus(att.alpha_proj(x) + att.dt_bias) * att.A_log.exp())
    gate = F.silu(att.g_proj(x)).view(b, t, att.n_heads, att.d_head)
    return delta_loop(att, x, starts, decay=alpha, gate=gate)


@pytest.mark.parametrize("chunk", [1, 4, 64])
def test_chunked_equals_the_paper(chunk: int) -> None:
    att = rc.layer("gated_deltanet", chunk_size=chunk)
    with torch.no_grad():  # decays well below 1 within the window, β near 1 on some steps
        att.dt_bias.add_(3.0)
        att.beta_proj.weight.mul_(4.0)
    rc.check_naive(att, naive)


def test_chunk_size_is_a_schedule() -> None:
    rc.check_chunk_sizes("gated_deltanet")


def test_stream_equals_one_pass() -> None:
    rc.check_stream("gated_deltanet", chunk_size=4)


def test_reset_zeroes_the_rows() -> None:
    rc.check_reset_rows("gated_deltanet")


def test_a_restart_cuts_the_past() -> None:
    rc.check_reset_cuts("gated_deltanet", chunk_size=4)


def test_window_with_starts_equals_the_stream() -> None:
    rc.check_backbone_starts("gated_deltanet", chunk_size=4)


def test_bfloat16_keeps_a_float32_state() -> None:
    rc.check_low_precision("gated_deltanet", chunk_size=16)
