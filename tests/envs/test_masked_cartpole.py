"""Masked CartPole: the kept dimensions equal the hidden CartPole-v1 state, limit 500, memory suffices."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import envs  # noqa: F401  (registers rlt/ ids)
from envs.cartpole import MASKS, make_masked_cartpole

CASES = [("rlt/CartPoleNoVel-v0", (0, 2)), ("rlt/CartPoleNoPos-v0", (1, 3))]


@pytest.mark.parametrize(("env_id", "kept"), CASES)
def test_observation_is_the_kept_part_of_the_true_state(env_id: str, kept: tuple[int, int]) -> None:
    env = gym.make(env_id)
    reference = gym.make("CartPole-v1")  # independent: gymnasium's own env, same seed and actions
    obs, _ = env.reset(seed=3)
    ref_obs, _ = reference.reset(seed=3)
    rng = np.random.default_rng(0)
    for _ in range(200):
        assert obs.shape == (2,) and obs.dtype == np.float32
        np.testing.assert_array_equal(obs, ref_obs[list(kept)])
        np.testing.assert_array_equal(obs, np.asarray(env.unwrapped.state, np.float32)[list(kept)])
        action = int(rng.integers(2))
        obs, r, term, trunc, _ = env.step(action)
        ref_obs, ref_r, ref_term, ref_trunc, _ = reference.step(action)
        assert (r, term, trunc) == (ref_r, ref_term, ref_trunc)
        if term or trunc:
            obs, _ = env.reset()
            ref_obs, _ = reference.reset()


def test_spaces_and_spec() -> None:
    no_vel = gym.make("rlt/CartPoleNoVel-v0")
    full_high = gym.make("CartPole-v1").observation_space.high
    np.testing.assert_array_equal(no_vel.observation_space.high, full_high[[0, 2]])
    no_pos = gym.make("rlt/CartPoleNoPos-v0")
    assert np.all(np.isinf(no_pos.observation_space.high))
    for env in (no_vel, no_pos):
        assert env.spec.max_episode_steps == 500
        assert env.action_space == gym.spaces.Discrete(2)
    assert MASKS == {"velocity": (0, 2), "position": (1, 3)}


def _controller(est: np.ndarray) -> int:
    x, x_dot, theta, theta_dot = est
    return int(theta + 0.5 * theta_dot + 0.05 * x + 0.1 * x_dot > 0)


@pytest.mark.parametrize("env_id", ["rlt/CartPoleNoVel-v0", "rlt/CartPoleNoPos-v0"])
def test_memory_based_controller_reaches_the_500_step_limit(env_id: str) -> None:
    """With memory the hidden half is recoverable (differences / Euler integration, tau = 0.02)."""
    env = gym.make(env_id)
    tau = env.unwrapped.tau
    for seed in range(3):
        obs, _ = env.reset(seed=seed)
        prev, pos = obs.copy(), np.zeros(2)
        steps, done = 0, False
        while not done:
            if env_id.endswith("NoVel-v0"):
                vel = (obs - prev) / tau
                est = np.array([obs[0], vel[0], obs[1], vel[1]])
            else:
                est = np.array([pos[0], obs[0], pos[1], obs[1]])
                pos = pos + tau * obs  # CartPole's Euler step uses the pre-step velocity
            prev = obs
            obs, _, term, trunc, _ = env.step(_controller(est))
            steps += 1
            done = term or trunc
        assert steps == 500 and trunc and not term


def test_bad_mask_name_suggests() -> None:
    with pytest.raises(ValueError, match="did you mean 'velocity'"):
        make_masked_cartpole("velocty")
