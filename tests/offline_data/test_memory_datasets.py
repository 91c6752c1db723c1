"""Offline memory datasets: oracle data solves the task, Minari alignment, references, the ε / random
mix, atomic builds under a kill, and no silent overwrite. Checks go through ``minari.load_dataset`` (the real
client) and through a replay of every stored episode in a fresh env; expectations are closed forms of the tasks
(see ``offline_data.memory_tasks``), not numbers read off the builder."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import envs  # noqa: F401  (registers rlt/ ids)
from envs.tmaze import NORTH, random_policy_return
from offline_data import load_episodes
from offline_data.errors import DatasetError
from offline_data.memory_build import MemoryBuildConfig, build_memory_datasets
from offline_data.memory_tasks import MEMORY_TASKS, generate_episodes, random_episode_mask
from offline_data.minari_io import dataset_path
from offline_data.minari_io import minari_root as pointing_at

REPO = Path(__file__).resolve().parents[2]


def _config(root: Path, **overrides: Any) -> MemoryBuildConfig:
    settings: dict[str, Any] = dict(
        task="tmaze", memory_lengths=(10,), num_episodes=24, num_ref_episodes=8, root=root, progress=False
    )
    settings.update(overrides)
    return MemoryBuildConfig(**settings)


def _listed(root: Path) -> list[str]:
    import minari

    with pointing_at(root), warnings.catch_warnings():
        warnings.simplefilter("error")  # a "misconfigured dataset" warning means something half-written shows
        return sorted(minari.list_local_datasets())


def _minari_episodes(root: Path, dataset_id: str) -> tuple[Any, list[Any]]:
    import minari

    with pointing_at(root):
        dataset = minari.load_dataset(dataset_id)
        return dataset, list(dataset.iterate_episodes())


def _replay(env_id: str, kwargs: dict[str, Any], seed: int, actions: np.ndarray) -> dict[str, Any]:
    """Play the stored actions in a fresh env reset with the stored seed; what it saw."""
    env = gym.make(env_id, **kwargs)
    obs, _ = env.reset(seed=seed)
    observations, rewards, info = [obs], [], {}
    for action in actions:
        obs, reward, _, _, info = env.step(int(action))
        observations.append(obs)
        rewards.append(reward)
    env.close()
    return {"observations": np.stack(observations), "rewards": np.asarray(rewards), "info": info}


@pytest.mark.parametrize("length", [5, 10])
def test_oracle_tmaze_dataset_solves_the_maze_and_aligns(minari_root: Path, length: int) -> None:
    (result,) = build_memory_datasets(_config(minari_root, memory_lengths=(length,)))
    assert result.success_rate == 1.0 and result.dataset_id == f"rlt/tmaze-{length}/oracle-v0"
    dataset, episodes = _minari_episodes(minari_root, result.dataset_id)
    assert dataset.total_episodes == 24 and len(episodes) == 24
    seeds = [m["seed"] for m in dataset.storage.get_episode_metadata(dataset.episode_indices)]
    for episode, seed in zip(episodes, seeds, strict=True):
        n = len(episode.actions)
        assert n == length + 1  # the shortest route: L steps east, one turn
        assert episode.observations.shape == (n + 1, 2)  # Minari: N + 1 observations for N actions
        assert episode.rewards.shape == episode.terminations.shape == episode.truncations.shape == (n,)
        assert (
            episode.terminations[-1] and not episode.terminations[:-1].any() and not episode.truncations.any()
        )
        replay = _replay("rlt/TMaze-v0", {"corridor_length": length}, int(seed), episode.actions)
        np.testing.assert_array_equal(
            replay["observations"], episode.observations
        )  # obs t+1 follows action t
        np.testing.assert_array_equal(replay["rewards"], episode.rewards)
        assert replay["info"]["success"] is True
        assert float(episode.rewards.sum()) == 1.0  # the oracle's return: goal reward, no lag penalty
    # our reader agrees with Minari's and re-creates the env with the corridor length
    data, info = load_episodes(result.dataset_id, root=minari_root)
    for ours, theirs in zip(data, episodes, strict=True):
        np.testing.assert_array_equal(ours.observations, theirs.observations[:-1])
        np.testing.assert_array_equal(ours.next_observations, theirs.observations[1:])
    with info.make_env() as env:
        assert env.unwrapped.corridor_length == length


def test_reference_scores_are_stored_and_read_back(minari_root: Path) -> None:
    oracle, rand = (
        build_memory_datasets(
            _config(minari_root, memory_lengths=(6,), random_share=share, num_episodes=400)
        )[0]
        for share in (0.0, 1.0)
    )
    assert rand.dataset_id == "rlt/tmaze-6/random-v0"
    for result in (oracle, rand):
        dataset, _ = _minari_episodes(minari_root, result.dataset_id)
        meta = dataset.storage.metadata
        assert meta["ref_min_score"] == pytest.approx(random_policy_return(6), abs=1e-12)
        assert meta["ref_max_score"] == 1.0  # the oracle's return, optimal
        _, info = load_episodes(result.dataset_id, root=minari_root)
        assert (info.ref_min_score, info.ref_max_score) == (meta["ref_min_score"], meta["ref_max_score"])
        assert meta["rlt_build"]["env_kwargs"] == {"corridor_length": 6}
    episodes, info = load_episodes(oracle.dataset_id, root=minari_root)
    assert info.normalized_score(np.mean([e.total_return for e in episodes])) == pytest.approx(100.0)
    # the stored random reference is what a random policy really earns (400 episodes, return std < 0.15)
    random_returns = [e.total_return for e in load_episodes(rand.dataset_id, root=minari_root).episodes]
    assert np.mean(random_returns) == pytest.approx(random_policy_return(6), abs=0.03)
    assert np.std(random_returns) < 0.15


def test_repeat_previous_k32_oracle_dataset(minari_root: Path) -> None:
    (result,) = build_memory_datasets(
        _config(minari_root, task="repeat-previous", memory_lengths=None, num_episodes=12)
    )
    assert result.dataset_id == "rlt/repeat-previous-32/oracle-v0" and result.memory_length == 32
    dataset, episodes = _minari_episodes(minari_root, result.dataset_id)
    assert (
        dataset.storage.metadata["ref_min_score"] == 0.25 and dataset.storage.metadata["ref_max_score"] == 1.0
    )
    seeds = [m["seed"] for m in dataset.storage.get_episode_metadata(dataset.episode_indices)]
    for episode, seed in zip(episodes, seeds, strict=True):
        assert episode.actions.shape == (64,) and episode.observations.shape == (65, 4)
        symbols = episode.observations[:-1].argmax(axis=1)
        np.testing.assert_array_equal(episode.actions[32:], symbols[:32])  # the answer is s_{t-32}
        assert float(episode.rewards.sum()) == pytest.approx(1.0)
        replay = _replay("rlt/RepeatPreviousLong-v0", {}, int(seed), episode.actions)
        np.testing.assert_array_equal(replay["observations"], episode.observations)
    _, info = load_episodes(result.dataset_id, root=minari_root)
    with info.make_env() as env:
        assert (env.unwrapped.delay, env.unwrapped.episode_length) == (32, 64)


def test_epsilon_and_random_share_lower_the_return_as_predicted(tmp_path: Path) -> None:
    tmaze, repeat = MEMORY_TASKS["tmaze"], MEMORY_TASKS["repeat-previous"]
    n, length = 400, 8

    def run(task: Any, mem: int, epsilon: float, share: float) -> list[Any]:
        mask = random_episode_mask(n, share, seed=3)
        assert mask.sum() == round(share * n)
        return generate_episodes(task, mem, num_episodes=n, epsilon=epsilon, random_mask=mask, seed=3)

    means = {}
    for epsilon in (0.0, 0.1, 0.3):
        episodes = run(tmaze, length, epsilon, 0.0)
        success = np.mean([e.rewards[-1] > 0 for e in episodes])
        expected = (1 - 0.75 * epsilon) ** (length + 1)  # one non-east step makes the turn unreachable
        assert abs(success - expected) <= 4 * np.sqrt(expected * (1 - expected) / n) + 1e-9
        means[epsilon] = np.mean([e.total_return for e in episodes])
    assert means[0.0] == 1.0 > means[0.1] > means[0.3]
    for share in (0.0, 0.5, 1.0):  # RepeatPrevious: expected return (1 - s)(1 - 3ε/4) + s/4, std per ep < 0.1
        got = np.mean([e.total_return for e in run(repeat, 4, 0.2, share)])
        assert got == pytest.approx((1 - share) * (1 - 0.15) + share * 0.25, abs=0.02)
    # through the builder: the mixed dataset's id and mean return sit between the oracle's and the random's
    root = tmp_path / "minari"
    results = [
        build_memory_datasets(
            _config(root, memory_lengths=(length,), epsilon=e, random_share=s, num_episodes=200)
        )[0]
        for e, s in ((0.0, 0.0), (0.05, 0.2), (0.0, 1.0))
    ]
    assert [r.dataset_id.split("/")[-1] for r in results] == ["oracle-v0", "mixed-e5-r20-v0", "random-v0"]
    assert results[0].mean_return > results[1].mean_return > results[2].mean_return


def test_memoryless_oracle_fails_half_the_time() -> None:
    """The success checks bite: forgetting the cue (always turn north) succeeds only when the goal is north."""
    env = gym.make("rlt/TMaze-v0", corridor_length=5)
    successes = []
    for seed in range(200):
        env.reset(seed=seed)
        for _ in range(5):
            env.step(0)
        successes.append(env.step(NORTH)[4]["success"])
    assert 0.35 < np.mean(successes) < 0.65


def test_a_failure_while_writing_leaves_nothing_listed(
    minari_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from minari.dataset._storages.hdf5_storage import HDF5Storage

    original = HDF5Storage.update_episodes
    written: list[Path] = []

    def dies_after_three(self: Any, episodes: Any) -> None:
        original(self, list(episodes)[:3])  # three episodes really reach the HDF5 file
        written.append(Path(self._file_path))
        raise KeyboardInterrupt("simulated kill")

    monkeypatch.setattr(HDF5Storage, "update_episodes", dies_after_three)
    with pytest.raises(KeyboardInterrupt):
        build_memory_datasets(_config(minari_root))
    assert written and any(part.startswith(".rlt-build-") for part in written[0].parts)
    assert _listed(minari_root) == []
    assert not dataset_path("rlt/tmaze-10/oracle-v0", minari_root).exists()


def test_a_hard_kill_while_writing_leaves_nothing_listed_and_the_rerun_completes(minari_root: Path) -> None:
    script = textwrap.dedent(
        f"""
        import os
        from minari.dataset._storages.hdf5_storage import HDF5Storage
        from offline_data.memory_build import MemoryBuildConfig, build_memory_datasets
        original = HDF5Storage.update_episodes
        def killed(self, episodes):
            original(self, list(episodes)[:3])
            os._exit(137)  # no cleanup runs, as under SIGKILL
        HDF5Storage.update_episodes = killed
        build_memory_datasets(MemoryBuildConfig(memory_lengths=(5, 10), num_episodes=24, num_ref_episodes=8,
                                                root={str(minari_root)!r}, progress=False))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 137, proc.stderr
    assert [p.name for p in minari_root.glob(".rlt-build-*")]  # the killed build's partial data is there...
    assert _listed(minari_root) == []  # ...and hidden from Minari
    results = build_memory_datasets(_config(minari_root, memory_lengths=(5, 10)))
    assert [r.kept for r in results] == [False, False]
    assert _listed(minari_root) == ["rlt/tmaze-10/oracle-v0", "rlt/tmaze-5/oracle-v0"]
    assert not list(minari_root.glob(".rlt-build-*"))  # the dead build's leftover was cleaned


