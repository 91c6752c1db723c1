"""``lru``: the parallel scan == one token at a time == the paper's recurrence written out (float64), and the
optional ``lru-pytorch`` package with the same weights."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from rl_transformers.backbone import BackboneConfig
from tests.backbone import recurrent_checks as rc


def naive(m, x: Tensor, starts: Tensor) -> Tensor:
    """h_t = λ h_{t-1} + γ (B u_t), y_t = Re(C h_t) + D u_t (Orvieto et al. 2023, eqs. 1-3), a loop over t."""
    nu, theta = torch.exp(m.nu_log), torch.exp(m.theta_log)
    lam = torch.exp(torch.complex(-nu, theta))
    gamma = torch.exp(m.gamma_log)
    bmat, cmat = torch.complex(m.b_re, m.b_im), torch.complex(m.c_re, m.c_im)
    ys = []
    for b in range(x.shape[0]):
        h = torch.zeros(m.d_state, dtype=torch.complex128)
        for t in range(x.shape[1]):
            if starts[b, t]:
                h = torch.zeros_like(h)
            u = x[b, t]
            h = lam * h + gamma * (bmat @ u.to(torch.complex128))
            ys.append((cmat @ h).real + m.d_skip * u)
    return torch.stack(ys).view(x.shape)


def test_lru_matches_its_recurrence() -> None:
    rc.check_all(rc.make_mixer("lru", d_state=6, chunk_size=4), naive)


def test_ring_initialisation() -> None:
    m = rc.make_mixer("lru", d_state=4000, r_min=0.5, r_max=0.9, max_phase=1.0)
    lam, gamma = m.coefficients(torch.float64)
    assert lam.abs().min() >= 0.5 - 1e-6 and lam.abs().max() <= 0.9 + 1e-6
    assert lam.angle().min() >= 0 and lam.angle().max() <= 1.0 + 1e-9
    torch.testing.assert_close(gamma, torch.sqrt(1 - lam.abs() ** 2))
    mag2 = lam.abs() ** 2  # uniform on [r_min², r_max²]
    assert abs(mag2.mean().item() - (0.25 + 0.81) / 2) < 0.02


def test_bad_options_and_memory_are_refused() -> None:
    with pytest.raises(ValueError, match="r_min"):
        BackboneConfig(attention="lru", position="none", attention_options={"r_min": 0.9, "r_max": 0.5})
    with pytest.raises(ValueError, match=r"memory=None \(--backbone.memory None\)"):
        BackboneConfig(attention="lru", position="none", memory="xl")
    with pytest.raises(ValueError, match="position"):
        BackboneConfig(attention="lru", position="rope")


def test_matches_lru_pytorch() -> None:
    """The ``lru-pytorch`` package (a token loop, float32) with our weights: same outputs."""
    lru_pytorch = pytest.importorskip(
        "LRU_pytorch", reason="optional reference package lru-pytorch not installed"
    )
    m = rc.make_mixer("lru", d_state=6)
    ref = lru_pytorch.LRU(rc.D_MODEL, rc.D_MODEL, 6)
    with torch.no_grad():
        ref.nu_log.copy_(m.nu_log)
        ref.theta_log.copy_(m.theta_log)
        ref.gamma_log.copy_(m.gamma_log)
        ref.B.copy_(torch.complex(m.b_re, m.b_im))
        ref.C.copy_(torch.complex(m.c_re, m.c_im))
        ref.D.copy_(torch.diag(m.d_skip))
        x = torch.randn(2, 7, rc.D_MODEL, dtype=torch.float64)
        want = ref(x.float())
        got, _ = rc.parallel(m, x)
    torch.testing.assert_close(got.float(), want, rtol=1e-4, atol=1e-5)


def test_inside_a_backbone() -> None:
    rc.check_backbone("lru")
