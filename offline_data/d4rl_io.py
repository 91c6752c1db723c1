"""D4RL-format HDF5 files: read into episodes, write from episodes, convert to Minari — without `d4rl`.

A D4RL file (Fu et al. 2020, arXiv 2004.07219) stores N concatenated transitions as flat datasets:
`observations` (N, obs), `actions` (N, act), `rewards` (N,), `terminals` (N,) (true MDP ends),
`timeouts` (N,) (time-limit cuts; optional here), optionally `next_observations` (N, obs), plus free-form
`metadata/*`. Episodes end after every step with `terminals | timeouts`; a trailing run of steps that
ends with neither is an unfinished episode and is kept, marked truncated at its last step. Without
`next_observations` the observation after an episode's last step is not in the file: the reader repeats
that step's observation and says so in `info.metadata["next_observations"]`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import EnvSpec

from offline_data.env_check import file_env_spec
from offline_data.episode import DatasetInfo, Episode, OfflineDataset
from offline_data.errors import DatasetError, DatasetExistsError, DatasetNotFoundError
from offline_data.minari_io import check_action_space
from offline_data.minari_write import env_makeable, infer_spaces, write_minari_dataset
from offline_data.scores import D4RL_REF_SCORES, env_family
from rl_transformers.utils.atomic import atomic_file
from rl_transformers.utils.extras import need

__all__ = ["D4RL_KEYS", "d4rl_to_minari", "open_hdf5", "read_d4rl_hdf5", "write_d4rl_hdf5"]

D4RL_KEYS = ("observations", "actions", "rewards", "terminals", "timeouts")
"""Datasets of a D4RL file; `timeouts` may be absent (then nothing is a time-limit cut)."""
_REQUIRED = ("observations", "actions", "rewards", "terminals")


def open_hdf5(path: Path) -> Any:
    """``path`` opened read-only with h5py; `DatasetError` naming the file when it is not HDF5."""
    need("h5py", "reading a D4RL .hdf5 file")
    import h5py

    try:
        return h5py.File(path, "r")
    except OSError as err:
        raise DatasetError(
            f"{str(path)!r} is not an HDF5 file ({err}); expected a D4RL-format .hdf5 / .h5 file, a Minari "
            "dataset directory or a Minari dataset id"
        ) from None


def _read_metadata(file: Any) -> dict[str, Any]:
    """Attributes and scalar datasets of the `metadata` group, plus root attributes, as plain Python."""
    need("h5py", "reading a D4RL .hdf5 file")
    import h5py

    meta: dict[str, Any] = {key: _plain(value) for key, value in file.attrs.items()}
    group = file.get("metadata")
    if isinstance(group, h5py.Group):
        meta.update({key: _plain(value) for key, value in group.attrs.items()})

        def visit(name: str, obj: Any) -> None:
            if isinstance(obj, h5py.Dataset) and obj.size <= 64:
                meta[name] = _plain(obj[()])

        group.visititems(visit)
    return meta


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, np.ndarray):
        return value.item() if value.size == 1 else value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _stored_space(text: str, where: str) -> gym.spaces.Space:
    """A space serialized by Minari (JSON; no code is imported)."""
    need("minari", "reading a D4RL .hdf5 file's spaces")
    from minari.serialization import deserialize_space

    try:
        return deserialize_space(text)
    except Exception as err:  # malformed JSON / unknown space type
        raise DatasetError(f"{where} is not a serialized space: {err}") from None


def read_d4rl_hdf5(
    path: str | os.PathLike[str],
    *,
    env_id: str | None = None,
    action_space: gym.spaces.Space | None = None,
    allow_env_modules: Sequence[str] = (),
) -> OfflineDataset:
    """Episodes and metadata of a D4RL-format HDF5 file.

    The env id comes from `env_id`, else the file's `metadata` (`env_id` / `env_spec`). The action space
    comes from `action_space`, else a serialized space in the metadata, else `infer_spaces`. Reference
    scores come from the metadata (`ref_min_score` / `ref_max_score`), else the D4RL table when the env id
    or file name names a D4RL family. Raises `DatasetError` (a `ValueError`) naming the file and key for a
    file that is not HDF5, a missing key, a length mismatch, a non-finite value, a bad flag value or an
    empty file. Env specs and ids of the file go through `envs.resolve.resolve_env`: one naming code outside
    the allowed modules (`allow_env_modules`, `--allow-env-modules`) raises `DatasetError` naming the file.
    """
    path = Path(path)
    if not path.is_file():
        raise DatasetNotFoundError(f"D4RL file {str(path)!r} does not exist")
    where = f"D4RL file {str(path)!r}"
    data, meta = _read_arrays(path, where)
    data = _checked_arrays(data, where)
    episodes = _split_episodes(data, where)
    spec = _env_spec(meta, env_id, where, allow_env_modules)
    env_id = spec.id if spec is not None else (env_id or meta.get("env_id"))
    obs_space, action_space = _spaces(episodes, meta, action_space, where)
    ref_min, ref_max, ref_source = _ref_scores(meta, env_id, path.name)
    meta["next_observations"] = (
        "file"
        if "next_observations" in data
        else "shifted; the last step of each episode repeats its observation"
    )
    info = DatasetInfo(
        source=str(path),
        format="d4rl_hdf5",
        observation_space=obs_space,
        action_space=action_space,
        dataset_id=meta.get("dataset_id"),
        env_spec=spec,
        eval_env_spec=spec,
        ref_min_score=None if ref_min is None else float(ref_min),
        ref_max_score=None if ref_max is None else float(ref_max),
        ref_scores_source=ref_source,
        metadata=meta,
        allow_env_modules=tuple(allow_env_modules),
    )
    return OfflineDataset(episodes, info)


def _read_arrays(path: Path, where: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The file's D4RL datasets (those of :data:`D4RL_KEYS` present, plus `next_observations`) and its
    metadata; `DatasetError` naming the file when a required key is missing."""
    with open_hdf5(path) as file:
        missing = [key for key in _REQUIRED if key not in file]
        if missing:
            raise DatasetError(f"{where} lacks required key(s) {missing}; found {sorted(file.keys())}")
        data = {key: np.asarray(file[key][()]) for key in (*D4RL_KEYS, "next_observations") if key in file}
        return data, _read_metadata(file)


