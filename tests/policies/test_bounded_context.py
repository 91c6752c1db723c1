"""bound_context: every registered causal attention's acting state stays bounded over a long stream.

An attention whose cache grew with every step (fixed / strided / bigbird did before they took ``max_cache``)
makes PPO slower every update (the stored window states and the training keys grow with the run), so the
policy's bound must reach every entry, not only those with a ``max_cache`` option.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from rl_transformers.backbone import BackboneConfig, available, capabilities, registry
from rl_transformers.policies.gtrxl import PolicyConfig, make_policy

OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
ACT = gym.spaces.Discrete(2)
CONTEXT = 16
STEPS = 640
EPISODE = 7


def longest_key_axis(state: object, seen: set[int] | None = None) -> int:
    """Largest key count of any cached tensor in a (nested) state: dim 2 of (B, H, S, D), dim 1 of (B, S)."""
    seen = set() if seen is None else seen
    if id(state) in seen:
        return 0
    seen.add(id(state))
    if isinstance(state, torch.Tensor):
        return state.shape[2] if state.dim() == 4 else state.shape[1] if state.dim() in (2, 3) else 0
    if isinstance(state, (tuple, list)):
        return max((longest_key_axis(s, seen) for s in state), default=0)
    if hasattr(state, "__dict__"):
        return max((longest_key_axis(s, seen) for s in vars(state).values()), default=0)
    return 0


CAUSAL = [a for a in available()["attention"] if capabilities("attention", a).causal]


@pytest.mark.parametrize("attention", CAUSAL)
def test_acting_state_is_bounded_by_the_context(attention: str) -> None:
    torch.manual_seed(0)
    position = "rope" if "qk" in registry.get("attention", attention).cls.position_kinds else "none"
    cfg = BackboneConfig(
        d_model=16, n_layers=2, n_heads=2, attention=attention, memory=None, position=position
    )
    policy = make_policy(PolicyConfig(backbone=cfg, context_len=CONTEXT), OBS, ACT).eval()
    state = policy.initial_state(3)
    obs = torch.zeros(3, 3)
    sizes = []
    with torch.inference_mode():
        for t in range(STEPS):
            starts = torch.full((3,), t % EPISODE == 0)
            state = policy.act(obs, state, starts).state
            sizes.append(longest_key_axis(state))
    # bounded: no growth over the second half of the stream (the bound is the context, or a constant of the
    # entry's own pattern, e.g. adaptive_span's largest span or blockwise's super-block)
    half = max(sizes[: STEPS // 2])
    assert max(sizes[STEPS // 2 :]) <= half < STEPS // 2, (
        f"{attention}: the cache grows ({half} -> {sizes[-1]})"
    )
