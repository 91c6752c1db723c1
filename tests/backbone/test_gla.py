"""``gla`` (Yang et al. 2023, arXiv 2312.06635): the chunked layer equals the paper's gated recurrence written as a
loop (values and gradients, with restarts), for every chunk size, and streams exactly."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rl_transformers.backbone import BackboneConfig
from tests.backbone import gated_checks as rc

torch.set_num_threads(1)


def naive(att, x, starts):
    """S_t = G_t ⊙ S_{t-1} + k_t^T v_t with G_t = α_t^T 1, α_t = σ(x W_α1 W_α2 + b)^{1/τ}; o_t = q_t S_t / √D;
    Y = swish(x W_r) ⊙ norm(o)."""
    b, t, _ = x.shape
    h, d = att.n_heads, att.d_head
    q, k, v = (p(x).view(b, t, h, d) for p in (att.q_proj, att.k_proj, att.v_proj))
    alpha = (
        torch.sigmoid(att.gate_up(att.gate_down(x))).pow(1 / att.options.gate_temperature).view(b, t, h, d)
    )
    s = torch.zeros(b, h, d, d, dtype=x.dtype)
    ys = []
    for n in range(t):
        s = torch.where(starts[:, n, None, None, None], 0.0, s)
        s = alpha[:, n][..., :, None] * s + k[:, n][..., :, None] * v[:, n][..., None, :]
        o = torch.einsum("bhk,bhkv->bhv", q[:, n] / d**0.5, s)
        o = o / torch.sqrt(o.pow(2).mean(-1, keepdim=True) + 1e-6) * att.norm.weight[:, 0]
        ys.append((F.silu(att.r_proj(x[:, n])).view(b, h, d) * o).reshape(b, h * d))
    return att.o_proj(torch.stack(ys, 1))


@pytest.mark.parametrize("chunk", [1, 4, 16])
def test_chunked_equals_the_paper(chunk: int) -> None:
    rc.check_naive(rc.layer("gla", chunk_size=chunk), naive)


def test_strong_decays_stay_finite() -> None:
    """Gates near 0 (log α ≈ -40 per step) over a 16-token chunk: only non-positive exponents are formed."""
    att = rc.layer("gla", gate_temperature=0.05)
    rc.check_naive(att, naive, scale=3.0)


def test_chunk_size_is_a_schedule() -> None:
    rc.check_chunk_sizes("gla")


def test_stream_equals_one_pass() -> None:
    rc.check_stream("gla", chunk_size=4)


def test_reset_zeroes_the_rows() -> None:
    rc.check_reset_rows("gla")


def test_a_restart_cuts_the_past() -> None:
    rc.check_reset_cuts("gla", chunk_size=4)


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="gate_rank"):
        BackboneConfig(attention="gla", position="none", attention_options={"gate_rank": 0})
    with pytest.raises(ValueError, match="memory=None"):
        BackboneConfig(attention="gla", position="none", memory="xl")


def test_window_with_starts_equals_the_stream() -> None:
    rc.check_backbone_starts("gla", chunk_size=4)


def test_bfloat16_keeps_a_float32_state() -> None:
    rc.check_low_precision("gla", chunk_size=16)
