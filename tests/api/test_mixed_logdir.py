"""`tensorboard --logdir runs` with a PPO run and a DT run side by side: TensorBoard's own HParams backend shows
both algorithms' hyper-parameters and metrics."""

from __future__ import annotations

from tests.test_logging import tensorboard_experiment


def test_hparams_of_a_mixed_logdir_show_each_algorithm(runs_root, ppo_run, dt_run) -> None:
    assert ppo_run.run_dir.parent.parent.parent == dt_run.run_dir.parent.parent.parent == runs_root
    names, metrics = tensorboard_experiment(runs_root)
    assert {"ppo.learning_rate", "env_id"} <= set(names)  # PPO columns
    assert {"dataset", "context_len"} <= set(names)  # DT columns
    assert {"rollout/ep_rew_mean", "eval/mean_reward"} <= set(metrics)  # PPO metrics
    assert {"eval/return_mean", "train/action_loss"} <= set(metrics)  # DT metrics
