"""Build the offline memory datasets as Minari datasets: one per memory length of one task.

For each length the episodes come from `offline_data.memory_tasks.generate_episodes` (ε-oracle plus a
share of random episodes) and are written with `write_minari_dataset`, so the build is atomic: the
dataset is assembled under a hidden directory of the root and renamed into place when complete, and a
kill at any moment leaves nothing `minari.list_local_datasets` lists. Each dataset stores
``ref_min_score`` (the exact random-policy return) and ``ref_max_score`` (the oracle's mean return at
ε = 0 over `num_ref_episodes` episodes) and, under ``rlt_build``, the settings and their fingerprint.

Running the same command again is idempotent and resumes a multi-length build: a dataset whose stored
fingerprint equals this build's is kept as it is (the data is a pure function of the settings); an id that
holds other data stops the build with `DatasetExistsError` before anything is written, unless `overwrite`
(which keeps the old dataset until the new one is complete). Ids: ``<prefix>/<task>-<length>/<name>-v<version>``,
e.g. ``rlt/tmaze-50/mixed-e10-r20-v0`` (ε and random share in percent; ``oracle`` at 0 / 0, ``random`` at
share 1). CLI: ``python scripts/make_memory_dataset.py --task tmaze --memory-lengths 10 50 200``.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from offline_data.episode import episode_returns
from offline_data.errors import DatasetError, DatasetExistsError
from offline_data.memory_tasks import (
    MEMORY_TASKS,
    MemoryTaskName,
    OfflineMemoryTask,
    generate_episodes,
    make_task_env,
    random_episode_mask,
)
from offline_data.minari_io import dataset_path, validate_dataset_id
from offline_data.minari_write import check_writable, write_minari_dataset

__all__ = ["MemoryBuildConfig", "MemoryDataset", "build_memory_datasets", "main"]

REF_SEED_OFFSET = 50_000_000
"""Added to `seed` for the reset seeds of the oracle reference episodes (apart from the data's seeds)."""
BUILDER_VERSION = 1
"""Part of the fingerprint: bump it when the generator's output for the same settings changes."""


def fingerprint(settings: dict[str, object]) -> str:
    """sha256 of the settings' JSON (sorted keys), 16 hex digits: identifies the data of one dataset."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class MemoryBuildConfig:
    """Settings of `build_memory_datasets` (``scripts/make_memory_dataset.py``, one flag per field).

    Rerunning the same command keeps the datasets it already wrote (same settings) and writes the rest.
    """

    task: MemoryTaskName = "tmaze"
    """Memory task: tmaze (passive T-Maze) or repeat-previous (RepeatPrevious, 4 symbols)."""
    memory_lengths: tuple[int, ...] | None = None
    """One dataset per memory length: the T-Maze corridor length, the RepeatPrevious delay k (2k steps);
    None: 10 50 200 for tmaze, 32 for repeat-previous."""
    epsilon: float = 0.0
    """Probability that the oracle's action is replaced by a uniform random one, per step."""
    random_share: float = 0.0
    """Share of the episodes played by a uniform random policy instead of the oracle."""
    num_episodes: int = 500
    """Episodes per dataset."""
    num_ref_episodes: int = 100
    """Oracle episodes (ε = 0) that measure the oracle reference score."""
    seed: int = 0
    """Episode i resets with seed + i; ε draws and random actions use numpy.random.default_rng([seed, i])."""
    dataset_prefix: str = "rlt"
    """Minari namespace before <task>-<length>."""
    dataset_name: str | None = None
    """Name of each dataset within <prefix>/<task>-<length>/; None: derived from epsilon and random_share."""
    version: int = 0
    """Version of every dataset id."""
    root: Path | None = None
    """Minari datasets root; None: MINARI_DATASETS_PATH, else ~/.minari/datasets."""
    overwrite: bool = False
    """Replace datasets that hold other data instead of stopping with an error."""
    progress: bool = True
    """Show tqdm progress bars."""

    def __post_init__(self) -> None:
        if self.task not in MEMORY_TASKS:
            close = difflib.get_close_matches(str(self.task), list(MEMORY_TASKS), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise DatasetError(
                f"unknown memory task {self.task!r} (--task); valid: {sorted(MEMORY_TASKS)}.{hint}"
            )
        lengths = self.lengths
        if not lengths or len(set(lengths)) != len(lengths) or min(lengths) < 1:
            raise DatasetError(f"--memory-lengths must be distinct integers >= 1, got {list(lengths)}")
        for name in ("epsilon", "random_share"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise DatasetError(f"--{name.replace('_', '-')} must lie in [0, 1], got {value!r}")
        for name in ("num_episodes", "num_ref_episodes"):
            if getattr(self, name) < 1:
                raise DatasetError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.seed < 0 or self.version < 0:
            raise DatasetError(f"--seed and --version must be >= 0, got {self.seed}, {self.version}")
        for length in lengths:
            try:
                validate_dataset_id(self.dataset_id(length))
            except ValueError as err:
                raise DatasetError(f"--dataset-prefix / --dataset-name: {err}") from None

    @property
    def spec(self) -> OfflineMemoryTask:
        """The task's description (env, oracle, references)."""
        return MEMORY_TASKS[self.task]

    @property
    def lengths(self) -> tuple[int, ...]:
        """The memory lengths to build."""
        return tuple(self.memory_lengths or MEMORY_TASKS[self.task].default_lengths)

    @property
    def name(self) -> str:
        """Dataset name within <prefix>/<task>-<length>/."""
        if self.dataset_name is not None:
            return self.dataset_name
        if self.random_share == 1.0:
            return "random"
        if self.epsilon == 0.0 and self.random_share == 0.0:
            return "oracle"
        percent = [f"{100 * v:.4g}".replace(".", "p") for v in (self.epsilon, self.random_share)]
        return f"mixed-e{percent[0]}-r{percent[1]}"

    def dataset_id(self, length: int) -> str:
        """Minari id of the dataset at one memory length, e.g. rlt/tmaze-50/oracle-v0."""
        return f"{self.dataset_prefix.strip('/')}/{self.task}-{length}/{self.name}-v{self.version}"

    def build_settings(self, length: int) -> dict[str, object]:
        """What determines the data at one length (stored as ``rlt_build``; fingerprinted)."""
        return {
            "builder": f"offline_data.memory_build/{BUILDER_VERSION}",
            "task": self.task,
            "env_id": self.spec.env_id,
            "env_kwargs": self.spec.env_kwargs(length),
            "memory_length": length,
            "epsilon": self.epsilon,
            "random_share": self.random_share,
            "num_episodes": self.num_episodes,
            "num_ref_episodes": self.num_ref_episodes,
            "seed": self.seed,
        }


@dataclass(frozen=True)
class MemoryDataset:
    """One dataset a build wrote (or kept)."""

    dataset_id: str
    path: Path
    memory_length: int
    ref_min_score: float
    ref_max_score: float
    mean_return: float
    success_rate: float | None
    """Share of episodes with the maximal final reward (T-Maze: reached the cued goal); None otherwise."""
    kept: bool
    """True when an identical dataset was there already and was left untouched."""
    seconds: float


def _stored_build(path: Path) -> dict[str, object] | None:
    try:
        meta = json.loads((path / "data" / "metadata.json").read_text())
    except (OSError, ValueError):
        return None
    build = meta.get("rlt_build") if isinstance(meta, dict) else None
    return build if isinstance(build, dict) else None


def _preflight(config: MemoryBuildConfig) -> set[int]:
    """Lengths whose identical dataset exists (kept); raises before any work if another one would be replaced."""
    keep: set[int] = set()
    for length in config.lengths:
        path = dataset_path(config.dataset_id(length), config.root)
        if not path.exists() or config.overwrite:
            continue
        stored = _stored_build(path) or {}
        if stored.get("fingerprint") == fingerprint(config.build_settings(length)):
            keep.add(length)
            continue
        try:
            check_writable(config.dataset_id(length), config.root, overwrite=False)
        except FileExistsError as err:
            raise DatasetExistsError(f"{err} (it holds data built with other settings)") from None
    return keep


def _success_rate(task: MemoryTaskName, final_rewards: np.ndarray) -> float | None:
    return float(np.mean(final_rewards > 0)) if task == "tmaze" else None


def _oracle_reference(config: MemoryBuildConfig, length: int) -> float:
    episodes = generate_episodes(
        config.spec,
        length,
        num_episodes=config.num_ref_episodes,
        epsilon=0.0,
        random_mask=np.zeros(config.num_ref_episodes, dtype=bool),
        seed=config.seed + REF_SEED_OFFSET,
    )
    return float(episode_returns(episodes).mean())


def _build_one(config: MemoryBuildConfig, length: int) -> MemoryDataset:
    started = time.perf_counter()
    dataset_id = config.dataset_id(length)
    settings = config.build_settings(length)
    ref_min = float(config.spec.random_score(length))
    ref_max = _oracle_reference(config, length)
    mask = random_episode_mask(config.num_episodes, config.random_share, config.seed)
    episodes = generate_episodes(
        config.spec,
        length,
        num_episodes=config.num_episodes,
        epsilon=config.epsilon,
        random_mask=mask,
        seed=config.seed,
        progress=config.progress,
        desc=dataset_id,
    )
    with make_task_env(config.spec, length) as env:
        env_spec = env.spec
    description = (
        f"{config.task} memory dataset, {config.spec.length_meaning} = {length}: {config.num_episodes} "
        f"episodes, {int(mask.sum())} by a uniform random policy, the others by a scripted oracle whose "
        f"actions are uniform random with probability {config.epsilon} per step. Reference scores: exact "
        f"expected return of the uniform policy; mean return of the oracle (epsilon 0) over "
        f"{config.num_ref_episodes} episodes. Built by rl_transformers (offline_data.memory_build), seed "
        f"{config.seed}."
    )
    path = write_minari_dataset(
        dataset_id,
        episodes,
        env=env_spec,
        eval_env=env_spec,
        ref_min_score=ref_min,
        ref_max_score=ref_max,
        algorithm_name=f"scripted-oracle/epsilon={config.epsilon}/random_share={config.random_share}",
        author="rl_transformers",
        description=description,
        extra_metadata={
            "rlt_build": {**settings, "fingerprint": fingerprint(settings)},
            "ref_scores_source": "random: exact; oracle: measured",
            "num_episodes_average_score": config.num_ref_episodes,
        },
        root=config.root,
        overwrite=config.overwrite,
    )
    final = np.array([ep.rewards[-1] for ep in episodes])
    return MemoryDataset(
        dataset_id=dataset_id,
        path=path,
        memory_length=length,
        ref_min_score=ref_min,
        ref_max_score=ref_max,
        mean_return=float(episode_returns(episodes).mean()),
        success_rate=_success_rate(config.task, final),
        kept=False,
        seconds=time.perf_counter() - started,
    )


def _kept(config: MemoryBuildConfig, length: int) -> MemoryDataset:
    from offline_data.minari_io import read_minari

    data = read_minari(config.dataset_id(length), root=config.root)
    final = np.array([ep.rewards[-1] for ep in data.episodes])
    return MemoryDataset(
        dataset_id=config.dataset_id(length),
        path=dataset_path(config.dataset_id(length), config.root),
        memory_length=length,
        ref_min_score=float(data.info.ref_min_score or 0.0),
        ref_max_score=float(data.info.ref_max_score or 0.0),
        mean_return=float(episode_returns(data.episodes).mean()),
        success_rate=_success_rate(config.task, final),
        kept=True,
        seconds=0.0,
    )


def build_memory_datasets(config: MemoryBuildConfig) -> list[MemoryDataset]:
    """Write one Minari dataset per memory length (see the module docstring); returns what was written."""
    keep = _preflight(config)
    results = []
    for length in config.lengths:
        if length in keep:
            results.append(_kept(config, length))
            if config.progress:
                tqdm.write(f"kept {config.dataset_id(length)}: already built with the same settings")
            continue
        results.append(_build_one(config, length))
    return results


def main(argv: Sequence[str] | None = None, description: str | None = None) -> list[MemoryDataset]:
    """CLI (``scripts/make_memory_dataset.py``): parse a `MemoryBuildConfig`, build, print a JSON summary."""
    import tyro

    config = tyro.cli(MemoryBuildConfig, args=argv, description=description or __doc__)
    results = build_memory_datasets(config)
    summary = [{k: str(v) if isinstance(v, Path) else v for k, v in asdict(r).items()} for r in results]
    print(json.dumps({"datasets": summary}, indent=2))
    return results
