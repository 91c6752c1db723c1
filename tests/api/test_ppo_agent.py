"""rl_transformers.load on a PPO run: sb3-contrib's RecurrentPPO.predict contract, checked with SB3's own
evaluate_policy against the trainer's logged evaluation and the trainer's evaluation loop."""

from __future__ import annotations

import json
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy

import envs  # noqa: F401  (registers the rlt/ ids)
import rl_transformers as rlt
from rl_transformers.agents import PolicyState, PPOAgent
from rl_transformers.utils.errors import UserError
from tests.api.conftest import PPO_ENV


class FirstResetSeed(gym.Wrapper):
    """Seed the first reset (SB3 wraps a single env in a DummyVecEnv that resets it without a seed)."""

    def __init__(self, env: gym.Env, seed: int) -> None:
        super().__init__(env)
        self._seed: int | None = seed

    def reset(self, *, seed=None, options=None):
        seed, self._seed = (self._seed if seed is None else seed), None
        return self.env.reset(seed=seed, options=options)


def logged_eval(run_dir) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]
    return {r["step"]: r["eval/mean_reward"] for r in rows if "eval/mean_reward" in r}


def test_load_gives_a_ppo_agent_with_the_runs_normalisation(ppo_run) -> None:
    agent = rlt.load(ppo_run.run_dir)
    assert isinstance(agent, PPOAgent) and agent.env_id == PPO_ENV and agent.step == ppo_run.step
    norm = agent.policy.obs_norm
    assert norm is not None and float(norm.count) > 100  # statistics of the run's rollouts, not the init
    assert isinstance(rlt.load(ppo_run.run_dir / "checkpoints" / "last.pt"), PPOAgent)


def test_predict_single_and_batched_match_the_policy(ppo_run) -> None:
    agent = rlt.load(ppo_run.run_dir)
    obs = np.random.default_rng(0).normal(size=(3, 2)).astype(np.float32) * 3
    actions, state = agent.predict(obs, deterministic=True)
    assert actions.shape == (3,) and isinstance(state, PolicyState)
    # reference: the policy's own act() on tensors, normalisation included, fresh episodes
    with torch.no_grad():
        ref = agent.policy.act(
            torch.as_tensor(obs), agent.policy.initial_state(3), torch.ones(3, dtype=torch.bool), True
        )
    np.testing.assert_array_equal(actions, ref.action.numpy())
    single, state1 = agent.predict(obs[0], deterministic=True)
    assert np.ndim(single) == 0 and int(single) == int(actions[0])
    more, _ = agent.predict(obs, state, episode_start=np.array([True, False, False]), deterministic=True)
    assert more.shape == (3,)
    with pytest.raises(UserError, match=r"shape \(3, 5\)"):
        agent.predict(np.zeros((3, 5), np.float32))
    with pytest.raises(UserError, match="holds 1 envs"):
        agent.predict(obs, state1)


def test_sb3_evaluate_policy_matches_the_trainers_logged_evaluation(ppo_run) -> None:
    agent = rlt.load(ppo_run.run_dir)
    cfg = agent.config
    seed = agent.trainer_eval_seed()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        vec = make_vec_env(PPO_ENV, n_envs=cfg.eval_episodes, seed=seed)
        rewards, _ = evaluate_policy(agent, vec, n_eval_episodes=cfg.eval_episodes, deterministic=True,
                                     return_episode_rewards=True)  # fmt: skip
    logged = logged_eval(ppo_run.run_dir)[ppo_run.step]
    assert np.mean(rewards) == pytest.approx(logged, abs=1e-9)
    returns, _ = agent.evaluate(cfg.eval_episodes, seed=seed)
    assert sorted(rewards) == sorted(returns.tolist())


def test_sb3_evaluate_policy_on_a_single_env_matches_the_trainers_loop(ppo_run) -> None:
    agent = rlt.load(ppo_run.run_dir)
    env = FirstResetSeed(agent.make_env(), seed=77)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mean, _ = evaluate_policy(agent, env, n_eval_episodes=3, deterministic=True)
    returns, _ = agent.evaluate(3, seed=77, num_envs=1)
    assert mean == pytest.approx(float(returns.mean()), abs=1e-9)


def test_stochastic_predict_follows_the_trainers_loop_draw_for_draw(ppo_run) -> None:
    # Sampled actions make varied episodes; equal torch seeds give equal draws only if predict carries the
    # memory, resets it at episode starts and samples the same distributions as the trainer's loop.
    agent = rlt.load(ppo_run.run_dir)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        vec = make_vec_env(PPO_ENV, n_envs=3, seed=11)
        torch.manual_seed(0)
        rewards, _ = evaluate_policy(agent, vec, n_eval_episodes=6, deterministic=False,
                                           return_episode_rewards=True)  # fmt: skip
    torch.manual_seed(0)
    returns, _ = agent.evaluate(6, seed=11, deterministic=False, num_envs=3)
    assert len(set(rewards)) > 2
    assert sorted(rewards) == sorted(returns.tolist())


def test_predict_carries_memory_like_the_trainers_loop() -> None:
    # A random LSTM policy with large weights: its actions depend strongly on the past, so dropping or
    # mis-resetting the state would change the sampled episodes.
    from rl_transformers.algos.ppo_config import TrainConfig
    from rl_transformers.policies.gtrxl import PolicyConfig, make_policy

    cfg = TrainConfig(env_id=PPO_ENV, policy=PolicyConfig(kind="lstm", hidden_size=16))
    env = gym.make(PPO_ENV)
    torch.manual_seed(1)
    policy = make_policy(cfg.policy, env.observation_space, env.action_space)
    with torch.no_grad():
        for p in policy.core.parameters():
            p.mul_(4.0)
    agent = PPOAgent(policy, cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        vec = make_vec_env(PPO_ENV, n_envs=2, seed=3)
        torch.manual_seed(0)
        rewards, _ = evaluate_policy(agent, vec, n_eval_episodes=6, deterministic=False,
                                     return_episode_rewards=True)  # fmt: skip
    torch.manual_seed(0)
    returns, _ = agent.evaluate(6, seed=3, deterministic=False, num_envs=2)
    assert sorted(rewards) == sorted(returns.tolist())