def _checked_arrays(data: dict[str, np.ndarray], where: str) -> dict[str, np.ndarray]:
    """The validation pass over every dataset: not empty, one row per transition, `rewards` / `terminals` /
    `timeouts` 1-D (an (N, 1) column is flattened), finite floats, 0/1 flags, `next_observations` shaped
    like `observations`. Returns the arrays (flattened where needed); `DatasetError` naming `where` and the
    key otherwise."""
    data = dict(data)
    n = len(data["observations"])
    if n == 0:
        raise DatasetError(f"{where} is empty: 'observations' has 0 rows")
    for key, arr in data.items():
        if arr.ndim == 0 or len(arr) != n:
            raise DatasetError(
                f"{where}: length mismatch, {key!r} has shape {arr.shape} but 'observations' has {n} rows"
            )
        if key in ("rewards", "terminals", "timeouts"):
            if arr.ndim == 2 and arr.shape[1] == 1:
                data[key] = arr = arr[:, 0]
            if arr.ndim != 1:
                raise DatasetError(f"{where}: {key!r} must be 1-D, got shape {arr.shape}")
        if np.issubdtype(arr.dtype, np.floating) and not np.isfinite(arr).all():
            index: tuple[int, ...] | int = tuple(int(i) for i in np.argwhere(~np.isfinite(arr))[0])
            raise DatasetError(
                f"{where}: {key!r} holds a non-finite value {arr[index].item()!r} at index {index}"
            )
        if key in ("terminals", "timeouts") and arr.dtype != np.bool_ and not np.isin(arr, (0, 1)).all():
            bad = arr[~np.isin(arr, (0, 1))][0].item()
            raise DatasetError(f"{where}: {key!r} must hold 0/1 or booleans, found {bad!r}")
    if "next_observations" in data and data["next_observations"].shape != data["observations"].shape:
        raise DatasetError(
            f"{where}: 'next_observations' has shape {data['next_observations'].shape}, "
            f"'observations' has {data['observations'].shape}"
        )
    return data


