"""Read Minari datasets (minari 0.5) as lists of `Episode`, without jax; dataset ids and the datasets root.

Minari keeps a dataset with id `namespace/name-vN` under `<root>/namespace/name-vN/data/` (metadata.json +
main_data.hdf5); `<root>` is `$MINARI_DATASETS_PATH`, else `~/.minari/datasets`, read at call time, so
every function here takes `root=` and sets the variable only for its own duration. Each stored episode has
T + 1 observations and T actions / rewards / flags; `read_minari` splits them into aligned `observations`
and `next_observations` (see `offline_data.episode`). Writing lives in `offline_data.minari_write`.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import EnvSpec

from offline_data.env_check import checked_minari_metadata
from offline_data.episode import DatasetInfo, Episode, OfflineDataset
from offline_data.errors import DatasetError, DatasetNotFoundError
from rl_transformers.utils.extras import need

__all__ = [
    "check_action_space",
    "dataset_path",
    "minari_root",
    "read_minari",
    "validate_dataset_id",
]

ROOT_ENV_VAR = "MINARI_DATASETS_PATH"


@contextlib.contextmanager
def minari_root(root: str | os.PathLike[str] | None) -> Iterator[None]:
    """Point Minari at `root` (sets MINARI_DATASETS_PATH) for the duration; None keeps the current one."""
    if root is None:
        yield
        return
    old = os.environ.get(ROOT_ENV_VAR)
    os.environ[ROOT_ENV_VAR] = str(Path(root).expanduser().resolve())
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(ROOT_ENV_VAR, None)
        else:
            os.environ[ROOT_ENV_VAR] = old


def validate_dataset_id(dataset_id: str) -> None:
    """Raise `ValueError` unless `dataset_id` is a versioned Minari id such as `rlt/hopper/medium-v0`."""
    need("minari", "a Minari dataset id")
    from minari.dataset.minari_dataset import DATASET_ID_RE

    match = DATASET_ID_RE.fullmatch(dataset_id)
    if match is None or match.group("version") is None:
        raise ValueError(
            f"malformed Minari dataset id {dataset_id!r}: expected (namespace/)name-vN with letters, digits, "
            "'-', '_' and a version, e.g. 'rlt/hopper/medium-v0'"
        )


def dataset_path(dataset_id: str, root: str | os.PathLike[str] | None = None) -> Path:
    """Directory of a Minari dataset id under `root` (whether or not it exists)."""
    need("minari", "a Minari dataset")
    from minari.storage.datasets_root_dir import get_dataset_path

    validate_dataset_id(dataset_id)
    with minari_root(root):
        return get_dataset_path(dataset_id)


# ----------------------------------------------------------------------------------------------- reading


def _data_dir(source: Any, root: str | os.PathLike[str] | None) -> tuple[Path, str]:
    """The data/ directory (metadata.json + main_data.hdf5) of an id, a dataset directory or its data/."""
    text = str(source)
    path = Path(text).expanduser()
    if path.exists():
        if path.is_file() and path.name == "main_data.hdf5":
            path = path.parent
        if (path / "metadata.json").is_file():
            return path, text
        if (path / "data" / "metadata.json").is_file():
            return path / "data", text
        raise DatasetError(
            f"{text!r} is not a dataset: expected a Minari dataset directory (with data/metadata.json), its "
            "data/ directory, a Minari dataset id, or a D4RL-format .hdf5 / .h5 file"
        )
    try:
        validate_dataset_id(text)
    except ValueError as err:
        raise DatasetNotFoundError(
            f"no file or directory {text!r}, and it is not a Minari dataset id either ({err})"
        ) from None
    with minari_root(root):
        need("minari", "a Minari dataset")
        import minari
        from minari.storage.datasets_root_dir import get_dataset_path

        data = get_dataset_path(text) / "data"
        if (data / "metadata.json").is_file():
            return data, text
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            local = list(minari.list_local_datasets())
        close = difflib.get_close_matches(text, local, n=3)
        hint = f" Did you mean {close}?" if close else f" Local datasets: {local or 'none'}."
        raise DatasetNotFoundError(
            f"Minari dataset {text!r} not found under {get_dataset_path()} (set root= or "
            f"{ROOT_ENV_VAR}; nothing is downloaded).{hint}"
        )


def _resolve_minari(
    source: Any, root: str | os.PathLike[str] | None, allow_env_modules: Sequence[str] = ()
) -> tuple[Any, str, tuple[dict[str, Any], EnvSpec | None, EnvSpec | None]]:
    """(MinariDataset, name, checked metadata) of an id, a dataset directory, its data/, or a MinariDataset.

    The metadata is validated (env specs through the allow-list, spaces present) *before* Minari opens the
    directory: Minari ``gym.make``s the stored env spec when a space is missing.
    """
    need("minari", "reading a Minari dataset")
    import minari

    if isinstance(source, minari.MinariDataset):
        name = source.spec.dataset_id
        data = Path(source.spec.data_path)
    else:
        data, name = _data_dir(source, root)
    checked = checked_minari_metadata(data, f"Minari dataset {name!r}", allow_env_modules)
    if isinstance(source, minari.MinariDataset):
        return source, name, checked
    try:
        return minari.MinariDataset(data), name, checked
    except (OSError, KeyError, ValueError, AssertionError) as err:
        raise DatasetError(f"Minari dataset {name!r} ({data}) cannot be opened: {err}") from None


def _flatten_observations(obs: Any, space: gym.spaces.Space, where: str) -> np.ndarray:
    if isinstance(space, gym.spaces.Box):
        return np.asarray(obs)
    if isinstance(space, gym.spaces.Dict) and all(
        isinstance(s, gym.spaces.Box) for s in space.spaces.values()
    ):
        parts = [np.asarray(obs[key]) for key in space.spaces]
        return np.concatenate([p.reshape(len(p), -1) for p in parts], axis=1)
    raise DatasetError(
        f"{where}: unsupported observation space {space}; supported: Box, or Dict of Box (flattened)"
    )


def _flat_observation_space(space: gym.spaces.Space, where: str) -> tuple[gym.spaces.Space, bool]:
    if isinstance(space, gym.spaces.Box):
        return space, False
    if isinstance(space, gym.spaces.Dict) and all(
        isinstance(s, gym.spaces.Box) for s in space.spaces.values()
    ):
        return gym.spaces.flatten_space(space), True
    raise DatasetError(
        f"{where}: unsupported observation space {space}; supported: Box, or Dict of Box (flattened)"
    )


def check_action_space(space: gym.spaces.Space, where: str) -> None:
    """Raise `ValueError` unless the action space is a Box or a Discrete."""
    if not isinstance(space, gym.spaces.Box | gym.spaces.Discrete):
        raise DatasetError(f"{where}: unsupported action space {space}; supported: Box, Discrete")


def read_minari(
    source: Any, *, root: str | os.PathLike[str] | None = None, allow_env_modules: Sequence[str] = ()
) -> OfflineDataset:
    """Episodes and metadata of a Minari dataset given by id (under `root`), directory or `MinariDataset`.

    The stored env specs go through `envs.resolve.resolve_env` (`allow_env_modules`: extra trusted modules);
    a spec naming code outside the allow-list raises `DatasetError` naming metadata.json. Raises
    `DatasetError` (a `ValueError`) naming the dataset and episode for misaligned lengths, non-finite values
    or empty episodes, and for observation / action spaces other than Box (or Dict of Box) / Box or Discrete.
    """
    dataset, name, (raw_meta, env_spec, eval_spec) = _resolve_minari(source, root, allow_env_modules)
    obs_space, flattened = _flat_observation_space(dataset.observation_space, f"Minari dataset {name!r}")
    check_action_space(dataset.action_space, f"Minari dataset {name!r}")
    if dataset.total_episodes == 0:
        raise DatasetError(f"Minari dataset {name!r} holds no episodes")
    episodes: list[Episode] = []
    seeds = [meta.get("seed") for meta in dataset.storage.get_episode_metadata(dataset.episode_indices)]
    for index, (episode, seed) in enumerate(zip(dataset.iterate_episodes(), seeds, strict=True)):
        where = f"Minari dataset {name!r} episode {index}"
        obs = _flatten_observations(episode.observations, dataset.observation_space, where)
        try:
            episodes.append(
                Episode.from_observation_sequence(
                    obs,
                    episode.actions,
                    episode.rewards,
                    episode.terminations,
                    episode.truncations,
                    seed=None if seed is None else int(seed),
                )
            )
        except ValueError as err:
            raise DatasetError(f"{where}: {err}") from None
    ref_min, ref_max = raw_meta.get("ref_min_score"), raw_meta.get("ref_max_score")
    has_refs = ref_min is not None and ref_max is not None
    info = DatasetInfo(
        source=name,
        format="minari",
        observation_space=obs_space,
        action_space=dataset.action_space,
        dataset_id=raw_meta.get("dataset_id"),
        env_spec=env_spec,
        eval_env_spec=eval_spec,
        allow_env_modules=tuple(allow_env_modules),
        ref_min_score=float(cast(Any, ref_min)) if has_refs else None,
        ref_max_score=float(cast(Any, ref_max)) if has_refs else None,
        ref_scores_source="dataset" if has_refs else None,
        observations_flattened=flattened,
        metadata=raw_meta,
    )
    return OfflineDataset(episodes, info)
