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
from pathlib import Path
from typing import Any

from offline_data.d4rl_io import read_d4rl_hdf5
from offline_data.episode import OfflineDataset
from offline_data.minari_io import read_minari
from offline_data.scores import reference_scores

__all__ = ["load_episodes"]

_HDF5_SUFFIXES = (".hdf5", ".h5")


def _is_d4rl_file(path: Path) -> bool:
    import h5py

    with h5py.File(path, "r") as file:
        if "observations" in file:
            return True
        if any(key.startswith("episode_") for key in file):
            return False
    # neither layout: report it as a D4RL file so the error names its missing keys
    return not (path.parent / "metadata.json").is_file()


def load_episodes(
    source: str | os.PathLike[str] | Any,
    *,
    root: str | os.PathLike[str] | None = None,
    env_id: str | None = None,
) -> OfflineDataset:
    """Load offline data as `(episodes, info)` from a Minari id / directory or a D4RL-format HDF5 file.

    Args:
        source: Minari id such as "rlt/hopper/medium-v0", a Minari dataset directory, a `.hdf5` / `.h5`
            D4RL-format file, or a `minari.MinariDataset`.
        root: Minari datasets root for ids (default: MINARI_DATASETS_PATH, else ~/.minari/datasets).
        env_id: environment of a D4RL file that does not record one (used for the spec and references).

    Returns:
        `OfflineDataset(episodes, info)`; `info.ref_scores_source` says where the references came from.

    Raises:
        FileNotFoundError: no such file / local Minari dataset (with close matches).
        ValueError: malformed id, missing HDF5 keys, length mismatches, non-finite values, empty data,
            unsupported observation / action spaces — each message names the source, key and episode.
    """
    if isinstance(source, str | os.PathLike):
        path = Path(source).expanduser()
        if path.suffix in _HDF5_SUFFIXES and path.name != "main_data.hdf5":
            if not path.is_file():
                raise FileNotFoundError(f"HDF5 file {str(path)!r} does not exist")
            if _is_d4rl_file(path):
                return read_d4rl_hdf5(path, env_id=env_id)
        loaded = read_minari(path if path.exists() else str(source), root=root)
    else:
        loaded = read_minari(source, root=root)
    info = loaded.info
    if info.ref_min_score is None:
        try:
            ref_min, ref_max = reference_scores(info)
        except ValueError:
            return loaded
        info = dataclasses.replace(
            info, ref_min_score=ref_min, ref_max_score=ref_max, ref_scores_source="d4rl_table"
        )
    return OfflineDataset(loaded.episodes, info)
