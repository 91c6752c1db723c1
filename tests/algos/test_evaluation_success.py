"""PPO evaluation reports success where the env does (SB3's ``is_success``, or ``success``: the T-Maze): per
episode from the finished episode's ``final_info`` of the SAME_STEP vector env, ``eval/success_rate`` logged
by the trainer, and ``success`` in the encoder study's run records. The T-Maze gives an independent check: an
episode succeeds exactly when it earns the goal reward (return 1; a failed one ends at 0 or below)."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

import envs  # noqa: F401  (registers rlt/ ids)
from rl_transformers import tags as T
from rl_transformers.algos.evaluation import evaluate_episodes, evaluate_policy, final_success
from rl_transformers.algos.ppo import PPOTrainer
from rl_transformers.policies import PolicyConfig, gtrxl_backbone, make_policy
from rl_transformers.study.worker import success_fields
from tests.algos.test_ppo import tiny


def policy_for(env_id: str):  # type: ignore[no-untyped-def]
    env = gym.make(env_id)
    torch.manual_seed(0)
    policy = make_policy(
        PolicyConfig(backbone=gtrxl_backbone(16, 1, 2, mem_len=8)), env.observation_space, env.action_space
    )
    env.close()
    return policy


def test_success_flags_follow_the_goal_reward_on_the_tmaze() -> None:
    policy = policy_for("rlt/TMazeShort-v0")
    with torch.no_grad():  # east or north, half and half: a corridor of 1 is then won 1 time in 8
        policy.actor.linear.weight.zero_()
        policy.actor.linear.bias.copy_(torch.tensor([5.0, 5.0, -10.0, -10.0]))
    maze = {"corridor_length": 1}
    torch.manual_seed(1)
    stats = evaluate_episodes(policy, "rlt/TMaze-v0", maze, 48, seed=5, seq_len=4, deterministic=False)
    assert stats.successes is not None and stats.successes.shape == stats.returns.shape
    np.testing.assert_array_equal(stats.successes, (stats.returns > 0.5).astype(float))
    assert 0 < stats.successes.sum() < 48  # both outcomes occur, so the check can fail
    assert stats.success_rate == float(stats.successes.mean())
    torch.manual_seed(1)  # the SB3-style tuple is the same episodes' returns and lengths
    returns, lengths = evaluate_policy(
        policy, "rlt/TMaze-v0", maze, 48, seed=5, seq_len=4, deterministic=False
    )
    np.testing.assert_array_equal(returns, stats.returns)
    np.testing.assert_array_equal(lengths, stats.lengths)


def test_envs_without_a_success_report_have_none() -> None:
    stats = evaluate_episodes(policy_for("CartPole-v1"), "CartPole-v1", None, 2, seed=0, seq_len=4)
    assert stats.successes is None and stats.success_rate is None


def test_final_success_reads_the_finished_episodes_info() -> None:
    infos = {
        "final_info": {
            "success": np.array([True, False, True]),
            "_success": np.array([True, True, False]),
            "is_success": np.array([False, True, False]),
            "_is_success": np.array([True, False, False]),
        }
    }
    assert final_success(infos, 0) == 0.0  # SB3's key first where the env set it
    assert final_success(infos, 1) == 0.0  # else "success"
    assert np.isnan(final_success(infos, 2))  # neither set for this env
    assert np.isnan(final_success({}, 0))  # no episode finished


def test_ppo_logs_the_success_rate_and_the_study_records_it(tmp_path: Path) -> None:
    trainer = PPOTrainer(tiny(tmp_path, eval_episodes=8), device=torch.device("cpu"))
    try:
        stats = trainer.evaluate_episodes(8)  # seeded from the run and the step: the same episodes again
        values, _ = trainer._evaluation()
    finally:
        trainer.close()
    assert values[T.EVAL_SUCCESS_RATE] == float((stats.returns > 0.5).mean())
    run = tmp_path / "run"
    run.mkdir()
    rows = [
        {"step": 64, T.EVAL_SUCCESS_RATE: 0.25},
        {"step": 96, "loss": 1.0},
        {"step": 128, T.EVAL_SUCCESS_RATE: 0.5},
    ]
    (run / "progress.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert success_fields(run) == {"success": 0.5, "success_curve": [[64.0, 0.25], [128.0, 0.5]]}
    (run / "progress.jsonl").write_text(json.dumps({"step": 64, T.EVAL_MEAN_REWARD: 1.0}) + "\n")
    assert success_fields(run) == {}
