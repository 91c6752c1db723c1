"""DT batching on hand-built trajectories: exact returns-to-go, windows, padding masks, sampling, %BC."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from offline_data import Episode
from rl_transformers.algos.dt_data import TrajectoryDataset, returns_to_go, top_fraction_episodes
from rl_transformers.policies.decision_transformer import DecisionTransformer, dt_backbone_config
from rl_transformers.policies.dt_rollout import DTAgent


def episode(rewards, obs0=0.0, discrete=False) -> Episode:
    n = len(rewards)
    obs = (obs0 + np.arange(n, dtype=np.float32))[:, None]
    actions = np.arange(n) % 2 if discrete else (0.1 * (np.arange(n) + 1))[:, None]
    flags = np.zeros(n, bool)
    flags[-1] = True
    return Episode(obs, actions, np.asarray(rewards, float), flags, np.zeros(n, bool), obs + 1)


@pytest.fixture
def data() -> TrajectoryDataset:
    # ep0: rewards 1..4 (obs 10..13), ep1: rewards 5, 6 (obs 20, 21)
    return TrajectoryDataset([episode([1, 2, 3, 4], 10.0), episode([5, 6], 20.0)], discrete_actions=False)


def test_returns_to_go_is_reverse_cumsum() -> None:
    assert returns_to_go(np.array([1.0, 2.0, 3.0, 4.0])).tolist() == [10.0, 9.0, 7.0, 4.0]
    assert returns_to_go(np.array([-1.0])).tolist() == [-1.0]


def test_dataset_concatenates_with_rtg_and_timesteps(data: TrajectoryDataset) -> None:
    assert data.returns_to_go.tolist() == [10, 9, 7, 4, 11, 6]
    assert data.timesteps.tolist() == [0, 1, 2, 3, 0, 1]
    assert data.starts.tolist() == [0, 4] and data.lengths.tolist() == [4, 2]
    mean, std = data.state_stats()
    obs = np.array([10, 11, 12, 13, 20, 21], float)
    assert mean[0] == pytest.approx(obs.mean()) and std[0] == pytest.approx(obs.std() + 1e-6)


def test_window_right_padding_exact_values(data: TrajectoryDataset) -> None:
    b = data.windows(np.array([0, 0, 1]), np.array([2, 0, 1]), 3, "right")
    assert b.returns_to_go.tolist() == [[7, 4, 0], [10, 9, 7], [6, 0, 0]]
    assert b.timesteps.tolist() == [[2, 3, 0], [0, 1, 2], [1, 0, 0]]
    assert b.mask.tolist() == [[True, True, False], [True, True, True], [True, False, False]]
    assert b.observations[..., 0].tolist() == [[12, 13, 0], [10, 11, 12], [21, 0, 0]]
    torch.testing.assert_close(b.actions[..., 0], torch.tensor([[0.3, 0.4, 0], [0.1, 0.2, 0.3], [0.2, 0, 0]]))
    assert b.returns_to_go.dtype == torch.float32 and b.timesteps.dtype == torch.long


def test_window_left_padding_exact_values(data: TrajectoryDataset) -> None:
    b = data.windows(np.array([0, 1]), np.array([2, 0]), 3, "left")
    assert b.returns_to_go.tolist() == [[0, 7, 4], [0, 11, 6]]
    assert b.timesteps.tolist() == [[0, 2, 3], [0, 0, 1]]
    assert b.mask.tolist() == [[False, True, True], [False, True, True]]
    assert b.observations[..., 0].tolist() == [[0, 12, 13], [0, 20, 21]]


def test_window_length_cap_and_bad_start(data: TrajectoryDataset) -> None:
    b = data.windows(np.array([0]), np.array([0]), 3, "right", lengths=np.array([2]))
    assert b.mask.tolist() == [[True, True, False]] and b.returns_to_go.tolist() == [[10, 9, 0]]
    with pytest.raises(ValueError, match="inside"):
        data.windows(np.array([1]), np.array([2]), 3, "right")


def test_sampling_is_proportional_to_length_and_uniform_in_start() -> None:
    data = TrajectoryDataset([episode([1] * 30), episode([1] * 10)], discrete_actions=False)
    b = data.sample(20_000, 5, np.random.default_rng(0), "right")
    first_t = b.timesteps[:, 0].numpy()
    long_ep = b.returns_to_go[:, 0].numpy() + first_t == 30  # R̂_t = 30 - t in ep0, 10 - t in ep1
    assert long_ep.mean() == pytest.approx(0.75, abs=0.015)
    counts = np.bincount(first_t, minlength=30)
    # every start step equally likely: 30 + 10 = 40 steps -> t < 10 twice as frequent (both episodes)
    assert counts[:10].mean() / counts[10:].mean() == pytest.approx(2.0, rel=0.08)


def test_sampling_is_seeded() -> None:
    data = TrajectoryDataset([episode([1] * 7), episode([2] * 3)], discrete_actions=False)
    a = data.sample(16, 4, np.random.default_rng(3), "right")
    b = data.sample(16, 4, np.random.default_rng(3), "right")
    assert all(torch.equal(getattr(a, f), getattr(b, f)) for f in a.fields())


def test_top_fraction_keeps_best_episodes_by_steps() -> None:
    lengths = np.array([10, 10, 30, 50])
    returns = np.array([5.0, 9.0, 7.0, 1.0])
    assert top_fraction_episodes(lengths, returns, 1.0).tolist() == [0, 1, 2, 3]
    assert top_fraction_episodes(lengths, returns, 0.1).tolist() == [1]  # 10 of 100 steps: the best
    assert top_fraction_episodes(lengths, returns, 0.5).tolist() == [0, 1, 2]  # 9, 7, 5: 50 steps
    assert top_fraction_episodes(lengths, returns, 0.05).tolist() == [1]  # at least one episode
    with pytest.raises(ValueError, match="fraction"):
        top_fraction_episodes(lengths, returns, 0.0)
    data = TrajectoryDataset([episode([1] * 4), episode([9] * 4)], discrete_actions=False, top_fraction=0.5)
    assert data.episode_indices.tolist() == [1] and data.returns.tolist() == [36.0]


def test_discrete_actions_stay_integers() -> None:
    data = TrajectoryDataset([episode([1, 1, 1], discrete=True)], discrete_actions=True)
    b = data.windows(np.array([0]), np.array([1]), 3, "right")
    assert b.actions.dtype == torch.long and b.actions.tolist() == [[1, 0, 0]]


@pytest.mark.parametrize("padding", ["right", "left"])
def test_agent_context_equals_training_window(padding: str) -> None:
    """Replaying a dataset episode through DTAgent gives, at every step, the training window ending there."""
    rewards = [1.0, -2.0, 0.5, 3.0, 1.0, 2.0, -1.0]
    ep = episode(rewards, 5.0)
    data = TrajectoryDataset([ep], discrete_actions=False)
    k = 3
    model = DecisionTransformer(
        gym.spaces.Box(-np.inf, np.inf, (1,)),
        gym.spaces.Box(0.0, 1.0, (1,)),
        dt_backbone_config(d_model=8, n_layers=1, n_heads=1),
        context_len=k,
        max_ep_len=20,
        padding=padding,
    )
    agent = DTAgent(model, 1, target_return=float(sum(rewards)), mode="recompute")
    for t in range(len(rewards)):
        agent.act(ep.observations[t : t + 1])
        agent.act_hist[0, min(t, k - 1)] = torch.as_tensor(ep.actions[t])  # replay the data's action
        ctx = agent.context()
        start = max(0, t - k + 1)
        ref = data.windows(np.array([0]), np.array([start]), k, padding, lengths=np.array([t - start + 1]))
        # the agent's last action slot holds a_t (just chosen); a training window holds the data's a_t too
        for name in ("returns_to_go", "observations", "actions", "timesteps", "mask"):
            torch.testing.assert_close(ctx[name], getattr(ref, name), rtol=0, atol=1e-5, msg=name)
        agent.observe(rewards[t])
