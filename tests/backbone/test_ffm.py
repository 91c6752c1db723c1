"""``ffm``: the parallel scan == one token at a time == the paper's recurrence written out (float64)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from rl_transformers.backbone import BackboneConfig
from tests.backbone import recurrent_checks as rc


def naive(m, x: Tensor, starts: Tensor) -> Tensor:
    """Morad et al. 2023: x̃ = p ⊙ σ(i), S_t = γ ⊙ S_{t-1} + x̃_t 1^T with γ = exp(-|α| + iω),
    y = LN(W_mix [Re S, Im S]) ⊙ σ(o) + s ⊙ (1 - σ(o)); a loop over t with γ_{jk} built entry by entry."""
    mm, c, d = m.m, m.c, x.shape[-1]
    gamma = torch.empty(mm, c, dtype=torch.complex128)
    for j in range(mm):
        for k in range(c):
            gamma[j, k] = torch.exp(-m.alpha[j].abs()) * torch.exp(1j * m.omega[k])
    ys = []
    for b in range(x.shape[0]):
        s_agg = torch.zeros(mm, c, dtype=torch.complex128)
        for t in range(x.shape[1]):
            if starts[b, t]:
                s_agg = torch.zeros_like(s_agg)
            pre = m.pre.weight @ x[b, t] + m.pre.bias
            p, i, o, s = pre[:mm], pre[mm : 2 * mm], pre[2 * mm : 2 * mm + d], pre[2 * mm + d :]
            trace = p / (1 + torch.exp(-i))
            s_agg = gamma * s_agg + trace[:, None].to(torch.complex128)
            flat = torch.cat([s_agg.real, s_agg.imag], dim=-1).reshape(-1)
            z = m.mix.weight @ flat + m.mix.bias
            z = (z - z.mean()) / torch.sqrt(z.var(unbiased=False) + m.ln.eps) * m.ln.weight + m.ln.bias
            g = 1 / (1 + torch.exp(-o))
            ys.append(z * g + s * (1 - g))
    return torch.stack(ys).view(x.shape)


def test_ffm_matches_its_recurrence() -> None:
    m = rc.make_mixer("ffm", memory_size=5, context_size=3, max_period=16.0, chunk_size=4)
    with torch.no_grad():  # move the parameters off their initial values (α's sign, the norm's affine)
        m.alpha[0] = -m.alpha[0]
        m.ln.weight.normal_()
        m.ln.bias.normal_()
    rc.check_all(m, naive)


def test_initial_horizons_and_periods() -> None:
    m = rc.make_mixer("ffm", memory_size=4, context_size=3, min_period=2.0, max_period=200.0)
    gamma = m.decay(torch.float64)
    # trace j keeps 1 % after its horizon, context k turns once per period; both span [2, 200]
    horizons = torch.log(torch.tensor(0.01, dtype=torch.float64)) / torch.log(gamma.abs()[:, 0])
    torch.testing.assert_close(
        horizons,
        torch.tensor([2.0, 2 * 100 ** (1 / 3), 2 * 100 ** (2 / 3), 200.0]).double(),
        rtol=1e-5,
        atol=0,
    )
    torch.testing.assert_close(
        m.omega.detach().double(),
        torch.tensor([math.pi, 2 * math.pi / 20, 2 * math.pi / 200]).double(),
        rtol=1e-5,
        atol=0,
    )


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match="min_period"):
        BackboneConfig(
            attention="ffm", position="none", attention_options={"min_period": 8.0, "max_period": 2.0}
        )
    with pytest.raises(ValueError, match=r"memory=None"):
        BackboneConfig(attention="ffm", position="none", memory="xl")


def test_inside_a_backbone() -> None:
    rc.check_backbone("ffm")
