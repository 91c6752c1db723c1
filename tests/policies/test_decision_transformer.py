"""Decision Transformer model and rollout agent: token layout, heads, losses, act() == batched forward.

Every expected value is rebuilt independently in the test (explicit loops over steps, hand-written
formulas), never by calling the code under test on the same inputs.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rl_transformers.backbone import available, capabilities
from rl_transformers.backbone.model import BackboneOutput
from rl_transformers.policies.decision_transformer import DecisionTransformer, dt_backbone_config
from rl_transformers.policies.dt_padding import pad_steps
from rl_transformers.policies.dt_rollout import DTAgent
from rl_transformers.policies.dt_spaces import space_from_dict, space_to_dict

BOX_OBS = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
BOX_ACT = gym.spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([1.0, 4.0], np.float32))
DISCRETE_ACT = gym.spaces.Discrete(3, start=-1)


def tiny(**overrides):
    base = dict(d_model=16, n_layers=2, n_heads=2, dropout=0.1)
    base.update(overrides)
    return dt_backbone_config(**base)


def make_model(action_space=BOX_ACT, k=4, seed=0, backbone=None, **kwargs) -> DecisionTransformer:
    torch.manual_seed(seed)
    model = DecisionTransformer(
        BOX_OBS, action_space, backbone or tiny(), context_len=k, max_ep_len=50, return_scale=0.1, **kwargs
    )
    model.set_state_normalization(np.array([0.5, -1.0, 2.0]), np.array([2.0, 0.5, 1.0]))
    return model


def test_default_backbone_is_the_papers() -> None:
    cfg = dt_backbone_config()
    assert (cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.dropout) == (128, 3, 1, 0.1)
    assert (cfg.activation, cfg.causal, cfg.position, cfg.attention) == ("relu", True, "none", "full")
    assert dt_backbone_config(position="rope").position == "rope"


@pytest.mark.parametrize("padding", ["right", "left"])
def test_tokens_interleave_return_state_action_with_timestep(padding: str) -> None:
    """Backbone input = LN(embedding + timestep embedding) in the order R̂_0, s_0, a_0, R̂_1, ...; padding mask x3."""
    model = make_model(k=3, padding=padding).eval()
    model.fused = False  # the generic path hands the tokens to the backbone (the fused one is tested below)
    captured = {}

    def fake_backbone(x, state=None, reset=None, key_padding_mask=None):
        captured["x"], captured["kpm"] = x, key_padding_mask
        return BackboneOutput(y=x, state=None)

    model.backbone.forward = fake_backbone
    rtg = torch.tensor([[7.0, 4.0, 0.0]])
    obs = torch.tensor([[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [0.0, 0.0, 0.0]]])
    act = torch.tensor([[[0.5, 1.0], [-0.5, 3.0], [0.0, 0.0]]])
    ts = torch.tensor([[2, 3, 0]])
    mask = torch.tensor([[True, True, False]])
    model(rtg, obs, act, ts, mask)
    x, kpm = captured["x"], captured["kpm"]
    assert x.shape == (1, 9, 16)
    assert kpm.tolist() == [[True] * 6 + [False] * 3]
    mean, std = torch.tensor([0.5, -1.0, 2.0]), torch.tensor([2.0, 0.5, 1.0])
    ln = model.embed_norm
    for i in range(3):
        t_emb = model.embed_timestep.weight[ts[0, i]]
        r_tok = model.embed_return.weight[:, 0] * (rtg[0, i] * 0.1) + model.embed_return.bias + t_emb
        s_tok = model.embed_state.weight @ ((obs[0, i] - mean) / std) + model.embed_state.bias + t_emb
        a_tok = model.embed_action.weight @ act[0, i] + model.embed_action.bias + t_emb
        for j, tok in enumerate((r_tok, s_tok, a_tok)):
            torch.testing.assert_close(x[0, 3 * i + j], ln(tok), rtol=1e-5, atol=1e-5)


def test_bc_model_has_two_tokens_per_step() -> None:
    model = make_model(k=3, condition_on_return=False).eval()
    assert model.embed_return is None and model.tokens_per_step == 2
    steps = model.embed_steps(
        torch.zeros(1, 3), torch.randn(1, 3, 3), torch.randn(1, 3, 2), torch.zeros(1, 3)
    )
    assert steps.shape == (1, 3, 2, 16)
    # the return-to-go does not influence a BC model
    args = (torch.randn(1, 3, 3), torch.randn(1, 3, 2), torch.arange(3)[None])
    out1 = model(torch.zeros(1, 3), *args).predictions
    out2 = model(torch.full((1, 3), 100.0), *args).predictions
    assert torch.equal(out1, out2)


def test_prediction_comes_from_state_token_and_is_causal() -> None:
    """a_t's prediction changes with s_t and R̂_t, not with a_t or anything later."""
    model = make_model(k=4).eval()
    g = torch.Generator().manual_seed(1)
    rtg, obs, act = (
        torch.randn(1, 4, generator=g),
        torch.randn(1, 4, 3, generator=g),
        torch.rand(1, 4, 2, generator=g),
    )
    ts = torch.arange(4)[None]
    base = model(rtg, obs, act, ts).predictions
    act2 = act.clone()
    act2[0, 2] += 1.0  # a_2 feeds predictions of steps 3.. only
    out = model(rtg, obs, act2, ts).predictions
    torch.testing.assert_close(out[:, :3], base[:, :3], rtol=0, atol=0)
    assert not torch.allclose(out[:, 3], base[:, 3])
    obs2 = obs.clone()
    obs2[0, 2] += 1.0
    out = model(rtg, obs2, act, ts).predictions
    torch.testing.assert_close(out[:, :2], base[:, :2], rtol=0, atol=0)
    assert not torch.allclose(out[:, 2], base[:, 2])


