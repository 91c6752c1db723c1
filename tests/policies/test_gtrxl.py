"""Actor-critic policies: acting step by step with the carried state == evaluating the stored sequence in one pass.

Every core is run over a (T, B) stream with random episode starts, one token per step, storing the state at
each training-sequence start (every W steps, after ``segment_start``) as PPO does; then every W-step sequence
is re-evaluated in one pass from its stored state. Log-probs and values must agree to float64 precision.
"""

from __future__ import annotations

import warnings

import gymnasium as gym
import pytest
import torch

from rl_transformers.backbone import BackboneConfig, available
from rl_transformers.policies import (
    ActorCritic,
    ContextCore,
    GTrXLPolicy,
    PolicyConfig,
    gtrxl_backbone,
    make_policy,
    replay_exactness,
)
from rl_transformers.policies.cores import TwinCore
from rl_transformers.policies.packing import Packing

OBS = gym.spaces.Box(-1.0, 1.0, (3,))
ACT = gym.spaces.Discrete(3)
B, T, W = 3, 24, 8


def small(**kw) -> BackboneConfig:
    base = dict(d_model=16, n_layers=2, n_heads=2, position="rope", block="pre_ln")
    return BackboneConfig(**{**base, **kw})


def replay_error(policy: ActorCritic, seed: int = 0) -> float:
    """Max |difference| of log-probs and values between acting and one-pass evaluation."""
    g = torch.Generator().manual_seed(seed)
    policy = policy.double()
    obs = torch.randn(T, B, 3, generator=g, dtype=torch.float64)
    starts = torch.rand(T, B, generator=g) < 0.15
    starts[0] = True
    starts[W, 0] = True  # an episode starting exactly at a sequence start
    state = policy.initial_state(B)
    log_probs, values, actions, stored = [], [], [], []
    with torch.no_grad():
        for t in range(T):
            if t % W == 0:
                state = policy.segment_start(state)
                stored.append(state)
            out = policy.act(obs[t], state, starts[t])
            log_probs.append(out.log_prob)
            values.append(out.value)
            actions.append(out.action)
            state = out.state
        lp, v, a = torch.stack(log_probs), torch.stack(values), torch.stack(actions)
        err = 0.0
        for i, s0 in enumerate(stored):
            sl = slice(i * W, (i + 1) * W)
            seq = policy.evaluate_sequence(
                obs[sl].transpose(0, 1), a[sl].transpose(0, 1), s0, starts[sl].transpose(0, 1)
            )
            err = max(
                err, float((seq.log_prob - lp[sl].T).abs().max()), float((seq.value - v[sl].T).abs().max())
            )
    return err


CASES = {
    "gtrxl_xl": lambda: make_policy(PolicyConfig(backbone=gtrxl_backbone(16, 2, 2, mem_len=6)), OBS, ACT),
    "full_kv_cache": lambda: make_policy(PolicyConfig(backbone=small(), context_len=10), OBS, ACT),
    "full_unbounded_kv": lambda: make_policy(PolicyConfig(backbone=small(), bound_context=False), OBS, ACT),
    "lstm": lambda: make_policy(PolicyConfig(kind="lstm", hidden_size=12, rnn_layers=2), OBS, ACT),
    "gru": lambda: make_policy(PolicyConfig(kind="gru", hidden_size=12), OBS, ACT),
    "mlp": lambda: make_policy(PolicyConfig(kind="mlp", hidden_size=12), OBS, ACT),
    "gtrxl_separate_critic": lambda: make_policy(
        PolicyConfig(backbone=gtrxl_backbone(16, 2, 2, mem_len=6), critic="separate"), OBS, ACT
    ),
    "gru_separate_critic": lambda: make_policy(
        PolicyConfig(kind="gru", hidden_size=12, critic="separate"), OBS, ACT
    ),
    "context_core": lambda: ActorCritic(OBS, ACT, ContextCore(small(position="xl_relative"), context_len=W)),
}


def _normalised_gtrxl() -> ActorCritic:
    policy = make_policy(PolicyConfig(backbone=gtrxl_backbone(16, 2, 2, mem_len=6), norm_obs=True), OBS, ACT)
    assert policy.obs_norm is not None
    policy.obs_norm.update(torch.randn(50, 3) * 4 + 2)  # statistics far from the identity
    return policy


