"""rl_transformers.load on a DT run: the stateful wrapper, stepped one env at a time or batched on a vector
env, reproduces the trainer's batched evaluation (the episodes it logged in eval/step_<n>.json)."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import rl_transformers as rlt
from rl_transformers.agents import DecisionTransformerAgent
from rl_transformers.utils.errors import UserError


def logged_episodes(run_dir) -> dict:
    evals = sorted((run_dir / "eval").glob("step_*.json"))
    data = json.loads(evals[-1].read_text())
    return {e["target"]: e for e in data["episodes"]}


def test_load_gives_a_dt_agent_with_the_runs_targets(dt_run) -> None:
    agent = rlt.load(dt_run.run_dir)
    assert isinstance(agent, DecisionTransformerAgent) and agent.step == dt_run.step == 6
    assert agent.default_targets() == [40.0, 10.0] and agent.env_id == "CartPole-v1"


@pytest.mark.parametrize("target", [40.0, 10.0])
def test_wrapper_step_by_step_equals_the_trainers_evaluation(dt_run, target: float) -> None:
    agent = rlt.load(dt_run.run_dir)
    cfg = agent.config
    make_env = agent.make_env_factory()
    wrapper = agent.as_stateful_wrapper(target_return=target)
    returns, lengths = [], []
    for i in range(cfg.eval_episodes):
        env = make_env()
        obs, _ = env.reset(seed=cfg.eval_seed + i)
        wrapper.reset()
        reward, done, total, n = 0.0, False, 0.0, 0
        while not done:
            action = wrapper.predict(obs, reward)
            assert np.ndim(action) == 0
            obs, reward, terminated, truncated, _ = env.step(action)
            done = terminated or truncated
            total, n = total + reward, n + 1
        env.close()
        returns.append(total)
        lengths.append(n)
    logged = logged_episodes(dt_run.run_dir)[target]
    assert returns == pytest.approx(logged["returns"]) and lengths == logged["lengths"]


def test_batched_wrapper_on_a_vector_env_equals_the_trainers_evaluation(dt_run) -> None:
    agent = rlt.load(dt_run.run_dir)
    cfg, n = agent.config, agent.config.eval_episodes
    envs = gym.vector.SyncVectorEnv([agent.make_env_factory()] * n, autoreset_mode=AutoresetMode.SAME_STEP)
    wrapper = agent.as_stateful_wrapper(target_return=40.0, num_envs=n)
    obs, _ = envs.reset(seed=cfg.eval_seed)  # env i: seed eval_seed + i, as the trainer's episode i
    rewards, starts = np.zeros(n), np.ones(n, dtype=bool)
    totals, first = np.zeros(n), np.full(n, np.nan)
    while np.isnan(first).any():
        actions = wrapper.predict(obs, rewards, episode_start=starts)
        obs, rewards, terminated, truncated, _ = envs.step(actions)
        totals += rewards
        starts = terminated | truncated
        for i in np.flatnonzero(starts & np.isnan(first)):
            first[i] = totals[i]
        totals[starts] = 0.0
    envs.close()
    assert first.tolist() == pytest.approx(logged_episodes(dt_run.run_dir)[40.0]["returns"])


def test_wrapper_refuses_bad_shapes_and_missing_targets(dt_run) -> None:
    agent = rlt.load(dt_run.run_dir)
    with pytest.raises(UserError, match="target_return"):
        agent.as_stateful_wrapper()
    wrapper = agent.as_stateful_wrapper(40.0, num_envs=2)
    with pytest.raises(UserError, match=r"\(2, 4\)"):
        wrapper.predict(np.zeros(4, np.float32))
