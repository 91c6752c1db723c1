"""Training from Python in a few lines, PPO and DT alike, with one result type.

>>> from rl_transformers import train_ppo, load
>>> from rl_transformers.algos.ppo_config import TrainConfig
>>> result = train_ppo(TrainConfig(env_id="rlt/TMaze-v0", total_timesteps=100_000))
>>> agent = result.load()

These call the same trainers as ``scripts/train_gtrxl.py`` (:func:`rl_transformers.algos.ppo.train`) and
``scripts/train_dt.py`` (:func:`rl_transformers.algos.dt.train`); :class:`RunResult` keeps the trainer's own
result in ``details``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch


@dataclass
class RunResult:
    """What a training run ended with."""

    algo: Literal["ppo", "dt", "bc"]
    run_dir: Path | None
    """The run directory (None off rank 0 under torchrun)."""
    step: int
    """Environment steps (PPO) or gradient updates (DT / BC) done."""
    interrupted: bool
    """Ctrl-C (or a callback) stopped the run early; its last checkpoint is saved."""
    details: Any
    """The trainer's own result (``algos.ppo.TrainResult`` / ``algos.dt.TrainResult``)."""

    def load(self, device: str | torch.device = "cpu", **kwargs: Any) -> Any:
        """The trained agent (:func:`rl_transformers.load` on ``run_dir``)."""
        from rl_transformers.agents.load import load

        if self.run_dir is None:
            raise ValueError("this process wrote no run directory (rank > 0)")
        return load(self.run_dir, device, **kwargs)


def train_ppo(config: Any, run_dir: str | Path | None = None, **kwargs: Any) -> RunResult:
    """Train (or resume) a PPO run from a :class:`~rl_transformers.algos.ppo_config.TrainConfig`; an lstm / gru /
    mlp policy is first sized to the transformer's parameter count unless ``policy.match_params`` is off or
    ``policy.hidden_size`` is given (:func:`~rl_transformers.algos.ppo_sizing.match_run_config`)."""
    from rl_transformers.algos.ppo import train
    from rl_transformers.algos.ppo_sizing import match_run_config

    out = train(match_run_config(config), None if run_dir is None else Path(run_dir), **kwargs)
    return RunResult("ppo", out.run_dir, int(out.global_step), bool(out.stopped_early), out)


def train_dt(config: Any, run_dir: str | Path | None = None) -> RunResult:
    """Train (or resume) a Decision Transformer / BC run from a :class:`~rl_transformers.algos.dt_config.DTConfig`."""
    from rl_transformers.algos.dt import train

    out = train(config, None if run_dir is None else Path(run_dir))
    return RunResult(config.algo, out.run_dir, int(out.step), bool(out.interrupted), out)


__all__ = ["RunResult", "train_dt", "train_ppo"]
