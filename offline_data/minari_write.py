"""Write Minari datasets (minari 0.5) from lists of `Episode`, without jax or a DataCollector.

Writing goes through `minari.create_dataset_from_buffers` with one `EpisodeBuffer` per episode, then checks
that the reference scores and env specs really landed in metadata.json: Minari silently drops the references
when it is given neither `env` nor `eval_env`, and it cannot `gym.make` an env whose extra is not installed
(MuJoCo), so missing keys are written afterwards. The dataset is built under a hidden directory of the root
and renamed into place when complete. Reading, dataset ids and the datasets root live in
`offline_data.minari_io`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import EnvSpec

from offline_data.episode import Episode
from offline_data.errors import DatasetError, DatasetExistsError
from offline_data.minari_io import check_action_space, dataset_path, minari_root, validate_dataset_id
from rl_transformers.utils.atomic import clean_stale, new_temp_dir, replace_dir
from rl_transformers.utils.extras import need

__all__ = [
    "check_free_space",
    "check_writable",
    "env_makeable",
    "infer_spaces",
    "write_minari_dataset",
]


def _next_free_id(dataset_id: str) -> str:
    need("minari", "writing a Minari dataset")
    from minari.dataset.minari_dataset import gen_dataset_id, parse_dataset_id
    from minari.storage.datasets_root_dir import get_dataset_path

    namespace, name, version = parse_dataset_id(dataset_id)
    while True:
        version += 1
        candidate = gen_dataset_id(namespace, name, version)
        if not get_dataset_path(candidate).exists():
            return candidate


def check_writable(
    dataset_id: str, root: str | os.PathLike[str] | None = None, overwrite: bool = False
) -> None:
    """Raise `DatasetExistsError` (a `FileExistsError`) if the id exists under `root` and `overwrite` is False
    (no side effects)."""
    path = dataset_path(dataset_id, root)
    if path.exists() and not overwrite:
        with minari_root(root):
            free = _next_free_id(dataset_id)
        raise DatasetExistsError(
            f"Minari dataset {dataset_id!r} already exists at {path}; pass overwrite=True (CLI: --overwrite) "
            f"to replace it, or use a new version such as {free!r}"
        )


def infer_spaces(episodes: Sequence[Episode]) -> tuple[gym.spaces.Box, gym.spaces.Space]:
    """Observation / action spaces implied by the data when no env says otherwise.

    Observations: unbounded Box of the stored shape and dtype. Integer actions: Discrete(max + 1).
    Float actions: Box on [-1, 1] when every action lies there (the D4RL convention), else on the
    per-dimension data range.
    """
    if not episodes:
        raise ValueError("cannot infer spaces from an empty list of episodes")
    first = episodes[0]
    obs_dtype = (
        first.observations.dtype if np.issubdtype(first.observations.dtype, np.floating) else np.float32
    )
    obs_space = gym.spaces.Box(-np.inf, np.inf, shape=first.observations.shape[1:], dtype=obs_dtype)
    actions = np.concatenate([ep.actions for ep in episodes], axis=0)
    if np.issubdtype(actions.dtype, np.integer):
        if actions.ndim != 1 or actions.min() < 0:
            raise ValueError(
                f"integer actions must be 1-D and >= 0 to form a Discrete space, got shape {actions.shape} "
                f"and minimum {actions.min()}"
            )
        return obs_space, gym.spaces.Discrete(int(actions.max()) + 1)
    low, high = actions.min(axis=0), actions.max(axis=0)
    if low.min() >= -1.0 and high.max() <= 1.0:
        low, high = np.full_like(low, -1.0), np.full_like(high, 1.0)
    return obs_space, gym.spaces.Box(low, high, dtype=actions.dtype)


def _as_spec(env: str | EnvSpec | gym.Env | None, allow_env_modules: Sequence[str] = ()) -> EnvSpec | None:
    from envs.resolve import resolve_env

    if isinstance(env, gym.Env):
        env = env.spec
    if env is None:
        return None
    return resolve_env(env, source="the env given to write_minari_dataset", allow_modules=allow_env_modules)


def env_makeable(spec: EnvSpec) -> bool:
    """Whether ``spec`` builds here (its dependencies installed), so its spaces can be read from the env."""
    try:
        gym.make(spec).close()
    except Exception:  # e.g. gymnasium.error.DependencyNotInstalled for MuJoCo without `mujoco`
        return False
    return True


def _to_buffer(episode: Episode, obs_space: gym.spaces.Space, act_space: gym.spaces.Space) -> Any:
    need("minari", "writing a Minari dataset")
    from minari.data_collector.episode_buffer import EpisodeBuffer

    observations = episode.all_observations
    if isinstance(obs_space, gym.spaces.Box):
        observations = observations.astype(obs_space.dtype, copy=False)
    if isinstance(act_space, gym.spaces.Discrete):
        actions = episode.actions.astype(np.int64)
    else:
        actions = episode.actions.astype(act_space.dtype, copy=False)
    return EpisodeBuffer(
        seed=episode.seed,
        observations=observations,
        actions=actions,
        rewards=episode.rewards,
        terminations=episode.terminations,
        truncations=episode.truncations,
    )


def check_free_space(directory: Path, episodes: Sequence[Episode], dataset_id: str) -> None:
    """Refuse to start writing when the disk cannot hold the episodes (h5py fails badly on a full disk: it can
    crash the process). The estimate is twice the arrays' bytes plus 1 MiB (HDF5 overhead, metadata)."""
    need = 1 << 20
    for episode in episodes:
        for value in vars(episode).values():
            need += 2 * int(getattr(value, "nbytes", 0))
    free = shutil.disk_usage(directory).free
    if free < need:
        raise DatasetError(
            f"no space left on device for Minari dataset {dataset_id!r}: it needs about {need / 2**20:.1f} MiB, "
            f"{free / 2**20:.1f} MiB are free under {directory.parent}; free space or choose another --root"
        )


