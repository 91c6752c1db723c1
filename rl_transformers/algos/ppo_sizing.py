"""``--match-params`` applied to a PPO run's config: the baseline core sized on the run's env spaces.

:func:`match_run_config` is what ``scripts/train_gtrxl.py`` and :func:`rl_transformers.train_ppo` call when a
run starts: it builds the run's env once and sizes the baseline with
:func:`~rl_transformers.policies.sizing.match_width` (a resumed run keeps its saved width). The chosen
``hidden_size`` is written into the config, so ``config.json`` says what was built.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

from rl_transformers.algos.env_util import make_env_thunk
from rl_transformers.algos.ppo_config import TrainConfig
from rl_transformers.policies.sizing import match_width
from rl_transformers.runs.checkpoint_load import latest_checkpoint, load_checkpoint
from rl_transformers.runs.resume import saved_config


def match_run_config(cfg: TrainConfig, echo: Callable[[str], Any] | None = print) -> TrainConfig:
    """A fresh PPO run's config with ``--match-params`` applied on its env's spaces; prints both counts (rank 0
    only under torchrun). A resumed run (``cfg.resume``) is never sized again: an unset ``hidden_size`` takes
    the saved run's, so the config of the fresh run resumes it unchanged (and runs saved before this option
    keep their width)."""
    if cfg.policy.kind == "transformer" or not cfg.policy.match_params or cfg.policy.hidden_size is not None:
        return cfg
    if cfg.resume is not None:
        return _with_saved_width(cfg)
    env = make_env_thunk(cfg.env_id, cfg.env_kwargs, allow_env_modules=cfg.allow_env_modules)()
    try:
        policy, sizing = match_width(cfg.policy, env.observation_space, env.action_space)
    finally:
        env.close()
    if sizing is not None and echo is not None and os.environ.get("RANK", "0") == "0":
        echo(sizing.text())
    return dataclasses.replace(cfg, policy=policy)


def _with_saved_width(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with the hidden_size saved in the checkpoint it resumes (unchanged when there is none to read:
    the trainer then reports the missing or foreign checkpoint itself)."""
    path = latest_checkpoint(cfg.resume) if cfg.resume is not None else None
    if path is None:
        return cfg
    saved = saved_config(type(cfg), load_checkpoint(path), path)
    if saved.policy.kind != cfg.policy.kind:
        return cfg
    return dataclasses.replace(
        cfg, policy=dataclasses.replace(cfg.policy, hidden_size=saved.policy.hidden_size)
    )