def test_box_head_stays_in_bounds_and_mse_is_masked() -> None:
    model = make_model()
    h = torch.randn(5, 16) * 100
    pred = model.head(h)
    assert (pred[:, 0] >= -1).all() and (pred[:, 0] <= 1).all()
    assert (pred[:, 1] >= 0).all() and (pred[:, 1] <= 4).all()
    p = torch.tensor([[[0.0, 1.0], [1.0, 1.0], [9.0, 9.0]]])
    a = torch.tensor([[[1.0, 1.0], [0.0, 3.0], [0.0, 0.0]]])
    mask = torch.tensor([[True, True, False]])
    # (1 + 0 + 1 + 4) / (2 real steps * 2 dims)
    assert model.action_loss(p, a, mask).item() == pytest.approx(6.0 / 4.0)


def test_discrete_head_cross_entropy_and_action_offset() -> None:
    model = make_model(DISCRETE_ACT)
    logits = torch.tensor([[[2.0, 0.0, -1.0], [0.0, 3.0, 0.0], [5.0, 5.0, 5.0]]])
    actions = torch.tensor([[0, -1, 1]])  # raw values, start = -1 -> indices 1, 0, 2
    mask = torch.tensor([[True, True, False]])
    expected = (
        F.cross_entropy(logits[0, 0], torch.tensor(1)) + F.cross_entropy(logits[0, 1], torch.tensor(0))
    ) / 2
    assert model.action_loss(logits, actions, mask).item() == pytest.approx(expected.item(), rel=1e-6)
    assert model.to_action(logits).tolist() == [[-1, 0, -1]]


def test_pad_steps_left_moves_real_steps_to_the_end() -> None:
    x = torch.tensor([[1, 2, 0, 0], [5, 6, 7, 8], [9, 0, 0, 0]])
    lengths = torch.tensor([2, 4, 1])
    assert pad_steps(x, lengths, "left").tolist() == [[0, 0, 1, 2], [5, 6, 7, 8], [0, 0, 0, 9]]
    assert pad_steps(x, lengths, "right") is x


def test_space_round_trip_and_rebuild() -> None:
    for space in (BOX_ACT, DISCRETE_ACT, BOX_OBS):
        back = space_from_dict(space_to_dict(space))
        assert back == space
    model = make_model(DISCRETE_ACT, padding="left")
    clone = DecisionTransformer.from_kwargs(model.init_kwargs())
    clone.load_state_dict(model.state_dict())
    assert clone.padding == "left" and clone.action_start == -1
    assert torch.equal(clone.state_std, model.state_std)


def test_errors_name_the_problem() -> None:
    with pytest.raises(ValueError, match="Box and Discrete"):
        DecisionTransformer(gym.spaces.MultiBinary(3), BOX_ACT)
    with pytest.raises(ValueError, match="causal"):
        DecisionTransformer(BOX_OBS, BOX_ACT, tiny(causal=False))
    with pytest.raises(ValueError, match="padding"):
        DecisionTransformer(BOX_OBS, BOX_ACT, tiny(), padding="middle")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="target_return"):
        DTAgent(make_model())


# --- act() against an independently built batched forward ------------------------------------------------------


def reference_action(model: DecisionTransformer, hist: list[dict], k: int) -> torch.Tensor:
    """The action the batched forward predicts at the last of ``hist``'s steps, from the last K steps."""
    window = hist[-k:]
    n = len(window)
    rtg = torch.zeros(1, k)
    obs = torch.zeros(1, k, *model.obs_shape)
    act = (
        torch.zeros(1, k, dtype=torch.long) if model.discrete_actions else torch.zeros(1, k, model.action_dim)
    )
    ts = torch.zeros(1, k, dtype=torch.long)
    mask = torch.zeros(1, k, dtype=torch.bool)
    offset = 0 if model.padding == "right" else k - n
    for j, step in enumerate(window):
        rtg[0, offset + j] = step["rtg"]
        obs[0, offset + j] = torch.as_tensor(step["obs"])
        ts[0, offset + j] = step["t"]
        mask[0, offset + j] = True
        if j < n - 1:
            act[0, offset + j] = torch.as_tensor(step["action"])
    with torch.no_grad():
        pred = model(rtg, obs, act, ts, mask).predictions[0, offset + n - 1]
    return model.to_action(pred)


