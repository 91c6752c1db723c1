"""Datasets against their environments: safe env specs from files, and the data checked against the env's spaces.

Env specs stored in a file (Minari ``metadata.json``, the ``env_spec`` / ``env_id`` metadata of a D4RL-format
file) go through :func:`envs.resolve.resolve_env`: a spec that would import a module outside the allow-list
raises :class:`~offline_data.errors.DatasetError` naming the file; an id that is not registered here leaves the
spec unknown (the episodes stay usable). A Minari directory is checked *before* Minari opens it, because
``minari.MinariDataset`` ``gym.make``s the stored spec when the metadata lacks a space.

:func:`conform_to_env` takes the observation and action spaces from the env when it can be built (Box bounds
of the env, not of the data: Pendulum's ±2, not the data's ±1.999; a CartPole dataset stored with float 0/1
actions becomes ``Discrete(2)``) and checks every episode against them: integral float-coded discrete
actions are converted to int64, other values (non-integral, out of range, outside Box bounds) and
observation-shape mismatches raise :class:`DatasetError` naming the episode, step and value.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import EnvSpec

from offline_data.episode import DatasetInfo, Episode, check_episode_limit
from offline_data.errors import DatasetError

__all__ = ["checked_minari_metadata", "conform_to_env", "env_spaces", "file_env_spec"]

_MAX_SHOWN = 5


def file_env_spec(value: Any, where: str, allow_env_modules: Sequence[str] = ()) -> EnvSpec | None:
    """The validated spec a file stores (JSON text / dict / id), None when absent, unknown here or malformed.

    Raises :class:`DatasetError` naming ``where`` when the spec names code outside the allowed modules.
    """
    from envs.resolve import EnvRefusedError, EnvResolutionError, resolve_env

    if value is None or value == "":
        return None
    if not isinstance(value, str | dict):
        return None
    try:
        spec = resolve_env(value, source=where, allow_modules=allow_env_modules)
    except EnvRefusedError as err:
        raise DatasetError(str(err)) from None
    except EnvResolutionError:  # unknown id / written by another gymnasium: the episodes are still usable
        return None
    check_episode_limit(spec, where)
    return spec


def checked_minari_metadata(
    data_path: Path, where: str, allow_env_modules: Sequence[str] = ()
) -> tuple[dict[str, Any], EnvSpec | None, EnvSpec | None]:
    """(metadata, env spec, eval env spec) of a Minari ``data/`` directory, validated before Minari reads it."""
    from rl_transformers.utils.atomic import TEMP_PREFIX

    unfinished = [part for part in data_path.resolve().parts if part.startswith(TEMP_PREFIX)]
    if unfinished:
        raise DatasetError(
            f"{where} lies in {unfinished[0]!r}, the temporary directory of a dataset build that has not "
            "finished (or was killed); use the finished dataset, or rebuild (the builder removes leftovers)"
        )
    meta_path = data_path / "metadata.json"
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise DatasetError(f"{where}: cannot read {meta_path} as JSON ({err})") from None
    if not isinstance(meta, dict):
        raise DatasetError(f"{where}: {meta_path} must hold a JSON object, got {type(meta).__name__}")
    env_spec = file_env_spec(meta.get("env_spec"), f"{meta_path} (env_spec)", allow_env_modules)
    eval_spec = file_env_spec(meta.get("eval_env_spec"), f"{meta_path} (eval_env_spec)", allow_env_modules)
    missing = [key for key in ("observation_space", "action_space") if not isinstance(meta.get(key), str)]
    if missing:
        raise DatasetError(
            f"{where}: {meta_path} lacks {missing}; Minari would build the stored env to find them, which this "
            "reader does not do for files. Rewrite the dataset with its spaces stored."
        )
    if not (data_path / "main_data.hdf5").is_file():
        raise DatasetError(f"{where}: {data_path / 'main_data.hdf5'} is missing")
    return meta, env_spec, eval_spec


def env_spaces(
    spec: EnvSpec, where: str, allow_env_modules: Sequence[str] = ()
) -> tuple[gym.spaces.Space, gym.spaces.Space] | None:
    """(observation space, action space) of the env of ``spec``; None when it cannot be built here."""
    from envs.resolve import EnvRefusedError, make_env

    try:
        env = make_env(spec, source=where, allow_modules=allow_env_modules)
    except EnvRefusedError as err:
        raise DatasetError(str(err)) from None
    except Exception:  # e.g. DependencyNotInstalled (MuJoCo without `mujoco`): keep the data's spaces
        return None
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


def _shown(rows: list[tuple[int, int, Any]]) -> str:
    text = ", ".join(f"episode {e} step {s}: {v!r}" for e, s, v in rows[:_MAX_SHOWN])
    return text + (" ..." if len(rows) > _MAX_SHOWN else "")


def _offending(episodes: Sequence[Episode], bad_of: Any) -> list[tuple[int, int, Any]]:
    rows: list[tuple[int, int, Any]] = []
    for e, ep in enumerate(episodes):
        bad = bad_of(ep.actions)
        for s in np.flatnonzero(bad.reshape(len(bad), -1).any(axis=1))[: _MAX_SHOWN - len(rows) + 1]:
            value = ep.actions[s]
            rows.append((e, int(s), value.tolist() if isinstance(value, np.ndarray) else value.item()))
        if len(rows) > _MAX_SHOWN:
            break
    return rows


def _discrete_actions(episodes: Sequence[Episode], space: gym.spaces.Discrete, where: str) -> list[Episode]:
    lo, hi = int(space.start), int(space.start) + int(space.n) - 1
    out = []
    for e, ep in enumerate(episodes):
        actions = ep.actions
        if actions.ndim == 2 and actions.shape[1] == 1:
            actions = actions[:, 0]
        if actions.ndim != 1:
            raise DatasetError(
                f"{where}: episode {e} has actions of shape {ep.actions.shape}; the env's {space} needs one "
                "integer per step"
            )
        if np.issubdtype(actions.dtype, np.floating):
            rows = _offending(episodes, lambda a: np.asarray(a) != np.round(np.asarray(a)))
            if rows:
                raise DatasetError(
                    f"{where}: the env's action space is {space} but the data holds non-integral actions "
                    f"({_shown(rows)})"
                )
            actions = actions.astype(np.int64)
        out.append(dataclasses.replace(ep, actions=actions))
    rows = _offending(out, lambda a: (a < lo) | (a > hi))
    if rows:
        raise DatasetError(f"{where}: actions outside the env's {space} (valid {lo}..{hi}): {_shown(rows)}")
    return out


def _box_actions(episodes: Sequence[Episode], space: gym.spaces.Box, where: str) -> list[Episode]:
    out = []
    for e, ep in enumerate(episodes):
        actions = ep.actions.reshape(len(ep.actions), -1) if ep.actions.ndim == 1 else ep.actions
        if actions.shape[1:] != space.shape:
            raise DatasetError(
                f"{where}: episode {e} has actions of shape {ep.actions.shape[1:]} per step; the env's action "
                f"space {space} has shape {space.shape}"
            )
        if not np.issubdtype(actions.dtype, np.floating):
            actions = actions.astype(space.dtype if np.issubdtype(space.dtype, np.floating) else np.float32)
        out.append(dataclasses.replace(ep, actions=actions))
    low, high = space.low.astype(np.float64), space.high.astype(np.float64)
    tol_lo, tol_hi = 1e-6 * np.maximum(1.0, np.abs(low)), 1e-6 * np.maximum(1.0, np.abs(high))
    rows = _offending(out, lambda a: (a < low - tol_lo) | (a > high + tol_hi))
    if rows:
        raise DatasetError(
            f"{where}: actions outside the env's bounds [{space.low.tolist()}, {space.high.tolist()}]: {_shown(rows)}"
        )
    return out


def conform_to_env(
    episodes: Sequence[Episode],
    info: DatasetInfo,
    obs_space: gym.spaces.Space,
    act_space: gym.spaces.Space,
    env_name: str,
) -> tuple[list[Episode], DatasetInfo]:
    """Episodes and info with the env's spaces, after checking the data against them (module docstring)."""
    where = f"dataset {info.source!r} against env {env_name!r}"
    flat_obs = obs_space
    if isinstance(obs_space, gym.spaces.Dict) and all(
        isinstance(s, gym.spaces.Box) for s in obs_space.spaces.values()
    ):
        flat_obs = gym.spaces.flatten_space(obs_space)
    if isinstance(flat_obs, gym.spaces.Box):
        for e, ep in enumerate(episodes):
            if ep.observations.shape[1:] != flat_obs.shape:
                raise DatasetError(
                    f"{where}: episode {e} has observations of shape {ep.observations.shape[1:]}; the env's "
                    f"observation space {obs_space} has shape {flat_obs.shape}"
                )
        # the env's bounds and shape; the data's dtype (float64 MuJoCo data stays float64)
        dtype = info.observation_space.dtype if isinstance(info.observation_space, gym.spaces.Box) else None
        new_obs: gym.spaces.Space = flat_obs
        if dtype is not None and np.issubdtype(dtype, np.floating) and dtype != flat_obs.dtype:
            new_obs = gym.spaces.Box(flat_obs.low.astype(dtype), flat_obs.high.astype(dtype), dtype=dtype)
    elif isinstance(obs_space, gym.spaces.Discrete) and info.observation_space == obs_space:
        new_obs = obs_space
    else:
        raise DatasetError(
            f"{where}: the env's observation space {obs_space} is not supported (Box or Dict of Box)"
        )
    if isinstance(act_space, gym.spaces.Discrete):
        episodes = _discrete_actions(episodes, act_space, where)
    elif isinstance(act_space, gym.spaces.Box):
        episodes = _box_actions(episodes, act_space, where)
    else:
        raise DatasetError(f"{where}: the env's action space {act_space} is not supported (Box or Discrete)")
    checked = dict(info.metadata, spaces_from=f"env {env_name}")
    return list(episodes), dataclasses.replace(
        info, observation_space=new_obs, action_space=act_space, metadata=checked
    )
