"""scripts/attention_at_distance.py: the logit split of xl_relative adds up, and the per-layer summary is the
closed form on hand-built logits."""

from __future__ import annotations

import dataclasses
import math

import gymnasium as gym
import pytest
import torch

from rl_transformers.policies import PolicyConfig, gtrxl_backbone, make_policy
from rl_transformers.utils.errors import UserError
from tests.script_module import load_script

mod = load_script("attention_at_distance")

OBS, ACT = gym.spaces.Box(-1.0, 1.0, (3,)), gym.spaces.Discrete(3)


def test_the_split_adds_up_and_a_zero_position_projection_gives_a_zero_position_part() -> None:
    torch.manual_seed(0)
    policy = make_policy(PolicyConfig(backbone=gtrxl_backbone(16, 2, 2, mem_len=4)), OBS, ACT)
    state, start = policy.initial_state(2), torch.ones(2, dtype=torch.bool)
    with torch.no_grad():
        for _ in range(6):
            state = policy.act(torch.randn(2, 3), state, start).state
            start = torch.zeros(2, dtype=torch.bool)
        x = torch.randn(2, 3)
        record = mod.split_logits(policy, lambda: policy.act(x, state, start))
        assert len(record) == 2 and all(c.shape == (2, 2, 1, 5) for c, _ in record)
        assert all(p.abs().max() > 0 for _, p in record)
        for proj in policy.backbone.position.r_proj:  # type: ignore[union-attr]
            proj.weight.zero_()
        record = mod.split_logits(policy, lambda: policy.act(x, state, start))
    assert all(float(p.abs().max()) == 0.0 for _, p in record)
    assert "logits_aligned" not in vars(policy.backbone.position)  # the spy is removed


def test_a_policy_without_xl_relative_is_refused() -> None:
    backbone = dataclasses.replace(gtrxl_backbone(16, 1, 2, mem_len=4), position="rope")
    policy = make_policy(PolicyConfig(backbone=backbone), OBS, ACT)
    with pytest.raises(UserError, match="no xl_relative"):
        mod.split_logits(policy, lambda: None)


def test_the_summary_is_the_closed_form() -> None:
    """One layer, two heads, 4 keys (distances 3, 2, 1, 0); content zero, so attention = softmax(position)."""
    position = torch.tensor([[[[2.0, 0.0, 0.0, 0.0]], [[0.0, 0.0, 0.0, 0.0]]]])  # (B=1, H=2, Tq=1, Tk=4)
    out = mod.summarize([(torch.zeros_like(position), position)], distance=3)[0]
    assert out["keys"] == 4
    assert out["position_std"] == pytest.approx(float(torch.tensor([2.0, 0, 0, 0]).std()))
    assert out["position_at_d_minus_mean"] == pytest.approx(0.0)  # min over heads: head 1 is flat
    assert out["mass_at_d"] == pytest.approx(math.exp(2) / (math.exp(2) + 3))