def run_episodes(model, n_envs, steps, dones_at, mode, seed=0, target=(5.0, 9.0)):
    """Drive a DTAgent with random observations / rewards; check each action against the reference."""
    rng = np.random.default_rng(seed)
    agent = DTAgent(model, n_envs, np.array(target[:n_envs]), mode=mode)
    k = model.context_len
    hists: list[list[dict]] = [[] for _ in range(n_envs)]
    rtg = np.array(target[:n_envs], dtype=np.float64)
    t = np.zeros(n_envs, dtype=int)
    for step in range(steps):
        obs = rng.normal(size=(n_envs, 3)).astype(np.float32)
        actions = agent.act(obs)
        for e in range(n_envs):
            hists[e].append({"rtg": rtg[e], "obs": obs[e], "t": t[e]})
            expected = reference_action(model, hists[e], k)
            np.testing.assert_allclose(actions[e], expected.numpy(), rtol=1e-4, atol=1e-5)
            hists[e][-1]["action"] = actions[e]
        rewards = rng.normal(size=n_envs)
        dones = np.array([(step, e) in dones_at for e in range(n_envs)])
        agent.observe(rewards, dones)
        rtg -= rewards
        t += 1
        for e in np.flatnonzero(dones):
            hists[e], rtg[e], t[e] = [], target[e], 0
    return agent


@pytest.mark.parametrize("action_space", [BOX_ACT, DISCRETE_ACT], ids=["box", "discrete"])
@pytest.mark.parametrize("mode", ["auto", "recompute"])
def test_act_equals_batched_forward_on_the_same_history(action_space, mode: str) -> None:
    model = make_model(action_space, k=4)
    # 2 envs, env 1 ends an episode at step 2 (its row restarts inside the streamed state), both run past K.
    agent = run_episodes(model, 2, 9, {(2, 1)}, mode)
    if mode == "auto":
        assert agent.calls["stream"] > 0 and agent.calls["recompute"] > 0
    else:
        assert agent.calls["stream"] == 0


def test_act_streams_again_after_a_common_reset() -> None:
    model = make_model(k=3)
    agent = run_episodes(model, 1, 8, {(4, 0)}, "auto")
    # episode 1: steps 0-2 streamed, 3-4 recomputed; episode 2: steps 0-2 streamed again
    assert agent.calls == {"stream": 6, "recompute": 2}


def test_left_padding_recomputes_and_matches() -> None:
    model = make_model(k=4, padding="left", backbone=tiny(position="learned"))
    assert not model.streams_exactly
    agent = run_episodes(model, 2, 7, {(1, 0)}, "auto")
    assert agent.calls["stream"] == 0


def test_bc_agent_needs_no_target() -> None:
    model = make_model(k=3, condition_on_return=False)
    agent = DTAgent(model, 2)
    for _ in range(5):
        a = agent.act(np.zeros((2, 3), np.float32))
        agent.observe(np.ones(2))
    assert a.shape == (2, 2)


# --- backbones --------------------------------------------------------------------------------------------------

CAUSAL_ATTENTIONS = [name for name in available()["attention"] if capabilities("attention", name).causal]


def backbone_cases():
    cases = [
        pytest.param({"position": "rope"}, id="full-rope"),
        pytest.param({"position": "learned"}, id="full-learned"),
    ]
    cases += [pytest.param({"attention": name}, id=f"{name}-none") for name in CAUSAL_ATTENTIONS]
    if "xl" in available()["memory"]:
        cases.append(pytest.param({"position": "rope", "memory": "xl"}, id="full-rope-xl"))
    for kind, name in (
        ("block", "gtrxl"),
        ("block", "post_ln"),
        ("depth", "universal"),
        ("depth", "early_exit"),
    ):
        if name in available()[kind]:
            cases.append(pytest.param({kind: name}, id=f"{kind}-{name}"))
    return cases


@pytest.mark.parametrize("overrides", backbone_cases())
def test_dt_runs_on_backbone(overrides: dict) -> None:
    """Training forward/backward is finite and act() (stream or recompute) equals the batched forward."""
    cfg = tiny(dropout=0.0, **overrides)  # every case is a valid DT backbone: a refusal is a failure
    model = make_model(DISCRETE_ACT, k=4, backbone=cfg)
    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[True] * 4, [True, True, False, False]])
    rtg, obs = torch.randn(2, 4, generator=g), torch.randn(2, 4, 3, generator=g)
    actions = torch.randint(-1, 2, (2, 4), generator=g)
    out = model(rtg, obs, actions, torch.arange(4).expand(2, 4), mask)
    loss = model.action_loss(out.predictions, actions, mask)
    for aux in out.aux_losses.values():
        loss = loss + aux
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    agent = run_episodes(model, 2, 6, {(1, 0)}, "auto")
    assert (agent.calls["stream"] > 0) == model.streams_exactly
