"""``mlstm`` (Beck et al. 2024, arXiv 2405.04517): the chunked, stabilised layer equals the paper's unstabilised
recurrence written as a loop (values and gradients, with restarts), for both forget gates and every chunk size,
and streams exactly."""

from __future__ import annotations

import pytest
import torch

from rl_transformers.backbone import BackboneConfig
from tests.backbone import gated_checks as rc

torch.set_num_threads(1)


def naive(att, x, starts):
    """C_t = f_t C_{t-1} + i_t v_t k_t^T, n_t = f_t n_{t-1} + i_t k_t, h̃_t = C_t q_t / max(|n_t^T q_t|, 1)
    (eqs. 19-24, no stabiliser: float64 holds these gates), k scaled by D^{-1/2}; Y = σ(x W_o) ⊙ norm(h̃)."""
    b, t, _ = x.shape
    h, d = att.n_heads, att.d_head
    q, k, v = (p(x).view(b, t, h, d) for p in (att.q_proj, att.k_proj, att.v_proj))
    i_gate = att.i_proj(x).exp()
    f_pre = att.f_proj(x)
    f_gate = torch.sigmoid(f_pre) if att.options.forget_gate == "sigmoid" else f_pre.exp()
    c = torch.zeros(b, h, d, d, dtype=x.dtype)  # c[..., a, e] = C^T: rows index keys here
    n = torch.zeros(b, h, d, dtype=x.dtype)
    ys = []
    for s in range(t):
        c = torch.where(starts[:, s, None, None, None], 0.0, c)
        n = torch.where(starts[:, s, None, None], 0.0, n)
        ks = k[:, s] / d**0.5
        f, i = f_gate[:, s, :, None], i_gate[:, s, :, None]
        c = f[..., None] * c + i[..., None] * ks[..., :, None] * v[:, s][..., None, :]
        n = f * n + i * ks
        num = torch.einsum("bhk,bhkv->bhv", q[:, s], c)
        den = (n * q[:, s]).sum(-1, keepdim=True).abs().clamp_min(1.0)
        o = num / den
        o = o / torch.sqrt(o.pow(2).mean(-1, keepdim=True) + 1e-6) * att.norm.weight[:, 0]
        ys.append((torch.sigmoid(att.og_proj(x[:, s])).view(b, h, d) * o).reshape(b, h * d))
    return att.o_proj(torch.stack(ys, 1))


@pytest.mark.parametrize("forget_gate", ["sigmoid", "exp"])
@pytest.mark.parametrize("chunk", [1, 4, 64])
def test_chunked_equals_the_paper(chunk: int, forget_gate: str) -> None:
    att = rc.layer("mlstm", chunk_size=chunk, forget_gate=forget_gate)
    with torch.no_grad():  # input gates up to e^{±6}: the stabiliser's maximum moves
        att.i_proj.weight.mul_(8.0)
        att.f_proj.bias.sub_(3.0)
    rc.check_naive(att, naive)


def test_chunk_size_is_a_schedule() -> None:
    rc.check_chunk_sizes("mlstm")
    rc.check_chunk_sizes("mlstm", forget_gate="exp")


def test_stream_equals_one_pass() -> None:
    rc.check_stream("mlstm", chunk_size=4)


def test_reset_zeroes_the_rows() -> None:
    rc.check_reset_rows("mlstm")


def test_a_restart_cuts_the_past() -> None:
    rc.check_reset_cuts("mlstm", chunk_size=4)


def test_large_gates_stay_finite_in_float32() -> None:
    """Input-gate pre-activations of ~±200 overflow exp in float32; the stabilised layer stays finite and
    matches the float64 run."""
    att = rc.layer("mlstm", chunk_size=4)
    with torch.no_grad():
        att.i_proj.bias.fill_(200.0)
    x = torch.randn(2, 9, rc.D_MODEL, dtype=torch.float64)
    want = rc.run(att, x, state=att.init_state(2, None, torch.float64))[0]
    att32 = att.float()
    got, state = rc.run(att32, x.float(), state=att32.init_state(2, None, torch.float32))
    assert torch.isfinite(got).all() and all(torch.isfinite(t).all() for t in (state.c, state.n, state.m))
    torch.testing.assert_close(got.double(), want, rtol=1e-3, atol=1e-4)


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="forget_gate"):
        BackboneConfig(attention="mlstm", position="none", attention_options={"forget_gate": "tanh"})
    with pytest.raises(ValueError, match="memory=None"):
        BackboneConfig(attention="mlstm", position="none", memory="xl")


def test_window_with_starts_equals_the_stream() -> None:
    rc.check_backbone_starts("mlstm", chunk_size=4)


def test_bfloat16_keeps_a_float32_state() -> None:
    rc.check_low_precision("mlstm", chunk_size=16)