def write_minari_dataset(
    dataset_id: str,
    episodes: Sequence[Episode],
    *,
    env: str | EnvSpec | gym.Env | None = None,
    eval_env: str | EnvSpec | gym.Env | None = None,
    observation_space: gym.spaces.Space | None = None,
    action_space: gym.spaces.Space | None = None,
    ref_min_score: float | None = None,
    ref_max_score: float | None = None,
    algorithm_name: str | None = None,
    author: str | None = None,
    author_email: str | None = None,
    code_permalink: str | None = None,
    description: str | None = None,
    extra_metadata: dict[str, Any] | None = None,
    root: str | os.PathLike[str] | None = None,
    overwrite: bool = False,
    allow_env_modules: Sequence[str] = (),
) -> Path:
    """Write `episodes` as Minari dataset `dataset_id` under `root`; returns its directory.

    `env` is the collection env (id, spec or instance; its spec and spaces are stored), `eval_env` the
    evaluation env (defaults to `env`). Spaces default to the env's, else `infer_spaces`. Reference scores
    must be given together; they are verified in metadata.json after writing. An existing id raises
    `FileExistsError` unless `overwrite`. The dataset is built under a hidden directory of the root and
    renamed into place when complete (`rl_transformers.utils.atomic`): an interrupted write leaves nothing Minari
    lists or `read_minari` loads, and `overwrite` keeps the old dataset until the new one is complete.
    """
    validate_dataset_id(dataset_id)
    if not episodes:
        raise ValueError(f"no episodes to write to Minari dataset {dataset_id!r}")
    if (ref_min_score is None) != (ref_max_score is None):
        raise ValueError(
            f"give both reference scores or neither, got ref_min_score={ref_min_score!r}, "
            f"ref_max_score={ref_max_score!r}"
        )
    env_spec = _as_spec(env, allow_env_modules)
    eval_spec = _as_spec(eval_env, allow_env_modules) or env_spec
    makeable = env_spec is not None and env_makeable(env_spec)
    observation_space, action_space = _dataset_spaces(
        env_spec if makeable else None, episodes, observation_space, action_space
    )
    check_action_space(action_space, f"Minari dataset {dataset_id!r}")
    # unmakeable specs are stored by _complete_metadata: Minari would try (and fail) to gym.make them
    minari_env, minari_eval = (env_spec, eval_spec) if makeable else (None, None)
    fields = {
        "algorithm_name": algorithm_name,
        "author": author,
        "author_email": author_email,
        "code_permalink": code_permalink,
        "ref_min_score": ref_min_score,
        "ref_max_score": ref_max_score,
        "description": description,
    }
    need("minari", "writing a Minari dataset")

    check_writable(dataset_id, root, overwrite)
    path = dataset_path(dataset_id, root)
    datasets_root = dataset_path("x-v0", root).parent
    clean_stale(datasets_root)
    # Build under a hidden directory of the root (Minari lists no hidden directory), then one rename.
    temp_root = new_temp_dir(datasets_root)
    try:
        check_free_space(temp_root, episodes, dataset_id)
        with minari_root(temp_root):
            building = dataset_path(dataset_id)
            dataset = _create(
                dataset_id, episodes, minari_env, minari_eval, observation_space, action_space, fields
            )
            _complete_metadata(
                dataset, dataset_id, extra_metadata, (ref_min_score, ref_max_score), env_spec, eval_spec
            )
        replace_dir(building, path)
    finally:
        shutil.rmtree(temp_root, ignore_errors=True)
    return path


