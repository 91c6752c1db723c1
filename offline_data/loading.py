"""`load_episodes`: the one entry point the offline trainers call.

It accepts a Minari dataset id (looked up under `root` / MINARI_DATASETS_PATH, never downloaded), a Minari
dataset directory (or its `data/` folder or `main_data.hdf5`), a D4RL-format `.hdf5` / `.h5` file, or a
`minari.MinariDataset`, and returns `OfflineDataset(episodes, info)`: a list of aligned `Episode`s (see
`offline_data.episode` for shapes) and a `DatasetInfo` with the spaces, env specs and reference scores.
References come from the dataset when it stores them, else from `D4RL_REF_SCORES` when the env or
dataset name names a D4RL family, else they stay None.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from offline_data.d4rl_io import open_hdf5, read_d4rl_hdf5
from offline_data.env_check import conform_to_env, env_spaces
from offline_data.episode import OfflineDataset
from offline_data.errors import DatasetError, DatasetNotFoundError
from offline_data.minari_io import read_minari
from offline_data.scores import reference_scores

__all__ = ["load_episodes"]

_HDF5_SUFFIXES = (".hdf5", ".h5")
_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def _is_d4rl_file(path: Path) -> bool:
    with open_hdf5(path) as file:
        if "observations" in file:
            return True
        if any(key.startswith("episode_") for key in file):
            return False
    # neither layout: report it as a D4RL file so the error names its missing keys
    return not (path.parent / "metadata.json").is_file()


def _looks_like_path(text: str) -> bool:
    return text.startswith((".", "/", "~")) or Path(text).suffix in (*_HDF5_SUFFIXES, ".json", ".npz", ".pkl")


def load_episodes(
    source: str | os.PathLike[str] | Any,
    *,
    root: str | os.PathLike[str] | None = None,
    env_id: str | None = None,
    allow_env_modules: Sequence[str] = (),
    check_env: bool = True,
) -> OfflineDataset:
    """Load offline data as `(episodes, info)` from a Minari id / directory or a D4RL-format HDF5 file.

    Args:
        source: Minari id such as "rlt/hopper/medium-v0", a Minari dataset directory, a `.hdf5` / `.h5`
            D4RL-format file, or a `minari.MinariDataset`.
        root: Minari datasets root for ids (default: MINARI_DATASETS_PATH, else ~/.minari/datasets).
        env_id: the environment of the data (`--env-id`): the spec of a D4RL file that records none, and the
            env the data is checked against (default: the dataset's evaluation / collection env).
        allow_env_modules: modules trusted beyond the defaults for env specs stored in the file
            (`--allow-env-modules`, see `envs.resolve`).
        check_env: when the env can be built here, take the observation / action spaces from it and check
            the data against them (`offline_data.env_check.conform_to_env`: float-coded discrete actions
            become int64; non-integral or out-of-range actions and shape mismatches raise `DatasetError`).

    Returns:
        `OfflineDataset(episodes, info)`; `info.ref_scores_source` says where the references came from,
        `info.metadata["spaces_from"]` is "env <id>" when the spaces come from the env.

    Raises:
        DatasetNotFoundError (a FileNotFoundError): no such file / local Minari dataset (with close matches).
        DatasetError (a ValueError): a file that is not a dataset, malformed id, missing HDF5 keys, length
            mismatches, non-finite values, empty data, unsupported spaces, an env spec naming code outside
            the allowed modules, data that does not fit its env -- each message names the source.
        envs.resolve.UnknownEnvError: `env_id` is not registered (with the closest ids).
    """
    if isinstance(source, str | os.PathLike):
        text = os.fspath(source)
        if not text:
            raise DatasetError(
                "no dataset given: pass a Minari dataset id, a Minari directory or a .hdf5 file"
            )
        path = Path(text).expanduser()
        if not path.exists() and _looks_like_path(text):
            raise DatasetNotFoundError(f"dataset path {text!r} does not exist")
        if path.is_file() and path.name != "main_data.hdf5":
            with open(path, "rb") as handle:
                is_hdf5 = handle.read(8) == _HDF5_SIGNATURE
            if not is_hdf5 and path.suffix not in _HDF5_SUFFIXES:
                raise DatasetError(
                    f"{text!r} is not a dataset: expected a D4RL-format .hdf5 / .h5 file, a Minari dataset "
                    "directory (with data/metadata.json) or a Minari dataset id"
                )
            if _is_d4rl_file(path):
                loaded = read_d4rl_hdf5(path, env_id=env_id, allow_env_modules=allow_env_modules)
                return _finish(loaded, env_id, allow_env_modules, check_env)
        loaded = read_minari(path if path.exists() else text, root=root, allow_env_modules=allow_env_modules)
    else:
        loaded = read_minari(source, root=root, allow_env_modules=allow_env_modules)
    return _finish(loaded, env_id, allow_env_modules, check_env)


def _finish(
    loaded: OfflineDataset, env_id: str | None, allow_env_modules: Sequence[str], check_env: bool
) -> OfflineDataset:
    episodes, info = loaded
    if check_env:
        spec: Any = info.eval_env_spec or info.env_spec
        if env_id is not None:
            from envs.resolve import resolve_env

            spec = resolve_env(env_id, source="--env-id", allow_modules=allow_env_modules)
        if spec is not None:
            spaces = env_spaces(spec, f"dataset {info.source!r}", allow_env_modules)
            if spaces is not None:
                episodes, info = conform_to_env(episodes, info, *spaces, env_name=spec.id)
    if info.ref_min_score is None:
        try:
            ref_min, ref_max = reference_scores(info)
        except ValueError:
            return OfflineDataset(episodes, info)
        info = dataclasses.replace(
            info, ref_min_score=ref_min, ref_max_score=ref_max, ref_scores_source="d4rl_table"
        )
    return OfflineDataset(episodes, info)
