"""Reward scaling against SB3's own VecNormalize, the annealed clip range, and both through a PPO run."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from rl_transformers.algos.ppo import train
from rl_transformers.algos.ppo_config import PPOConfig
from rl_transformers.algos.reward_norm import RewardNorm
from rl_transformers.utils.errors import UserError
from tests.algos.test_ppo import BATCH, final_params, tiny


def _sb3_scaled(rewards: np.ndarray, dones: np.ndarray, gamma: float) -> np.ndarray:
    """What stable_baselines3's VecNormalize(norm_obs=False) hands the learner for scripted rewards / ends."""
    pytest.importorskip("stable_baselines3")
    import gymnasium as gym
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    class Scripted(gym.Env):
        observation_space = gym.spaces.Box(-1.0, 1.0, (1,))
        action_space = gym.spaces.Discrete(2)

        def __init__(self, column: int) -> None:
            self.column, self.t = column, 0

        def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
            return np.zeros(1, dtype=np.float32), {}

        def step(self, action: int) -> tuple:
            r, d = float(rewards[self.t, self.column]), bool(dones[self.t, self.column])
            self.t += 1
            return np.zeros(1, dtype=np.float32), r, d, False, {}

    n = rewards.shape[1]
    venv = VecNormalize(DummyVecEnv([lambda i=i: Scripted(i) for i in range(n)]), norm_obs=False, gamma=gamma)
    venv.reset()
    out = []
    for _ in range(rewards.shape[0]):
        _, scaled, _, _ = venv.step(np.zeros(n, dtype=np.int64))
        out.append(scaled)
    return np.array(out)


def test_reward_scaling_equals_sb3_vecnormalize() -> None:
    rng = np.random.default_rng(0)
    rewards = rng.normal(2.0, 3.0, size=(200, 3)).astype(np.float32).astype(np.float64)
    dones = rng.random((200, 3)) < 0.05
    expected = _sb3_scaled(rewards, dones, gamma=0.98)
    ours = RewardNorm(3, gamma=0.98)
    got = np.array([ours(r, d) for r, d in zip(rewards, dones)])
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-8)
    assert not np.allclose(got, rewards)  # it does scale


def test_reward_scaling_by_hand() -> None:
    """Two steps of one env, computed by hand: G1 = 2, G2 = 0.5·2 + 4 = 5."""
    norm = RewardNorm(1, gamma=0.5, clip=100.0)
    c0 = 1e-4
    r1 = norm(np.array([2.0]), np.array([False]))
    var1 = (c0 * 1.0 + 0.0 + (2.0 - 0.0) ** 2 * c0 * 1 / (c0 + 1)) / (c0 + 1)
    assert r1[0] == pytest.approx(2.0 / np.sqrt(var1 + 1e-8))
    r2 = norm(np.array([4.0]), np.array([True]))
    mean1 = 2.0 / (c0 + 1)
    var2 = (var1 * (c0 + 1) + (5.0 - mean1) ** 2 * (c0 + 1) / (c0 + 2)) / (c0 + 2)
    assert r2[0] == pytest.approx(4.0 / np.sqrt(var2 + 1e-8))
    assert norm.returns[0] == 0.0  # the episode ended: the next return starts afresh


def test_reward_norm_state_round_trip_and_bad_entries() -> None:
    a = RewardNorm(2, 0.9)
    for _ in range(5):
        a(np.array([1.0, -1.0]), np.array([False, True]))
    b = RewardNorm(2, 0.9)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())), "ckpt")
    assert b.state_dict() == a.state_dict()
    with pytest.raises(ValueError, match=r"ckpt.*3 envs"):
        RewardNorm(3, 0.9).load_state_dict(a.state_dict(), "ckpt")
    with pytest.raises(ValueError, match="impossible"):
        RewardNorm(2, 0.9).load_state_dict({**a.state_dict(), "var": -1.0}, "ckpt")


def test_annealed_clip_follows_the_rate() -> None:
    ppo = PPOConfig(learning_rate=1e-3, clip_coef=0.2, anneal_clip=True)
    assert ppo.clip_at(1e-3) == pytest.approx(0.2) and ppo.clip_at(2.5e-4) == pytest.approx(0.05)
    assert PPOConfig(clip_coef=0.2).clip_at(1e-5) == 0.2  # off: constant
    with pytest.raises(UserError, match="anneal-clip"):
        PPOConfig(anneal_lr=False, anneal_clip=True)


def test_ppo_with_zoo_conventions_logs_annealed_clip_and_resumes_bit_exactly(tmp_path: Path) -> None:
    def cfg(root: Path) -> object:
        base = tiny(root, updates=4)
        ppo = dataclasses.replace(base.ppo, norm_reward=True, anneal_clip=True, clip_vloss=False)
        return dataclasses.replace(base, ppo=ppo)

    straight = train(cfg(tmp_path / "straight"))  # type: ignore[arg-type]
    rows = [json.loads(x) for x in (straight.run_dir / "progress.jsonl").read_text().splitlines()]
    clips = [r["train/clip_range"] for r in rows]
    assert clips == pytest.approx([0.2 * (1 - u / 4) for u in range(4)])
    first = train(cfg(tmp_path / "split"), callback=lambda tr: tr.update < 2)  # type: ignore[arg-type]
    resumed = train(dataclasses.replace(cfg(tmp_path / "split"), resume=str(first.run_dir)))  # type: ignore[type-var]
    ps, pr = final_params(straight.run_dir), final_params(resumed.run_dir)
    assert all(np.array_equal(ps[k].numpy(), pr[k].numpy()) for k in ps)
    assert resumed.step == 4 * BATCH


@pytest.mark.parametrize("cadence", ["rollout", "step"])
def test_observation_statistics_cadence_in_a_run(tmp_path: Path, cadence: str) -> None:
    """rollout: the normaliser merges each rollout's stored observations after its epochs; step: each arriving
    observation once (the reset ones included) from SB3's prior count of 1e-4. The policy has its normaliser
    back after the run, and the statistics resume with it."""
    base = tiny(tmp_path / cadence, updates=3)
    cfg = dataclasses.replace(
        base,
        policy=dataclasses.replace(base.policy, norm_obs=True),
        ppo=dataclasses.replace(base.ppo, norm_obs_update=cadence),
    )
    result = train(cfg)
    count = float(final_params(result.run_dir)["obs_norm.count"])
    n_envs, steps = cfg.num_envs, 3 * cfg.ppo.num_steps
    if cadence == "step":
        assert count == pytest.approx(n_envs * (steps + 1) + 1e-4)
    else:
        assert count == n_envs * steps


def test_unknown_observation_cadence_is_a_clear_error() -> None:
    with pytest.raises(UserError, match="norm-obs-update"):
        PPOConfig(norm_obs_update="every")  # type: ignore[arg-type]