CASES["gtrxl_norm_obs"] = _normalised_gtrxl
if "linear" in available()["attention"]:
    CASES["linear"] = lambda: make_policy(PolicyConfig(backbone=small(attention="linear")), OBS, ACT)
if "local" in available()["attention"]:
    CASES["local_window"] = lambda: make_policy(
        PolicyConfig(backbone=small(attention="local", attention_options={"window": 5})), OBS, ACT
    )


@pytest.mark.parametrize("name", sorted(CASES))
def test_acting_equals_one_pass_evaluation(name: str) -> None:
    torch.manual_seed(0)
    assert replay_error(CASES[name]()) < 1e-10


def test_xl_without_window_differs_and_warns() -> None:
    cfg = gtrxl_backbone(16, 2, 2, mem_len=4)
    with pytest.warns(UserWarning, match="not replay the acting context"):
        policy = make_policy(PolicyConfig(backbone=cfg, bound_context=False), OBS, ACT)
    # Transformer-XL's segment mask lets later queries of a sequence see more than mem_len keys
    assert replay_error(policy) > 1e-4
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bounded = make_policy(PolicyConfig(backbone=cfg), OBS, ACT)
    assert bounded.core.backbone.cfg.options("attention").max_cache == 4
    assert replay_exactness(bounded.core.backbone.cfg)[0]


def test_default_is_gtrxl() -> None:
    policy = GTrXLPolicy(OBS, ACT)
    cfg = policy.backbone.cfg
    assert (cfg.block, cfg.memory, cfg.attention) == ("gtrxl", "xl", "full")
    assert cfg.options("block").gate_bias == 2.0
    expected = "xl_relative" if "xl_relative" in available()["position"] else "rope"
    assert cfg.position == expected
    action, value, log_prob, state = policy.act(
        torch.zeros(2, 3), policy.initial_state(2), torch.ones(2, dtype=torch.bool)
    )
    assert action.shape == value.shape == log_prob.shape == (2,)
    assert state.memory.h.shape[2] == 32  # the XL memory has mem_len columns from the start (static shape)
    assert state.memory.valid.sum(1).tolist() == [1, 1]  # one token written to it


def test_packing_cuts_rows_at_episode_starts() -> None:
    starts = torch.tensor([[True, False, False, True, False], [False, False, True, False, True]])
    p = Packing.from_starts(starts)
    # row 0 -> pieces [0,1,2], [3,4]; row 1 -> [0,1], [2,3], [4]
    assert p.n_pieces == 5 and p.length == 3
    assert p.row.tolist() == [0, 0, 1, 1, 1]
    assert p.reset.tolist() == [True, True, False, True, True]
    x = torch.arange(10.0).view(2, 5, 1)
    packed = p.pack(x)[..., 0]
    assert packed.tolist() == [[0, 1, 2], [3, 4, 0], [5, 6, 0], [7, 8, 0], [9, 0, 0]]
    assert p.valid().sum(1).tolist() == [3, 2, 2, 2, 1]
    assert torch.equal(p.unpack(p.pack(x), 2, 5), x)


def test_gradients_flow_through_the_training_window_only() -> None:
    torch.manual_seed(0)
    policy = make_policy(PolicyConfig(backbone=gtrxl_backbone(16, 1, 2, mem_len=4)), OBS, ACT)
    state = policy.initial_state(2)
    with torch.no_grad():
        for _ in range(5):
            state = policy.act(torch.randn(2, 3), state, torch.zeros(2, dtype=torch.bool)).state
    obs = torch.randn(2, 6, 3, requires_grad=True)
    out = policy.evaluate_sequence(
        obs, torch.zeros(2, 6, dtype=torch.long), state, torch.zeros(2, 6, dtype=torch.bool)
    )
    out.value[:, -1].sum().backward()
    assert (
        obs.grad is not None and obs.grad[:, :-1].abs().sum() > 0
    )  # earlier steps of the window get gradient
    assert not state.memory.h.requires_grad  # the stored memory is a constant


def test_norm_obs_needs_a_box_space() -> None:
    with pytest.raises(ValueError, match=r"norm_obs needs a Box observation space.*Discrete"):
        make_policy(PolicyConfig(kind="mlp", norm_obs=True), gym.spaces.Discrete(4), ACT)
    with pytest.raises(ValueError, match="norm_obs_clip"):
        PolicyConfig(norm_obs_clip=0.0)


