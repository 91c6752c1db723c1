"""PPO evaluation acts with the XL memory's projection cache (``policy.acting_state``, as the rollout does): the
greedy returns and lengths equal those of acting without it."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

import envs  # noqa: F401  (registers rlt/ ids)
from rl_transformers.algos.evaluation import evaluate_policy
from rl_transformers.policies import PolicyConfig, gtrxl_backbone, make_policy


def test_evaluation_with_the_projection_cache_equals_acting_without_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = gym.make("rlt/TMazeShort-v0")
    torch.manual_seed(0)
    policy = make_policy(
        PolicyConfig(backbone=gtrxl_backbone(16, 2, 2, mem_len=8)), env.observation_space, env.action_space
    )
    env.close()
    calls: list[Any] = []
    real = policy.acting_state

    def counting(state: Any) -> Any:
        calls.append(state)
        return real(state)

    monkeypatch.setattr(policy, "acting_state", counting)
    torch.manual_seed(1)  # sampled actions: the same draws in both evaluations
    cached = evaluate_policy(policy, "rlt/TMazeShort-v0", None, 6, seed=5, seq_len=4, deterministic=False)
    assert len(calls) == 1
    monkeypatch.setattr(
        policy, "acting_state", lambda state: state
    )  # no cache: every step projects the memory
    torch.manual_seed(1)
    plain = evaluate_policy(policy, "rlt/TMazeShort-v0", None, 6, seed=5, seq_len=4, deterministic=False)
    assert (
        len(set(cached[0].tolist())) > 1
    )  # sampled episodes of different returns: the test can tell them apart
    for a, b in zip(cached, plain, strict=True):
        np.testing.assert_array_equal(a, b)