def _split_episodes(data: dict[str, np.ndarray], where: str) -> list[Episode]:
    """Checked flat arrays cut into episodes after every step with `terminals | timeouts`; a trailing run
    ending with neither is kept, truncated at its last step. Without `next_observations` each episode's
    observations shifted by one, the last repeated."""
    n = len(data["observations"])
    terminals = data["terminals"].astype(bool)
    timeouts = data["timeouts"].astype(bool) if "timeouts" in data else np.zeros(n, dtype=bool)
    ends = np.flatnonzero(terminals | timeouts) + 1
    if len(ends) == 0 or ends[-1] != n:
        ends = np.append(ends, n)  # trailing unfinished episode: kept, marked truncated below
    episodes: list[Episode] = []
    start: int | np.integer[Any] = 0
    for index, stop in enumerate(ends):
        obs = data["observations"][start:stop]
        if "next_observations" in data:
            nxt = data["next_observations"][start:stop]
        else:
            nxt = np.concatenate([obs[1:], obs[-1:]], axis=0)
        truncations = timeouts[start:stop].copy()
        if not (terminals[stop - 1] or timeouts[stop - 1]):
            truncations[-1] = True
        try:
            episodes.append(
                Episode(
                    observations=obs,
                    actions=data["actions"][start:stop],
                    rewards=data["rewards"][start:stop],
                    terminations=terminals[start:stop],
                    truncations=truncations,
                    next_observations=nxt,
                )
            )
        except ValueError as err:
            raise DatasetError(f"{where} episode {index} (rows {start}:{stop}): {err}") from None
        start = stop
    return episodes


def _env_spec(
    meta: dict[str, Any], env_id: str | None, where: str, allow_env_modules: Sequence[str]
) -> EnvSpec | None:
    """The env of the file: the caller's `env_id` (``--env-id``; an unknown id is an error, with close
    matches) else the metadata's `env_spec`, else its `env_id`; the file's spec is kept when it names the
    caller's env (its time limit and kwargs). None when nothing names one."""
    file_spec = file_env_spec(meta.get("env_spec"), f"{where} (metadata env_spec)", allow_env_modules)
    file_id_spec = file_env_spec(meta.get("env_id"), f"{where} (metadata env_id)", allow_env_modules)
    spec = file_spec or file_id_spec
    if env_id is not None:
        from envs.resolve import resolve_env

        spec = resolve_env(env_id, source="--env-id", allow_modules=allow_env_modules)
        if file_spec is not None and file_spec.id == spec.id:
            spec = file_spec  # same env: keep the file's time limit / kwargs
    return spec


def _spaces(
    episodes: list[Episode], meta: dict[str, Any], action_space: gym.spaces.Space | None, where: str
) -> tuple[gym.spaces.Space, gym.spaces.Space]:
    """Observation and action spaces: the caller's action space, else a serialized one in the metadata, else
    the one inferred from the data (`infer_spaces`); the same for observations (no caller's). The action
    space is checked by `check_action_space`."""
    obs_space: gym.spaces.Space
    obs_space, inferred_act = infer_spaces(episodes)
    if action_space is None and isinstance(meta.get("action_space"), str):
        action_space = _stored_space(meta["action_space"], f"{where} (metadata action_space)")
    if isinstance(meta.get("observation_space"), str):
        obs_space = _stored_space(meta["observation_space"], f"{where} (metadata observation_space)")
    action_space = action_space or inferred_act
    check_action_space(action_space, where)
    return obs_space, action_space


def _ref_scores(meta: dict[str, Any], env_id: str | None, file_name: str) -> tuple[Any, Any, str | None]:
    """Reference (min, max) scores and where they came from: both from the metadata (``"dataset"``), else
    the D4RL table of the family the env id or file name names (``"d4rl_table"``), else ``(None, None,
    None)``."""
    ref_min, ref_max = meta.get("ref_min_score"), meta.get("ref_max_score")
    if ref_min is not None and ref_max is not None:
        return ref_min, ref_max, "dataset"
    family = next((f for f in (env_family(name) for name in (env_id or "", file_name)) if f), None)
    if family is None:
        return None, None, None
    ref_min, ref_max = D4RL_REF_SCORES[family]
    return ref_min, ref_max, "d4rl_table"