def test_bad_policy_config() -> None:
    with pytest.raises(ValueError, match="policy kind"):
        PolicyConfig(kind="transfromer")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rnn_layers"):
        PolicyConfig(rnn_layers=0)


@pytest.mark.parametrize("kind", ["transformer", "gru"])
def test_detached_critic_trains_only_its_head(kind: str) -> None:
    """critic="detached" (sb3-contrib's shared_lstm): the value loss reaches the critic head and no
    core or encoder weight; the policy's numbers and the policy loss's gradients are unchanged."""
    policies = {}
    for mode in ("shared", "detached"):
        torch.manual_seed(0)
        config = PolicyConfig(kind=kind, backbone=gtrxl_backbone(16, 1, 2, mem_len=4), critic=mode)  # type: ignore[arg-type]
        policies[mode] = make_policy(config, OBS, ACT)
    g = torch.Generator().manual_seed(1)
    obs, starts = torch.randn(2, 6, 3, generator=g), torch.zeros(2, 6, dtype=torch.bool)
    actions = torch.randint(0, 3, (2, 6), generator=g)
    outs = {m: p.evaluate_sequence(obs, actions, p.initial_state(2), starts) for m, p in policies.items()}
    assert torch.equal(outs["shared"].value, outs["detached"].value)
    assert torch.equal(outs["shared"].log_prob, outs["detached"].log_prob)
    for mode, policy in policies.items():
        policy.zero_grad()
        outs[mode].value.square().sum().backward(retain_graph=True)
        core = [p.grad for n, p in policy.named_parameters() if not n.startswith(("critic.", "actor."))]
        touched = sum(float(x.abs().sum()) for x in core if x is not None)
        assert policy.critic.weight.grad is not None and policy.critic.weight.grad.abs().sum() > 0
        assert (touched == 0.0) == (mode == "detached"), (mode, touched)
    grads = {}
    for mode, policy in policies.items():
        policy.zero_grad()
        outs[mode].log_prob.sum().backward()
        grads[mode] = [p.grad for n, p in policy.named_parameters() if not n.startswith("critic.")]
    for a, b in zip(grads["shared"], grads["detached"], strict=True):
        assert (a is None and b is None) or torch.equal(a, b)


def test_a_bad_critic_names_the_choices() -> None:
    with pytest.raises(ValueError, match=r"critic 'detach' .*\['detached', 'separate', 'shared'\]"):
        PolicyConfig(critic="detach")  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["transformer", "lstm"])
def test_a_separate_critic_has_its_own_core_that_only_the_value_loss_trains(kind: str) -> None:
    """critic="separate" (sb3-contrib's enable_critic_lstm): the value loss reaches the critic's core and head
    only; the policy loss reaches neither; both cores carry their own state through resets."""
    torch.manual_seed(0)
    config = PolicyConfig(
        kind=kind, backbone=gtrxl_backbone(16, 1, 2, mem_len=4), hidden_size=12, critic="separate"
    )  # type: ignore[arg-type]
    policy = make_policy(config, OBS, ACT)
    assert isinstance(policy.core, TwinCore) and policy.critic.in_features == policy.core.actor.d_out
    critic_side = ("core.critic.", "critic.")
    g = torch.Generator().manual_seed(1)
    obs, starts = torch.randn(2, 6, 3, generator=g), torch.zeros(2, 6, dtype=torch.bool)
    starts[1, 3] = True
    actions = torch.randint(0, 3, (2, 6), generator=g)
    out = policy.evaluate_sequence(obs, actions, policy.initial_state(2), starts)
    for loss, trained_side in ((out.value.square().sum(), True), (out.log_prob.sum(), False)):
        policy.zero_grad()
        loss.backward(retain_graph=True)
        for name, p in policy.named_parameters():
            touched = p.grad is not None and float(p.grad.abs().sum()) > 0
            if name.startswith(critic_side) != trained_side:
                assert not touched, name
        assert any(p.grad is not None and float(p.grad.abs().sum()) > 0 for n, p in policy.named_parameters()
                   if n.startswith(critic_side) == trained_side)  # fmt: skip
    assert replay_error(policy) < 1e-9
