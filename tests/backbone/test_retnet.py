"""``retnet`` (Sun et al. 2023, arXiv 2307.08621): the chunked layer equals the paper's recurrent retention
written as a loop (values and gradients, with restarts), for every chunk size, and streams exactly."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rl_transformers.backbone import BackboneConfig
from rl_transformers.backbone.attention.retnet import retention_decays
from tests.backbone import gated_checks as rc

torch.set_num_threads(1)


def naive(att, x, starts):
    """S_n = γ S_{n-1} + K_n^T V_n, o_n = Q_n S_n (eq. 1-3), K scaled by D^{-1/2}; Y = swish(X W_G) ⊙ GN(o)."""
    b, t, _ = x.shape
    h, d = att.n_heads, att.d_head
    q, k, v = (p(x).view(b, t, h, d) for p in (att.q_proj, att.k_proj, att.v_proj))
    gamma = torch.tensor([1 - 2.0 ** (-5 - i) for i in range(h)], dtype=x.dtype)
    s = torch.zeros(b, h, d, d, dtype=x.dtype)
    ys = []
    for n in range(t):
        s = torch.where(starts[:, n, None, None, None], 0.0, s)
        s = gamma[:, None, None] * s + (k[:, n] / d**0.5)[..., :, None] * v[:, n][..., None, :]
        o = torch.einsum("bhk,bhkv->bhv", q[:, n], s)
        o = o / torch.sqrt(o.pow(2).mean(-1, keepdim=True) + 1e-6) * att.norm.weight[:, 0]
        g = F.silu(att.g_proj(x[:, n])).view(b, h, d)
        ys.append((g * o).reshape(b, h * d))
    return att.o_proj(torch.stack(ys, 1))


def test_decays_are_the_papers() -> None:
    assert torch.equal(
        retention_decays(3), torch.tensor([1 - 1 / 32, 1 - 1 / 64, 1 - 1 / 128], dtype=torch.float64)
    )


@pytest.mark.parametrize("chunk", [1, 4, 64])
def test_chunked_equals_the_paper(chunk: int) -> None:
    rc.check_naive(rc.layer("retnet", chunk_size=chunk), naive)


def test_chunk_size_is_a_schedule() -> None:
    rc.check_chunk_sizes("retnet")


def test_stream_equals_one_pass() -> None:
    rc.check_stream("retnet", chunk_size=4)


def test_reset_zeroes_the_rows() -> None:
    rc.check_reset_rows("retnet")


def test_a_restart_cuts_the_past() -> None:
    rc.check_reset_cuts("retnet", chunk_size=4)


def test_memory_is_refused() -> None:
    with pytest.raises(ValueError, match=r"memory=None"):
        BackboneConfig(attention="retnet", memory="xl", position="rope")


def test_window_with_starts_equals_the_stream() -> None:
    rc.check_backbone_starts("retnet", chunk_size=4)


def test_bfloat16_keeps_a_float32_state() -> None:
    rc.check_low_precision("retnet", chunk_size=16)
