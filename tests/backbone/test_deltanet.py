"""``deltanet`` (Schlag et al. 2021, arXiv 2102.11174; chunkwise form of Yang et al. 2024, arXiv 2406.06484): the
chunked layer equals the delta rule written as a loop in the papers' orientation (values and gradients, with
restarts), for every chunk size, and streams exactly."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rl_transformers.backbone import BackboneConfig
from tests.backbone import gated_checks as rc

torch.set_num_threads(1)


def delta_loop(att, x, starts, decay=None, gate=None):
    """S_t = α_t S_{t-1} (I - β_t k_t k_t^T) + β_t v_t k_t^T (S: D_v × D_k), o_t = S_t q_t, q / k = L2(SiLU(·)),
    β = σ(x W_β); Y = gate ⊙ RMSNorm(o). ``decay`` (B, T, H) α_t, or None (α = 1)."""
    b, t, _ = x.shape
    h, d = att.n_heads, att.d_head
    q, k, v = (p(x).view(b, t, h, d) for p in (att.q_proj, att.k_proj, att.v_proj))
    q, k = (F.silu(z) / F.silu(z).norm(dim=-1, keepdim=True).clamp_min(1e-6) for z in (q, k))
    beta = torch.sigmoid(att.beta_proj(x))
    eye = torch.eye(d, dtype=x.dtype)
    s = torch.zeros(b, h, d, d, dtype=x.dtype)
    ys = []
    for n in range(t):
        s = torch.where(starts[:, n, None, None, None], 0.0, s)
        kn, bn = k[:, n], beta[:, n, :, None, None]
        alpha = 1.0 if decay is None else decay[:, n, :, None, None]
        s = (
            alpha * s @ (eye - bn * kn[..., :, None] * kn[..., None, :])
            + bn * v[:, n][..., :, None] * kn[..., None, :]
        )
        o = (s @ q[:, n][..., None])[..., 0]
        o = o / torch.sqrt(o.pow(2).mean(-1, keepdim=True) + 1e-6) * att.norm.weight[:, 0]
        if gate is not None:
            o = gate[:, n] * o
        ys.append(o.reshape(b, h * d))
    return att.o_proj(torch.stack(ys, 1))


def naive(att, x, starts):
    return delta_loop(att, x, starts)


@pytest.mark.parametrize("chunk", [1, 4, 64])
def test_chunked_equals_the_paper(chunk: int) -> None:
    att = rc.layer("deltanet", chunk_size=chunk)
    with torch.no_grad():  # β near 1 on some steps: old values are overwritten
        att.beta_proj.weight.mul_(4.0)
    rc.check_naive(att, naive)


def test_chunk_size_is_a_schedule() -> None:
    rc.check_chunk_sizes("deltanet")


def test_stream_equals_one_pass() -> None:
    rc.check_stream("deltanet", chunk_size=4)


def test_reset_zeroes_the_rows() -> None:
    rc.check_reset_rows("deltanet")


def test_a_restart_cuts_the_past() -> None:
    rc.check_reset_cuts("deltanet", chunk_size=4)


def test_writing_twice_under_one_key_replaces_the_value() -> None:
    """The delta rule's defining property: with β = 1, writing v then v' under the same unit key k leaves
    S k = v' (a plain linear attention would hold v + v')."""
    from rl_transformers.backbone.attention import _gated_ops as ops

    k = F.normalize(torch.randn(1, 1, 1, 4, dtype=torch.float64), dim=-1).expand(1, 1, 2, 4)
    v = torch.randn(1, 1, 2, 3, dtype=torch.float64)
    beta = torch.ones(1, 1, 2, 1, dtype=torch.float64)
    out, s = ops.delta_chunked(k, k, v, beta, None, torch.zeros(1, 1, 4, 3, dtype=torch.float64), 2)
    torch.testing.assert_close(out[0, 0], v[0, 0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(k[0, 0, 0] @ s[0, 0], v[0, 0, 1], rtol=1e-12, atol=1e-12)


def test_memory_is_refused() -> None:
    with pytest.raises(ValueError, match="memory=None"):
        BackboneConfig(attention="deltanet", position="none", memory="xl")


def test_window_with_starts_equals_the_stream() -> None:
    rc.check_backbone_starts("deltanet", chunk_size=4)


def test_bfloat16_keeps_a_float32_state() -> None:
    rc.check_low_precision("deltanet", chunk_size=16)
