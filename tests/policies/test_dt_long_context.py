"""The Decision Transformer at long context: every causal attention at K = 64 (192 tokens,
past every default window and block of the registry) and K = 200 (600 tokens, a T-Maze corridor of 200).

References are independent runs, never the code under test on the same inputs:

- each right-padded row is compared with the **generic** path (``model.fused = False``) run on that row's real
  steps alone, unpadded and without a mask, so nothing padded exists in the reference;
- "pad more": the same real steps in a longer window whose padded steps hold garbage (large random values,
  random actions and timesteps, ``mask`` False) give the same real-step predictions;
- the rollout agent streaming (t < K) and sliding past K equals the agent that recomputes every step.
- reach: from the last step of a K = 200 window, s_0 is seen by ``full`` and by ``local`` with a window of
  200 tokens over 3 layers, not with 64.

Approximate attentions (performer, lsh, routing, ...) are compared with themselves (padded vs unpadded, fused vs
generic), never with ``full``. Every position scheme is also run at K = 200 (600 tokens). Everything runs in float64 with dropout 0; the tolerance is 1e-10.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from rl_transformers.backbone import available, capabilities
from rl_transformers.policies.decision_transformer import DecisionTransformer, dt_backbone_config
from rl_transformers.policies.dt_fast import fast_path_reason
from rl_transformers.policies.dt_rollout import DTAgent

CAUSAL_ATTENTIONS = [name for name in available()["attention"] if capabilities("attention", name).causal]
OBS = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
ACT = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
TOL = 1e-10
MAX_K = 200
MAX_EP_LEN = 400  # > every timestep below: no row of the timestep table is shared by clamping


def make_model(
    attention: str, k: int, seed: int = 0, position: str = "none", n_layers: int = 2, **options: object
) -> DecisionTransformer:
    torch.manual_seed(seed)
    cfg = dt_backbone_config(
        attention=attention,
        attention_options=options,
        position=position,
        d_model=16,
        n_layers=n_layers,
        n_heads=2,
        dropout=0.0,
    )
    model = DecisionTransformer(OBS, ACT, cfg, context_len=k, max_ep_len=MAX_EP_LEN, return_scale=0.1)
    model.set_state_normalization(np.array([0.5, -1.0, 2.0]), np.array([2.0, 0.5, 1.0]))
    return model.double().eval()


def windows(k: int, lengths: list[int], seed: int, garbage: bool) -> dict[str, torch.Tensor]:
    """Right-padded (B, k) windows with real steps [0, L); padded steps are zeros or garbage (mask False)."""
    g = torch.Generator().manual_seed(seed)
    b, n = len(lengths), MAX_K  # real values drawn at the largest K, so every k shares them
    mask = torch.arange(k)[None, :] < torch.tensor(lengths)[:, None]
    start = torch.randint(0, 100, (b, 1), generator=g)
    real = {
        "returns_to_go": torch.randn(b, n, generator=g, dtype=torch.float64)[:, :k],
        "observations": torch.randn(b, n, 3, generator=g, dtype=torch.float64)[:, :k],
        "actions": (torch.rand(b, n, 2, generator=g, dtype=torch.float64) * 2 - 1)[:, :k],
        "timesteps": start + torch.arange(k)[None, :],
    }
    pad = {
        "returns_to_go": 1e3 * torch.randn(b, k, generator=g, dtype=torch.float64),
        "observations": 1e3 * torch.randn(b, k, 3, generator=g, dtype=torch.float64),
        "actions": torch.rand(b, k, 2, generator=g, dtype=torch.float64) * 2 - 1,
        "timesteps": torch.randint(0, MAX_EP_LEN, (b, k), generator=g),
    }
    out = {}
    for name, x in real.items():
        m = mask.view(b, k, *([1] * (x.dim() - 2)))
        out[name] = torch.where(m, x, pad[name] if garbage else torch.zeros((), dtype=x.dtype))
    out["mask"] = mask
    return out


def unpadded_generic(
    model: DecisionTransformer, batch: dict[str, torch.Tensor], row: int, n: int
) -> torch.Tensor:
    """(n, A) generic-path predictions of row ``row``'s first n (real) steps run alone, without padding."""
    fused = model.fused
    model.fused = False
    try:
        with torch.no_grad():
            args = {name: x[row : row + 1, :n] for name, x in batch.items() if name != "mask"}
            return model(**args).predictions[0]
    finally:
        model.fused = fused


def check_padded_equals_unpadded(attention: str, k: int, lengths: list[int], position: str = "none") -> None:
    model = make_model(attention, k, position=position)
    batch = windows(k, lengths, seed=1, garbage=False)
    with torch.no_grad():
        padded = model(**batch).predictions  # the training forward: fused where the configuration allows it
    for row, n in enumerate(lengths):
        ref = unpadded_generic(model, batch, row, n)
        torch.testing.assert_close(padded[row, :n], ref, rtol=0, atol=TOL, msg=f"{attention} row {row}")