def test_existing_dataset_is_kept_or_refused_never_silently_replaced(minari_root: Path) -> None:
    first = build_memory_datasets(_config(minari_root, memory_lengths=(5,)))[0]
    main_data = first.path / "data" / "main_data.hdf5"
    stamp = main_data.stat().st_mtime_ns
    # the same settings again: kept untouched; a new length is added (a multi-length build resumes)
    again = build_memory_datasets(_config(minari_root, memory_lengths=(5, 7)))
    assert [r.kept for r in again] == [True, False] and main_data.stat().st_mtime_ns == stamp
    # other data under the same id: refused before anything is written, the old dataset intact
    with pytest.raises(FileExistsError, match="--overwrite"):
        build_memory_datasets(_config(minari_root, memory_lengths=(9, 5), num_episodes=30))
    assert not dataset_path("rlt/tmaze-9/oracle-v0", minari_root).exists()
    dataset, _ = _minari_episodes(minari_root, first.dataset_id)
    assert dataset.total_episodes == 24 and main_data.stat().st_mtime_ns == stamp
    replaced = build_memory_datasets(
        _config(minari_root, memory_lengths=(5,), num_episodes=30, overwrite=True)
    )
    assert not replaced[0].kept
    assert _minari_episodes(minari_root, first.dataset_id)[0].total_episodes == 30


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"task": "tmaz"}, "valid: \\['repeat-previous', 'tmaze'\\]. Did you mean 'tmaze'"),
        ({"memory_lengths": (0,)}, "memory-lengths"),
        ({"memory_lengths": (5, 5)}, "memory-lengths"),
        ({"epsilon": 1.5}, "--epsilon must lie in \\[0, 1\\], got 1.5"),
        ({"random_share": -0.1}, "--random-share"),
        ({"num_episodes": 0}, "--num-episodes"),
        ({"dataset_name": "a b"}, "malformed Minari dataset id"),
    ],
)
def test_config_errors_name_the_bad_value(tmp_path: Path, overrides: dict[str, Any], match: str) -> None:
    with pytest.raises(DatasetError, match=match):
        _config(tmp_path, **overrides)


def test_cli_builds_then_refuses_other_settings_with_one_error_line(tmp_path: Path) -> None:
    root = tmp_path / "minari"
    cmd = [sys.executable, str(REPO / "scripts" / "make_memory_dataset.py"), "--task", "repeat-previous"]
    cmd += ["--memory-lengths", "4", "--epsilon", "0.1", "--num-episodes", "10", "--root", str(root)]
    proc = subprocess.run([*cmd, "--no-progress"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    (summary,) = json.loads(proc.stdout)["datasets"]
    assert summary["dataset_id"] == "rlt/repeat-previous-4/mixed-e10-r0-v0" and summary["kept"] is False
    assert len(load_episodes(summary["dataset_id"], root=root).episodes) == 10
    proc = subprocess.run([*cmd, "--seed", "1"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and "--overwrite" in proc.stderr
    assert "Traceback" not in proc.stderr