def _dataset_spaces(
    makeable_spec: EnvSpec | None,
    episodes: Sequence[Episode],
    observation_space: gym.spaces.Space | None,
    action_space: gym.spaces.Space | None,
) -> tuple[gym.spaces.Space, gym.spaces.Space]:
    """The spaces to store: the given ones, else the env's (when its spec builds here), else `infer_spaces`."""
    if makeable_spec is not None:
        with contextlib.closing(gym.make(makeable_spec)) as made:
            observation_space = observation_space or made.observation_space
            action_space = action_space or made.action_space
    if observation_space is None or action_space is None:
        inferred_obs, inferred_act = infer_spaces(episodes)
        observation_space = observation_space or inferred_obs
        action_space = action_space or inferred_act
    return observation_space, action_space


def _create(
    dataset_id: str,
    episodes: Sequence[Episode],
    env: EnvSpec | None,
    eval_env: EnvSpec | None,
    observation_space: gym.spaces.Space,
    action_space: gym.spaces.Space,
    fields: dict[str, Any],
) -> Any:
    """`minari.create_dataset_from_buffers` of one `EpisodeBuffer` per episode under the current Minari root,
    without its warnings about the optional `fields` (author, references...) deliberately left None."""
    need("minari", "writing a Minari dataset")
    import minari

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*is set to None", category=UserWarning)
        warnings.filterwarnings("ignore", message=r"env_spec is None", category=UserWarning)
        return minari.create_dataset_from_buffers(
            dataset_id,
            [_to_buffer(ep, observation_space, action_space) for ep in episodes],
            env=env,
            eval_env=eval_env,
            observation_space=observation_space,
            action_space=action_space,
            jpeg_encoding=False,
            **fields,
        )


def _complete_metadata(
    dataset: Any,
    dataset_id: str,
    extra_metadata: dict[str, Any] | None,
    refs: tuple[float | None, float | None],
    env_spec: EnvSpec | None,
    eval_spec: EnvSpec | None,
) -> None:
    """Write into the dataset's metadata.json what Minari did not: `extra_metadata`, the reference scores
    `refs` (min, max; Minari drops them without an env) and the env specs it could not make; then check that
    the references landed (`RuntimeError` naming the key otherwise)."""
    stored = dataset.storage.metadata
    wanted: dict[str, Any] = dict(extra_metadata or {})
    if refs[0] is not None and refs[1] is not None:
        wanted["ref_min_score"], wanted["ref_max_score"] = float(refs[0]), float(refs[1])
    if env_spec is not None and "env_spec" not in stored:
        wanted["env_spec"] = env_spec.to_json()
    if eval_spec is not None and "eval_env_spec" not in stored:
        wanted["eval_env_spec"] = eval_spec.to_json()
    dataset.storage.update_metadata(wanted)
    stored = dataset.storage.metadata
    for key in ("ref_min_score", "ref_max_score"):
        if key in wanted and stored.get(key) != wanted[key]:
            raise RuntimeError(f"{key} did not land in {dataset_id!r} metadata: {stored.get(key)!r}")
