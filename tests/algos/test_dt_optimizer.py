"""The DT trainer's fused AdamW gives the same update as the per-parameter loop (torch's reference form)."""

from __future__ import annotations

import pytest
import torch

from rl_transformers.algos.dt import FUSED_ADAMW_DEVICES
from rl_transformers.policies.decision_transformer import DecisionTransformer, dt_backbone_config


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 1e-6)])
def test_fused_adamw_equals_the_per_parameter_loop(dtype: torch.dtype, tol: float) -> None:
    import gymnasium as gym
    import numpy as np

    assert "cpu" in FUSED_ADAMW_DEVICES
    obs = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    act = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    torch.manual_seed(0)
    model = DecisionTransformer(obs, act, dt_backbone_config(d_model=16, n_layers=2), 4, 20).to(dtype)
    a = [p.detach().clone().requires_grad_() for p in model.parameters()]
    b = [p.detach().clone().requires_grad_() for p in model.parameters()]
    kwargs = dict(lr=1e-2, weight_decay=1e-2, betas=(0.9, 0.95))
    fused = torch.optim.AdamW(a, fused=True, **kwargs)
    loop = torch.optim.AdamW(b, foreach=False, **kwargs)
    g = torch.Generator().manual_seed(1)
    for _ in range(6):
        for pa, pb in zip(a, b, strict=True):
            grad = torch.randn(pa.shape, generator=g, dtype=torch.float64).to(dtype)
            pa.grad, pb.grad = grad.clone(), grad.clone()
        fused.step()
        loop.step()
    for pa, pb in zip(a, b, strict=True):
        torch.testing.assert_close(pa, pb, rtol=tol, atol=tol)
    moved = sum((pa - p).abs().sum().item() for pa, p in zip(a, model.parameters(), strict=True))
    assert moved > 0