@pytest.mark.parametrize("attention", CAUSAL_ATTENTIONS)
def test_padded_windows_equal_the_unpadded_generic_run(attention: str) -> None:
    check_padded_equals_unpadded(attention, 64, [64, 40, 17, 1])


def test_the_fused_path_is_the_one_tested_for_full() -> None:
    """``full`` with the paper's shape runs the fused forward, so the test above compares fused vs generic."""
    assert fast_path_reason(make_model("full", 64)) is None
    assert fast_path_reason(make_model("local", 64)) is not None


@pytest.mark.parametrize("attention", CAUSAL_ATTENTIONS)
def test_more_padding_with_garbage_changes_no_real_output(attention: str) -> None:
    model = make_model(attention, 64)
    lengths = [64, 40, 17, 1]
    short = windows(64, lengths, seed=2, garbage=False)
    long = windows(96, lengths, seed=2, garbage=True)  # same real steps (same draws), 32 more padded steps
    for name in short:
        torch.testing.assert_close(long[name][:, :64][short["mask"]], short[name][short["mask"]])
    with torch.no_grad():
        a, b = model(**short).predictions, model(**long).predictions
    for row, n in enumerate(lengths):
        torch.testing.assert_close(b[row, :n], a[row, :n], rtol=0, atol=TOL, msg=f"{attention} row {row}")
    # the garbage does flow through the network: the padded steps' own outputs change
    assert not torch.allclose(b[3, 1:64], a[3, 1:64])


@pytest.mark.parametrize("attention", ["full", "local", "performer"])
def test_k200_padded_windows_equal_the_unpadded_generic_run(attention: str) -> None:
    """600 tokens: a corridor of 200 steps in one window; full also fused vs generic on the padded batch."""
    check_padded_equals_unpadded(attention, 200, [200, 123, 3])
    if attention == "full":
        model = make_model("full", 200)
        batch = windows(200, [200, 123, 3], seed=3, garbage=True)
        with torch.no_grad():
            fused = model(**batch).predictions
            model.fused = False
            generic = model(**batch).predictions
        mask = batch["mask"]
        torch.testing.assert_close(fused[mask], generic[mask], rtol=0, atol=TOL)


@pytest.mark.parametrize("position", available()["position"])
def test_every_position_scheme_at_k200(position: str) -> None:
    """600 tokens under every position scheme (absolute ones included: right padding keeps positions 0..)."""
    check_padded_equals_unpadded("full", 200, [200, 77, 5], position=position)


@pytest.mark.parametrize("attention", CAUSAL_ATTENTIONS)
def test_agent_streaming_then_sliding_equals_recompute(attention: str) -> None:
    """Past K the agent slides its window (recomputed, right-padded like training); before, it streams."""
    k, steps = 24, 30
    model = make_model(attention, k)
    actions = {}
    for mode in ("auto", "recompute"):
        rng = np.random.default_rng(0)
        agent = DTAgent(model, 2, np.array([3.0, -1.0]), mode=mode)
        out = []
        for t in range(steps):
            out.append(agent.act(rng.normal(size=(2, 3))))
            agent.observe(rng.normal(size=2), np.array([False, t == 9]))  # env 1 restarts inside the stream
        actions[mode] = np.stack(out)
        if mode == "auto":
            assert agent.calls["stream"] >= 10 and agent.calls["recompute"] >= 6
    np.testing.assert_allclose(actions["auto"], actions["recompute"], rtol=0, atol=TOL)


def oldest_step_seen(model: DecisionTransformer) -> int:
    """The oldest step whose observation the last step's prediction depends on (non-zero gradient)."""
    k = model.context_len
    batch = windows(k, [k], seed=4, garbage=False)
    obs = batch.pop("observations").requires_grad_(True)
    model.fused = False
    model(observations=obs, **batch).predictions[0, k - 1].sum().backward()
    assert obs.grad is not None
    return int((obs.grad[0].abs().sum(-1) > 0).nonzero().min())


def test_a_k200_window_reaches_the_first_step_only_if_the_attention_does() -> None:
    """docs/offline_memory.md: a windowed attention sees s_0 from step 199 only when layers x window >= 3K."""
    assert oldest_step_seen(make_model("full", 200, n_layers=3)) == 0
    short = oldest_step_seen(make_model("local", 200, n_layers=3, window=64))
    assert 100 < short < 199  # 3 layers of 64 tokens: about 64 steps back
    assert oldest_step_seen(make_model("local", 200, n_layers=3, window=200)) == 0
