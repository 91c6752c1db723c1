"""Training from Python in a few lines, PPO and DT alike, with one result type.

>>> import rl_transformers as rlt
>>> from rl_transformers.algos.ppo_config import TrainConfig
>>> result = rlt.train_ppo(TrainConfig(env_id="rlt/TMaze-v0", total_timesteps=100_000))
>>> agent = rlt.load(result.run_dir)

These call the same trainers as ``scripts/train_gtrxl.py`` (:func:`rl_transformers.algos.ppo.train`) and
``scripts/train_dt.py`` (:func:`rl_transformers.algos.dt.train`) and return what they return, a
:class:`~rl_transformers.runs.lifecycle.RunResult`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rl_transformers.runs.lifecycle import RunResult


def train_ppo(config: Any, run_dir: str | Path | None = None, **kwargs: Any) -> RunResult:
    """Train (or resume) a PPO run from a :class:`~rl_transformers.algos.ppo_config.TrainConfig`; an lstm / gru /
    mlp policy is first sized to the transformer's parameter count unless ``policy.match_params`` is off or
    ``policy.hidden_size`` is given (:func:`~rl_transformers.algos.ppo_sizing.match_run_config`)."""
    from rl_transformers.algos.ppo import train
    from rl_transformers.algos.ppo_sizing import match_run_config

    return train(match_run_config(config), None if run_dir is None else Path(run_dir), **kwargs)


def train_dt(config: Any, run_dir: str | Path | None = None) -> RunResult:
    """Train (or resume) a Decision Transformer / BC run from a :class:`~rl_transformers.algos.dt_config.DTConfig`."""
    from rl_transformers.algos.dt import train

    return train(config, None if run_dir is None else Path(run_dir))


__all__ = ["train_dt", "train_ppo"]
