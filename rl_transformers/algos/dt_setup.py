"""Set-up of a Decision Transformer / BC run from its data: evaluation env, time limits, return scale,
targets, evaluation seeds and the run's name (the decisions :class:`~rl_transformers.algos.dt.DTTrainer` makes
before it builds the model; each is a pure function of the config and the dataset)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from rl_transformers.algos.dt_config import DTConfig
from rl_transformers.utils.errors import UserError

__all__ = [
    "check_eval_seeds",
    "dataset_name",
    "default_return_scale",
    "default_targets",
    "env_factory",
    "episode_embedding_rows",
    "round_target",
    "target_label",
    "time_limit",
]


def episode_embedding_rows(given: int | None, longest_episode: int, env_limit: int | None) -> int:
    """Rows of the timestep embedding: ``given`` (``--max-ep-len``) or the longest of the dataset's episodes and
    the env's time limit. A ``given`` below the longest episode is refused: every later timestep would share the
    last row, so the model could not tell those steps apart (silently, before)."""
    if given is None:
        return max(longest_episode, env_limit or 0)
    if given < longest_episode:
        raise UserError(
            f"{given} is below the dataset's longest episode ({longest_episode} steps): its later "
            f"timesteps would share one embedding row; use --max-ep-len >= {longest_episode}, or leave it unset",
            source="--max-ep-len",
        )
    return given


def default_return_scale(returns: np.ndarray, env_name: str | None) -> float:
    """1/1000 for D4RL MuJoCo families (the paper's value), else 10^-floor(log10(max |return|)), at most 1."""
    from offline_data.scores import env_family

    if env_name and env_family(env_name) is not None:
        return 1e-3
    peak = float(np.max(np.abs(returns))) if len(returns) else 0.0
    if peak < 1.0:
        return 1.0
    return 10.0 ** (-math.floor(math.log10(peak)))


def target_label(target: float | None) -> str:
    """Tag suffix of a target: ``@3600`` (``%g`` format), empty for BC."""
    return "" if target is None else f"@{target:g}"


def round_target(x: float) -> float:
    """A target return rounded to 4 significant digits (readable tags)."""
    return float(f"{x:.4g}")


def default_targets(config: DTConfig, returns: np.ndarray) -> list[float | None]:
    """Evaluation targets, highest first: ``config.target_returns``, else the dataset's max and median episode
    return; ``[None]`` for BC (no return token)."""
    if config.algo != "dt":
        return [None]
    fallback = [round_target(float(returns.max())), round_target(float(np.median(returns)))]
    return list(dict.fromkeys(config.target_returns or fallback))


def dataset_name(config: DTConfig, info: Any) -> str:
    """The run directory's name component: the dataset id, else the file's stem / directory name."""
    if info.dataset_id:
        return str(info.dataset_id)
    path = Path(config.dataset)
    return path.stem if path.suffix in (".hdf5", ".h5") else path.name


def env_factory(config: DTConfig, info: Any) -> Callable[[], gym.Env] | None:
    """The evaluation env: ``config.env_id`` if given (registered ids and ``rlt/`` tasks, through
    :func:`~rl_transformers.algos.env_util.make_env_thunk`), else the dataset's eval / collection env, else
    None. Both go through :mod:`envs.resolve` with ``config.allow_env_modules`` (``--allow-env-modules``)."""
    if config.env_id is not None:
        from rl_transformers.algos.env_util import make_env_thunk

        return make_env_thunk(config.env_id, source="--env-id", allow_env_modules=config.allow_env_modules)
    if (info.eval_env_spec or info.env_spec) is not None:
        return info.make_env
    return None


def time_limit(make_env: Callable[[], gym.Env] | None) -> int | None:
    """The ``max_episode_steps`` of the env ``make_env`` builds (None: no env or no limit)."""
    if make_env is None:
        return None
    env = make_env()
    try:
        return env.spec.max_episode_steps if env.spec is not None else None
    finally:
        env.close()


def check_eval_seeds(episodes: Sequence[Any], config: DTConfig) -> None:
    """Refuse evaluation seeds that reset an episode of the dataset (when the dataset records seeds)."""
    if config.eval_episodes == 0:
        return
    used = {int(ep.seed) for ep in episodes if getattr(ep, "seed", None) is not None}
    eval_seeds = set(range(config.eval_seed, config.eval_seed + config.eval_episodes))
    clash = sorted(used & eval_seeds)
    if clash:
        raise UserError(
            f"evaluation seeds {config.eval_seed}..{config.eval_seed + config.eval_episodes - 1} include "
            f"{len(clash)} seed(s) used to collect the dataset (e.g. {clash[0]}); pick another --eval-seed, "
            f"e.g. {max(used) + 1}"
        )
