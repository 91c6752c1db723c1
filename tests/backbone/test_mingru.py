"""``mingru``: the parallel scan == one token at a time == the paper's recurrence written out (float64), and the
optional ``mingru-pytorch`` package with the same weights."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from rl_transformers.backbone import BackboneConfig
from tests.backbone import recurrent_checks as rc


def naive(m, x: Tensor, starts: Tensor) -> Tensor:
    """z_t = σ(W_z x_t), h̃_t = g(W_h x_t), h_t = (1 - z_t) h_{t-1} + z_t h̃_t (Feng et al. 2024, Alg. 2 / B.3)."""
    w, bias = m.in_proj.weight, m.in_proj.bias
    n = m.d_inner
    ys = []
    for b in range(x.shape[0]):
        h = torch.zeros(n, dtype=x.dtype)
        for t in range(x.shape[1]):
            if starts[b, t]:
                h = torch.zeros_like(h)
            pre = w @ x[b, t] + bias
            hid, gate = pre[:n], pre[n:]
            g = torch.where(hid >= 0, hid + 0.5, torch.sigmoid(hid))
            z = 1 / (1 + torch.exp(-gate))
            h = (1 - z) * h + z * g
            ys.append(m.out_proj(h))
    return torch.stack(ys).view(x.shape[0], x.shape[1], -1)


@pytest.mark.parametrize("expansion", [1.0, 1.5])
def test_mingru_matches_its_recurrence(expansion: float) -> None:
    rc.check_all(rc.make_mixer("mingru", expansion=expansion, chunk_size=4), naive)


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match="expansion"):
        BackboneConfig(attention="mingru", position="none", attention_options={"expansion": 0})
    with pytest.raises(ValueError, match=r"memory=None"):
        BackboneConfig(attention="mingru", position="none", memory="xl")


def test_matches_mingru_pytorch() -> None:
    """The ``mingru-pytorch`` package (log-space Heinsen scan) with our weights, biases zero: same outputs,
    in parallel and step by step from its carried hidden state."""
    pkg = pytest.importorskip(
        "minGRU_pytorch", reason="optional reference package mingru-pytorch not installed"
    )
    m = rc.make_mixer("mingru")
    ref = pkg.minGRU(rc.D_MODEL).double()
    with torch.no_grad():
        m.in_proj.bias.zero_()
        ref.to_hidden_and_gate.weight.copy_(m.in_proj.weight)
        x = torch.randn(2, 9, rc.D_MODEL, dtype=torch.float64)
        got, _ = rc.parallel(m, x)
        torch.testing.assert_close(got, ref(x), rtol=1e-10, atol=1e-10)
        got_step, _ = rc.stepwise(m, x)
        prev, ys = None, []
        for t in range(x.shape[1]):
            y, prev = ref(x[:, t : t + 1], prev, return_next_prev_hidden=True)
            ys.append(y)
        torch.testing.assert_close(got_step, torch.cat(ys, 1), rtol=1e-10, atol=1e-10)


def test_inside_a_backbone() -> None:
    rc.check_backbone("mingru")
