"""Offline RL data for rl_transformers: build Minari datasets locally, read Minari and D4RL-format HDF5.

Stable API (what the offline trainers call):

    from offline_data import load_episodes, normalized_score
    episodes, info = load_episodes("rlt/hopper/medium-v0", root="datasets/minari")
    episodes[i].observations / .actions / .rewards / .terminations / .truncations / .next_observations
    info.action_space, info.observation_space, info.make_env(), info.ref_min_score, info.ref_max_score
    info.normalized_score(returns)            # 100·(R − min)/(max − min)

Writers and converters: `write_minari_dataset`, `write_d4rl_hdf5`, `d4rl_to_minari`; references:
`D4RL_REF_SCORES`, `reference_scores`, `normalized_score`. The dataset builder (`build_datasets` in
`offline_data.build`, its settings `BuildConfig` in `offline_data.build_config`) imports Stable-Baselines3
lazily.
"""

from __future__ import annotations

from typing import Any

from offline_data.d4rl_io import d4rl_to_minari, read_d4rl_hdf5, write_d4rl_hdf5
from offline_data.episode import DatasetInfo, Episode, OfflineDataset, episode_returns
from offline_data.loading import load_episodes
from offline_data.minari_io import dataset_path, minari_root, read_minari, validate_dataset_id
from offline_data.minari_write import infer_spaces, write_minari_dataset
from offline_data.scores import D4RL_REF_SCORES, RefScores, env_family, normalized_score, reference_scores

__all__ = [
    "D4RL_REF_SCORES",
    "BuildConfig",
    "DatasetInfo",
    "Episode",
    "OfflineDataset",
    "RefScores",
    "build_datasets",
    "d4rl_to_minari",
    "dataset_path",
    "env_family",
    "episode_returns",
    "infer_spaces",
    "load_episodes",
    "minari_root",
    "normalized_score",
    "read_d4rl_hdf5",
    "read_minari",
    "reference_scores",
    "validate_dataset_id",
    "write_d4rl_hdf5",
    "write_minari_dataset",
]


def __getattr__(name: str) -> Any:
    """Import the builder (and Stable-Baselines3) only when it is asked for."""
    if name == "BuildConfig":
        from offline_data.build_config import BuildConfig

        return BuildConfig
    if name == "build_datasets":
        from offline_data.build import build_datasets

        return build_datasets
    raise AttributeError(f"module 'offline_data' has no attribute {name!r}")