def write_d4rl_hdf5(
    path: str | os.PathLike[str],
    episodes: Sequence[Episode],
    *,
    metadata: dict[str, Any] | None = None,
    next_observations: bool = True,
    overwrite: bool = False,
    compression: str | None = "gzip",
) -> Path:
    """Concatenate episodes into a D4RL-format file (terminations → `terminals`, truncations → `timeouts`).

    Every episode but the last must end with a termination or truncation, and none may have one before
    its last step, otherwise a reader would split the file differently. `metadata` values (str, numbers,
    gym spaces — stored serialized) go to attributes of the `metadata` group. Refuses to replace an
    existing file unless `overwrite`.
    """
    need("minari", "writing a D4RL .hdf5 file's spaces")
    need("h5py", "writing a D4RL .hdf5 file")
    import h5py
    from minari.serialization import serialize_space

    path = Path(path)
    if path.exists() and not overwrite:
        raise DatasetExistsError(
            f"{str(path)!r} exists; pass overwrite=True (CLI: --overwrite) to replace it"
        )
    if not episodes:
        raise ValueError(f"no episodes to write to {str(path)!r}")
    for index, ep in enumerate(episodes):
        done = ep.terminations | ep.truncations
        if done[:-1].any():
            step = int(np.flatnonzero(done[:-1])[0])
            raise ValueError(f"episode {index} ends at step {step} before its last step {len(ep) - 1}")
        if index < len(episodes) - 1 and not done[-1]:
            raise ValueError(
                f"episode {index} ends with neither a termination nor a truncation; a D4RL reader would "
                "merge it with the next episode"
            )
    arrays = {
        "observations": np.concatenate([ep.observations for ep in episodes]),
        "actions": np.concatenate([ep.actions for ep in episodes]),
        "rewards": np.concatenate([ep.rewards for ep in episodes]),
        "terminals": np.concatenate([ep.terminations for ep in episodes]),
        "timeouts": np.concatenate([ep.truncations for ep in episodes]),
    }
    if next_observations:
        arrays["next_observations"] = np.concatenate([ep.next_observations for ep in episodes])
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path) as temp, h5py.File(temp, "w") as file:
        for key, arr in arrays.items():
            file.create_dataset(key, data=arr, compression=compression)
        group = file.create_group("metadata")
        for key, value in (metadata or {}).items():
            if isinstance(value, gym.spaces.Space):
                value = serialize_space(value)
            elif isinstance(value, dict | list):
                value = json.dumps(value)
            elif value is None:
                continue
            group.attrs[key] = value
    return path


def d4rl_to_minari(
    path: str | os.PathLike[str],
    dataset_id: str,
    *,
    env_id: str | None = None,
    ref_min_score: float | None = None,
    ref_max_score: float | None = None,
    root: str | os.PathLike[str] | None = None,
    overwrite: bool = False,
    allow_env_modules: Sequence[str] = (),
    **write_kwargs: Any,
) -> Path:
    """Convert a D4RL-format file to Minari dataset `dataset_id`; returns the dataset directory.

    References default to those `read_d4rl_hdf5` finds (file metadata, else the D4RL table). The env spec
    (from `env_id` or the file) is stored when known. Other keyword arguments go to `write_minari_dataset`.
    """
    episodes, info = read_d4rl_hdf5(path, env_id=env_id, allow_env_modules=allow_env_modules)
    if ref_min_score is None and ref_max_score is None:
        ref_min_score, ref_max_score = info.ref_min_score, info.ref_max_score
    write_kwargs.setdefault("description", f"Converted from the D4RL-format file {Path(path).name}.")
    # a makeable env's spaces (true bounds) beat the ones inferred from the data
    env_spaces = info.env_spec is not None and env_makeable(info.env_spec)
    return write_minari_dataset(
        dataset_id,
        episodes,
        env=info.env_spec,
        eval_env=info.eval_env_spec,
        observation_space=None if env_spaces else info.observation_space,
        action_space=None if env_spaces else info.action_space,
        ref_min_score=ref_min_score,
        ref_max_score=ref_max_score,
        extra_metadata={"converted_from": str(Path(path).resolve())},
        root=root,
        overwrite=overwrite,
        allow_env_modules=allow_env_modules,
        **write_kwargs,
    )
