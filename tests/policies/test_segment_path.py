"""The training forward without cutting (``Core.segments``) equals the cut-and-packed one, values and gradients.

Both run the same attention sums: the packed pieces of a row over right-padded, reset copies of its state, the
uncut row over its own state with each token masked to its episode. In float64 they agree to rounding (the sums
run over longer masked key rows and larger batches, so BLAS may add in another order): outputs and every
parameter gradient to 1e-10 relative to the gradient's scale.
"""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch

from rl_transformers.policies import PolicyConfig, gtrxl_backbone, make_policy
from rl_transformers.policies import actor_critic as actor_critic_module

OBS = gym.spaces.Box(-1.0, 1.0, (3,))
ACT = gym.spaces.Discrete(3)
B, W = 5, 9


def run(policy, state, obs, actions, starts, segments: bool, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(actor_critic_module, "SEGMENT_PATH", segments)
    policy.zero_grad(set_to_none=True)
    out = policy.evaluate_sequence(obs, actions, state, starts)
    (out.log_prob.sum() + (out.value**2).sum() + out.entropy.sum()).backward()
    grads = {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}
    return out, grads


@pytest.mark.parametrize(
    ("mem_len", "attention", "position", "memory"),
    [
        (4, "full", "xl_relative", "xl"),
        (32, "full", "xl_relative", "xl"),
        (4, "gaussian_prior", "xl_relative", "xl"),
        (32, "gaussian_prior", "xl_relative", "xl"),
        (4, "linear", "rope", "xl"),  # feature-map attentions: running sums restarted by segment
        (32, "linear", "rope", "xl"),
        (4, "performer", "rope", "xl"),
        (4, "lsh", "xl_relative", "xl"),
        (32, "lsh", "xl_relative", "xl"),
        (2, "full", "xl_relative", "knn"),  # the store: a query after a restart retrieves nothing
        (1, "full", "xl_relative", "knn"),
    ],
)
def test_uncut_training_forward_equals_packed(
    mem_len: int, attention: str, position: str, memory: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    backbone = gtrxl_backbone(16, 2, 2, mem_len=mem_len).replace(
        attention=attention, attention_options={}, position=position
    )
    if memory == "knn":  # a small store that a few acting steps fill, top-k below its size
        backbone = backbone.replace(
            memory="knn", memory_options={"mem_len": mem_len, "store_size": 6, "top_k": 3}
        )
    policy = make_policy(PolicyConfig(backbone=backbone), OBS, ACT).double()
    assert policy.core.segments  # the default GTrXL takes the uncut path
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # a stored state with a partly filled memory, as a rollout leaves it
        state = policy.initial_state(B)
        for t in range(6):
            step = policy.act(
                torch.randn(B, 3, generator=g, dtype=torch.float64), state, torch.tensor([t == 2] * B)
            )
            state = step.state
    obs = torch.randn(B, W, 3, generator=g, dtype=torch.float64)
    actions = torch.randint(0, 3, (B, W), generator=g)
    starts = torch.rand(B, W, generator=g) < 0.3
    starts[0, 0] = starts[1, 4] = starts[1, 5] = True
    starts[2] = False
    assert starts[:, 1:].any()
    packed, packed_grads = run(policy, state, obs, actions, starts, False, monkeypatch)
    uncut, uncut_grads = run(policy, state, obs, actions, starts, True, monkeypatch)
    for name in ("log_prob", "value", "entropy"):
        assert (getattr(uncut, name) - getattr(packed, name)).abs().max() < 1e-12, name
    assert packed_grads.keys() == uncut_grads.keys() and len(packed_grads) > 10
    for name, want in packed_grads.items():
        scale = max(float(want.abs().max()), 1e-3)
        assert float((uncut_grads[name] - want).abs().max()) < 1e-10 * scale, name
