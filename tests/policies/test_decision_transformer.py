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
    try:
        cfg = tiny(dropout=0.0, **overrides)
    except ValueError as err:
        pytest.skip(f"{overrides} not constructible: {err}")
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


# --- the fused training forward (dt_fast.py) equals the generic backbone path -----------------------------------


def _padded_batch(k: int, b: int = 5, seed: int = 3, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([k, 1, k - 1, 2, k])[:b]
    mask = torch.arange(k)[None] < lengths[:, None]
    batch = {
        "returns_to_go": torch.rand(b, k, generator=g, dtype=dtype) * 30,
        "observations": torch.randn(b, k, 3, generator=g, dtype=dtype),
        "actions": torch.rand(b, k, 2, generator=g, dtype=dtype) * 2 - 1,
        "timesteps": torch.randint(0, 50, (b, k), generator=g),
        "mask": mask,
    }
    return {
        n: v * mask.view(*mask.shape, *([1] * (v.dim() - 2))) if n != "mask" else v for n, v in batch.items()
    }


@pytest.mark.parametrize(
    "overrides, kwargs",
    [
        ({}, {}),
        ({"n_layers": 1}, {}),
        ({"n_layers": 3, "n_heads": 4, "activation": "gelu"}, {}),
        ({"n_layers": 2, "ffn_dropout": 0.2}, {"condition_on_return": False}),
    ],
)
@pytest.mark.parametrize("train", [False, True])
def test_fused_forward_equals_generic_path(overrides: dict, kwargs: dict, train: bool) -> None:
    """Same weights, float64, dropout 0: predictions at real steps and all parameter gradients agree."""
    from rl_transformers.policies.dt_fast import fast_path_reason

    backbone = tiny(dropout=0.0, **overrides)
    if "ffn_dropout" in overrides:  # dropout layers present but compared in eval mode only
        backbone = tiny(**overrides)
    model = make_model(k=4, backbone=backbone, **kwargs).double()
    assert fast_path_reason(model) is None
    model.train(train and "ffn_dropout" not in overrides)
    batch = _padded_batch(4)
    fused = model(**batch)
    assert fused.state is None  # the fused path ran
    model.zero_grad()
    model.action_loss(fused.predictions, batch["actions"], batch["mask"]).backward()
    grads_fused = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    model.fused = False
    generic = model(**batch)
    assert generic.state is not None
    model.action_loss(generic.predictions, batch["actions"], batch["mask"]).backward()
    real = batch["mask"]
    torch.testing.assert_close(fused.predictions[real], generic.predictions[real], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(fused.hidden[real], generic.hidden[real], rtol=1e-10, atol=1e-12)
    grads_generic = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert grads_fused.keys() == grads_generic.keys()
    for name, g in grads_generic.items():
        torch.testing.assert_close(grads_fused[name], g, rtol=1e-9, atol=1e-12, msg=name)


def test_fused_path_is_refused_where_it_would_change_the_maths() -> None:
    from rl_transformers.policies.dt_fast import fast_path_reason

    assert "padding" in fast_path_reason(make_model(padding="left"))
    assert "position" in fast_path_reason(make_model(backbone=tiny(position="rope")))
    assert "block" in fast_path_reason(make_model(backbone=tiny(block="gtrxl")))
    assert "max_cache" in fast_path_reason(make_model(backbone=tiny(attention_options={"max_cache": 2})))
    model = make_model(backbone=tiny(dropout=0.0)).eval()
    batch = _padded_batch(4, dtype=torch.float32)
    assert model(**batch, return_state=True).state is not None  # asking for the state forces the generic path


def test_fast_dropout_keeps_with_probability_one_minus_p_and_rescales() -> None:
    from rl_transformers.policies.dt_fast import fast_dropout, residual_dropout

    torch.manual_seed(0)
    x = torch.full((400_000,), 2.0)
    for p in (0.1, 0.5):
        y = fast_dropout(x, p, training=True)
        kept = y != 0
        assert torch.all(y[kept] == 2.0 / (1 - p))
        n = x.numel()
        assert abs(kept.double().mean().item() - (1 - p)) < 5 * (p * (1 - p) / n) ** 0.5
        base = torch.randn(n)
        z = residual_dropout(base, x, p, training=True) - base
        zk = z.abs() > 1e-3
        torch.testing.assert_close(z[zk], torch.full_like(z[zk], 2.0 / (1 - p)))
        assert abs(zk.double().mean().item() - (1 - p)) < 5 * (p * (1 - p) / n) ** 0.5
    assert torch.equal(fast_dropout(x, 0.3, training=False), x)
    assert torch.equal(fast_dropout(x, 1.0, training=True), torch.zeros_like(x))


@pytest.mark.parametrize("n_layers", [1, 3])
def test_fused_dropout_scales_equal_scaled_weights_when_every_mask_keeps(monkeypatch, n_layers: int) -> None:
    """Dropout p > 0 with every mask forced to keep: each dropout multiplies by 1 / (1 - p). The fused path
    folds that scale into other operations (embedding LayerNorm, v projection, addcmul); it must equal the
    generic path at dropout 0 with the same scale put by hand on the embedding LayerNorm, the v and output
    projections and fc2 (float64)."""
    from rl_transformers.policies import dt_fast

    p = 0.25
    s = 1.0 / (1.0 - p)
    monkeypatch.setattr(dt_fast, "_keep_mask", lambda x, p: torch.ones_like(x))
    fused_model = make_model(k=4, backbone=tiny(dropout=p, n_layers=n_layers)).double().train()
    reference = make_model(k=4, backbone=tiny(dropout=0.0, n_layers=n_layers)).double().eval()
    reference.load_state_dict(fused_model.state_dict())
    with torch.no_grad():
        for param in (reference.embed_norm.weight, reference.embed_norm.bias):
            param.mul_(s)
        for block in reference.backbone.depth.blocks:
            for lin in (block.attention.v_proj, block.attention.o_proj, block.ffn.fc2):
                lin.weight.mul_(s)
                lin.bias.mul_(s)
    batch = _padded_batch(4)
    fused = fused_model(**batch)
    assert fused.state is None
    reference.fused = False
    expected = reference(**batch)
    real = batch["mask"]
    torch.testing.assert_close(fused.hidden[real], expected.hidden[real], rtol=1e-10, atol=1e-12)


def _scaled_reference(model, p: float, n_layers: int, **kwargs):
    """The generic model at dropout 0 with every dropout's 1 / (1 - p) put by hand on the weights after it."""
    s = 1.0 / (1.0 - p)
    reference = make_model(k=4, backbone=tiny(dropout=0.0, n_layers=n_layers), **kwargs).double().eval()
    reference.load_state_dict(model.state_dict())
    scaled = [reference.embed_norm.weight, reference.embed_norm.bias]
    for block in reference.backbone.depth.blocks:
        for lin in (block.attention.v_proj, block.attention.o_proj, block.ffn.fc2):
            scaled += [lin.weight, lin.bias]
    with torch.no_grad():
        for param in scaled:
            param.mul_(s)
    names = {id(param): name for name, param in reference.named_parameters()}
    return reference, {names[id(param)] for param in scaled}


@pytest.mark.parametrize("n_layers", [1, 3])
@pytest.mark.parametrize("condition_on_return", [True, False])
def test_fused_dropout_gradients_equal_generic_path_when_every_mask_keeps(
    monkeypatch, n_layers: int, condition_on_return: bool
) -> None:
    """The dropout path's hand-written backward passes (dt_fast.MANUAL_BACKWARD) with every mask forced to keep:
    predictions equal the generic path with the scales put on the weights, and every gradient equals the generic
    one (times 1 / (1 - p) for the weights that carry the scale in the reference), float64."""
    from rl_transformers.policies import dt_fast

    assert dt_fast.MANUAL_BACKWARD
    p = 0.25
    monkeypatch.setattr(dt_fast, "_keep_mask", lambda x, p: torch.ones_like(x))
    kwargs = {"condition_on_return": condition_on_return}
    model = make_model(k=4, backbone=tiny(dropout=p, n_layers=n_layers), **kwargs).double().train()
    reference, scaled = _scaled_reference(model, p, n_layers, **kwargs)
    batch = _padded_batch(4)
    fused = model(**batch)
    assert fused.state is None
    model.action_loss(fused.predictions, batch["actions"], batch["mask"]).backward()
    reference.fused = False
    expected = reference(**batch)
    reference.action_loss(expected.predictions, batch["actions"], batch["mask"]).backward()
    real = batch["mask"]
    torch.testing.assert_close(fused.predictions[real], expected.predictions[real], rtol=1e-10, atol=1e-12)
    grads = {n: q.grad for n, q in reference.named_parameters() if q.grad is not None}
    assert grads.keys() == {n for n, q in model.named_parameters() if q.grad is not None}
    for name, param in model.named_parameters():
        if name in grads:
            want = grads[name] * (1.0 / (1.0 - p) if name in scaled else 1.0)
            torch.testing.assert_close(param.grad, want, rtol=1e-9, atol=1e-12, msg=name)


@pytest.mark.parametrize("overrides", [{"n_layers": 3}, {"n_layers": 2, "n_heads": 4}, {"n_layers": 1}])
def test_fused_dropout_manual_backward_equals_autograd_with_random_masks(
    monkeypatch, overrides: dict
) -> None:
    """With real (random) dropout masks, the hand-written backward passes give the same predictions and every
    parameter gradient as autograd of the same fused forward (the same masks replayed), float64."""
    from rl_transformers.policies import dt_fast

    drawn: list[torch.Tensor] = []
    replay: list[torch.Tensor] = []
    original = dt_fast._keep_mask

    def recording(x, p):
        mask = original(x, p) if not replay else replay.pop(0)
        drawn.append(mask)
        return mask

    monkeypatch.setattr(dt_fast, "_keep_mask", recording)
    model = make_model(k=4, backbone=tiny(dropout=0.3, **overrides)).double().train()
    batch = _padded_batch(4)
    results = []
    for manual in (True, False):
        monkeypatch.setattr(dt_fast, "MANUAL_BACKWARD", manual)
        model.zero_grad()
        out = model(**batch)
        model.action_loss(out.predictions, batch["actions"], batch["mask"]).backward()
        results.append((out.predictions, {n: q.grad.clone() for n, q in model.named_parameters()}))
        if manual:
            replay, drawn = drawn, []
    (pred_manual, grads_manual), (pred_auto, grads_auto) = results
    assert (
        not replay and len(drawn) == 3 * overrides["n_layers"] + 1
    )  # every mask replayed, in the same order
    assert any(not bool(mask.all()) for mask in drawn)  # the masks drop something
    real = batch["mask"]
    torch.testing.assert_close(pred_manual[real], pred_auto[real], rtol=1e-10, atol=1e-12)
    for name, g in grads_auto.items():
        torch.testing.assert_close(grads_manual[name], g, rtol=1e-9, atol=1e-12, msg=name)


@pytest.mark.parametrize("shape", [(999,), (64, 59, 59), (7, 3)])
def test_keep_mask_is_unbiased_at_every_position(shape) -> None:
    """Each entry of _keep_mask (the halves of 64-bit draws) is kept with probability 1 - p, the even and odd
    entries alike (odd sizes included), and the mask takes only the values 0 and 1."""
    from rl_transformers.policies.dt_fast import _keep_mask

    torch.manual_seed(0)
    reps = 200_000 // int(np.prod(shape)) + 1
    for p in (0.1, 0.5, 0.9):
        masks = torch.stack([_keep_mask(torch.empty(shape), p) for _ in range(reps)]).reshape(reps, -1)
        assert masks.shape[1] == int(np.prod(shape)) and masks.dtype == torch.float32
        assert bool(((masks == 0) | (masks == 1)).all())
        for half in (masks[:, 0::2], masks[:, 1::2]):
            n = half.numel()
            assert abs(half.double().mean().item() - (1 - p)) < 5 * (p * (1 - p) / n) ** 0.5
    assert bool((_keep_mask(torch.empty(1000), 1.0 - 1e-12) == 0).all())
    assert bool((_keep_mask(torch.empty(1000), 1e-12) == 1).all())
