"""Training algorithms: PPO for memory policies (online); the Decision Transformer trainer lives beside it.

from rl_transformers.algos import PPOConfig, TrainConfig, train

Names are imported lazily (PEP 562), so ``from rl_transformers.algos.dt import ...`` does not import PPO.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "PPOConfig": "ppo_config",
    "PPOTrainer": "ppo",
    "TrainConfig": "ppo_config",
    "TrainResult": "ppo",
    "train": "ppo",
    "RolloutStorage": "storage",
    "compute_gae": "storage",
    "evaluate_policy": "evaluation",
    "make_vec_env": "env_util",
}

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

if TYPE_CHECKING:
    from rl_transformers.algos.env_util import make_vec_env
    from rl_transformers.algos.evaluation import evaluate_policy
    from rl_transformers.algos.ppo import PPOTrainer, TrainResult, train
    from rl_transformers.algos.ppo_config import PPOConfig, TrainConfig
    from rl_transformers.algos.storage import RolloutStorage, compute_gae


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
