"""Training algorithms: PPO for memory policies (online); the Decision Transformer trainer lives beside it.

from rl_transformers.algos import PPOConfig, TrainConfig, train
"""

from rl_transformers.algos.ppo import PPOConfig, PPOTrainer, TrainConfig, TrainResult, train
from rl_transformers.algos.rollout import RolloutStorage, compute_gae, evaluate_policy, make_vec_env

__all__ = [
    "PPOConfig",
    "PPOTrainer",
    "RolloutStorage",
    "TrainConfig",
    "TrainResult",
    "compute_gae",
    "evaluate_policy",
    "make_vec_env",
    "train",
]
