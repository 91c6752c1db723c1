"""The options that make the peer's network expressible: per-head hidden layers, no observation encoder, and
PyTorch's initialisation of the recurrent core; checked against sb3-contrib's own MlpLstmPolicy."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch

import envs  # noqa: F401
from rl_transformers.policies import PolicyConfig, make_policy

ZOO_KWARGS = {"hidden_size": 64, "match_params": False, "critic": "separate", "head_hidden": (64,)}


def _spaces() -> tuple[gym.Space, gym.Space]:
    env = gym.make("rlt/CartPoleNoVel-v0")
    return env.observation_space, env.action_space


def test_peer_shaped_lstm_has_sb3_contribs_parameter_count() -> None:
    pytest.importorskip("sb3_contrib", reason="the peers extra (sb3-contrib) is not installed")
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.env_util import make_vec_env
    from torch import nn

    obs, act = _spaces()
    ours = make_policy(PolicyConfig(kind="lstm", obs_encoder="none", init="torch", **ZOO_KWARGS), obs, act)
    kwargs = {"lstm_hidden_size": 64, "enable_critic_lstm": True, "ortho_init": False}
    kwargs |= {"activation_fn": nn.ReLU, "net_arch": {"pi": [64], "vf": [64]}}
    peer = RecurrentPPO("MlpLstmPolicy", make_vec_env("rlt/CartPoleNoVel-v0", 1), policy_kwargs=kwargs)
    count = sum(p.numel() for p in ours.parameters())
    assert count == sum(p.numel() for p in peer.policy.parameters()) == 43_331
    default = make_policy(PolicyConfig(kind="lstm", **ZOO_KWARGS), obs, act)
    assert sum(p.numel() for p in default.parameters()) > count  # the mlp encoder adds its layers


def test_head_hidden_layers_feed_both_heads() -> None:
    obs, act = _spaces()
    policy = make_policy(
        PolicyConfig(kind="gru", hidden_size=8, match_params=False, head_hidden=(5, 3)), obs, act
    )
    assert policy.critic.in_features == 3
    state = policy.initial_state(4)
    out = policy.act(torch.zeros(4, 2), state, torch.ones(4, dtype=torch.bool))
    assert out.value.shape == (4,) and out.action.shape == (4,)
    out.value.sum().backward()
    assert policy.critic_body[0].weight.grad is not None and policy.actor_body[0].weight.grad is None


def test_init_choices() -> None:
    obs, act = _spaces()
    base = {"kind": "lstm", "hidden_size": 16, "match_params": False}
    ortho = make_policy(PolicyConfig(**base), obs, act)
    torch_init = make_policy(PolicyConfig(**base, init="torch"), obs, act)
    assert float(ortho.core.rnn.bias_ih_l0.detach().abs().max()) == 0.0
    bias = torch_init.core.rnn.bias_ih_l0.detach()
    assert 0.0 < float(bias.abs().max()) <= 16**-0.5
    # the heads: orthogonal gain 0.01 (near-uniform policy) against PyTorch's kaiming-uniform bound 1/sqrt(16)
    small = ortho.actor.linear.weight.detach()
    assert float(torch.linalg.matrix_norm(small, ord=2)) == pytest.approx(0.01, rel=1e-4)
    big = torch_init.actor.linear.weight.detach()
    assert float(big.abs().max()) <= 0.25 and float(torch.linalg.matrix_norm(big, ord=2)) > 0.05
    assert (
        float(torch_init.critic.bias.detach().abs().max())
        > 0.0
        == float(ortho.critic.bias.detach().abs().max())
    )


def test_obs_encoder_none_refuses_what_it_cannot_flatten() -> None:
    obs, act = _spaces()
    with pytest.raises(ValueError, match="obs_encoder='none' needs a flat Box"):
        make_policy(PolicyConfig(kind="lstm", obs_encoder="none"), gym.spaces.Discrete(3), act)
    with pytest.raises(ValueError, match="transformer needs its encoder"):
        PolicyConfig(obs_encoder="none")
    with pytest.raises(ValueError, match="head_hidden"):
        PolicyConfig(head_hidden=(0,))
    policy = make_policy(
        PolicyConfig(kind="lstm", obs_encoder="none", hidden_size=8, match_params=False), obs, act
    )
    assert policy.core.d_in == 2  # CartPoleNoVel observes x and theta
