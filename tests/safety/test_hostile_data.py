"""Hostile datasets and env ids built in the test: nothing a file names may run code.

Each case stores an env spec whose entry point is ``os:system`` with ``command`` = touch a marker file (or a
``module:`` id whose module writes the marker when imported), loads it through a public path and asserts
the marker was *not* created and the error names the file. ``test_the_attack_is_real`` shows gymnasium
itself would run the command, so the other tests can fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import h5py
import numpy as np
import pytest

from envs.resolve import EnvRefusedError, allow_env_modules, make_env, resolve_env
from offline_data import (
    DatasetInfo,
    d4rl_to_minari,
    load_episodes,
    read_d4rl_hdf5,
    read_minari,
    write_minari_dataset,
)
from offline_data.errors import DatasetError
from rl_transformers.algos.env_util import make_env_thunk, make_vec_env
from rl_transformers.algos.evaluation import evaluate_policy
from tests.safety.runs import random_episodes

REPO = Path(__file__).resolve().parents[2]


def _evil_spec(marker: Path, **extra: object) -> dict:
    return {"id": "Evil-v0", "entry_point": "os:system", "kwargs": {"command": f"touch {marker}"}, **extra}


def _evil_hdf5(path: Path, marker: Path, key: str = "env_spec", value: object = None) -> Path:
    episodes = random_episodes()
    with h5py.File(path, "w") as file:
        file["observations"] = np.concatenate([ep.observations for ep in episodes])
        file["actions"] = np.concatenate([ep.actions for ep in episodes])
        file["rewards"] = np.concatenate([ep.rewards for ep in episodes])
        file["terminals"] = np.concatenate([ep.terminations for ep in episodes])
        file["timeouts"] = np.concatenate([ep.truncations for ep in episodes])
        group = file.create_group("metadata")
        group.attrs[key] = json.dumps(_evil_spec(marker)) if value is None else value
    return path


def _evil_minari(root: Path, marker: Path, drop_spaces: bool = False) -> Path:
    path = write_minari_dataset("evil/data-v0", random_episodes(), env="Pendulum-v1", root=root)
    meta_path = path / "data" / "metadata.json"
    meta = json.loads(meta_path.read_text())
    evil = json.dumps(_evil_spec(marker, additional_wrappers=[]))  # parseable by Minari's EnvSpec.from_json
    meta["env_spec"] = evil
    meta["eval_env_spec"] = evil
    if drop_spaces:  # Minari itself would then gym.make the stored spec to find the spaces
        meta.pop("observation_space")
        meta.pop("action_space")
    meta_path.write_text(json.dumps(meta))
    return path


def test_the_attack_is_real(tmp_path: Path) -> None:
    """Without the resolver, gymnasium runs the command: the marker checks below are meaningful."""
    marker = tmp_path / "marker"
    spec = gym.envs.registration.EnvSpec.from_json(
        json.dumps(_evil_spec(marker) | {"additional_wrappers": []})
    )
    with pytest.raises(TypeError):  # os.system returns an int, not an Env -- after running the command
        gym.make(spec)
    assert marker.exists()


@pytest.mark.parametrize("key", ["env_spec", "env_id"])
def test_d4rl_readers_refuse_a_spec_naming_os_system(tmp_path: Path, key: str) -> None:
    marker = tmp_path / "marker"
    value = None if key == "env_spec" else "os:system"
    path = _evil_hdf5(tmp_path / "evil.hdf5", marker, key=key, value=value)
    for load in (
        lambda: read_d4rl_hdf5(path),
        lambda: load_episodes(path),
        lambda: load_episodes(str(path), env_id="Pendulum-v1"),
        lambda: d4rl_to_minari(path, "evil/converted-v0", root=tmp_path / "minari"),
    ):
        with pytest.raises(DatasetError, match=r"refused env spec.*evil\.hdf5.*--allow-env-modules"):
            load()
        assert not marker.exists()
    assert not (tmp_path / "minari" / "evil").exists()


@pytest.mark.parametrize("drop_spaces", [False, True])
def test_minari_readers_refuse_a_spec_naming_os_system(tmp_path: Path, drop_spaces: bool) -> None:
    import minari

    marker = tmp_path / "marker"
    root = tmp_path / "minari"
    path = _evil_minari(root, marker, drop_spaces)
    for load in (
        lambda: read_minari(path),
        lambda: read_minari("evil/data-v0", root=root),
        lambda: load_episodes(path),
        lambda: load_episodes(path / "data"),
        lambda: load_episodes("evil/data-v0", root=root),
    ):
        with pytest.raises(DatasetError, match=r"refused env spec.*metadata\.json"):
            load()
        assert not marker.exists()
    if not drop_spaces:  # an already opened MinariDataset is checked too
        dataset = minari.MinariDataset(path / "data")  # Minari parses the spec but does not make it
        with pytest.raises(DatasetError, match="refused env spec"):
            read_minari(dataset)
    assert not marker.exists()


def test_train_dt_refuses_an_evil_dataset(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    path = _evil_hdf5(tmp_path / "evil.hdf5", marker)
    cmd = [sys.executable, str(REPO / "scripts" / "train_dt.py"), "--dataset", str(path)]
    cmd += ["--total-steps", "2", "--run-root", str(tmp_path / "runs"), "--device", "cpu"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode != 0
    assert "refused env spec" in proc.stderr and str(path) in proc.stderr
    assert not marker.exists()


def _evil_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    """A module on sys.path that writes a marker when imported."""
    name = f"evil_mod_{os.getpid()}_{abs(hash(str(tmp_path)))}"
    marker = tmp_path / "imported"
    (tmp_path / f"{name}.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return name, marker


def test_module_prefixed_ids_import_nothing_unless_allowed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, marker = _evil_module(tmp_path, monkeypatch)
    for build in (
        lambda: make_vec_env(f"{name}:CartPole-v1", 2),
        lambda: make_vec_env("os:system", 1),
        lambda: make_env_thunk(f"{name}:CartPole-v1"),
        lambda: resolve_env(f"{name}:CartPole-v1", source="runs/x/config.json"),
    ):
        with pytest.raises(EnvRefusedError, match=r"refused env spec .*--allow-env-modules"):
            build()
        assert not marker.exists()
    # the user trusts the module on the command line: it is imported and the id resolves
    envs = make_vec_env(f"{name}:CartPole-v1", 1, allow_env_modules=[name])
    envs.close()
    assert marker.exists()


def test_process_wide_allow_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import envs.resolve as resolve

    name, marker = _evil_module(tmp_path, monkeypatch)
    monkeypatch.setattr(resolve, "_user_allowed", set())
    with pytest.raises(EnvRefusedError):
        resolve_env(f"{name}:CartPole-v1", source="--env-id")
    allow_env_modules([name])
    assert resolve_env(f"{name}:CartPole-v1", source="--env-id").id == "CartPole-v1" and marker.exists()


def test_entry_points_must_be_env_classes_of_allowed_packages(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    cases = [
        # a function of an allowed package is not an env class: gymnasium.make would import "os"
        {"id": "X-v0", "entry_point": "gymnasium.envs.registration:make", "kwargs": {"id": "os:system"}},
        {"id": "X-v0", "entry_point": "gymnasium.envs.registration:load_env_creator", "kwargs": {}},
        # an evil wrapper around a real env
        {
            "id": "CartPole-v1",
            "entry_point": "gymnasium.envs.classic_control.cartpole:CartPoleEnv",
            "additional_wrappers": [
                {"name": "w", "entry_point": "os:system", "kwargs": {"command": f"touch {marker}"}}
            ],
        },
        {
            "id": "CartPole-v1",
            "entry_point": "gymnasium.envs.classic_control.cartpole:CartPoleEnv",
            "vector_entry_point": "os:system",
        },
    ]
    for spec in cases:
        with pytest.raises(EnvRefusedError, match=r"file x\.json"):
            resolve_env(spec, source="file x.json")
        with pytest.raises(EnvRefusedError):
            resolve_env(json.dumps(spec), source="file x.json")
    assert not marker.exists()
    # an env class of an allowed package under an unregistered id is fine (and keeps the file's time limit)
    ok = {
        "id": "MyPole-v0",
        "entry_point": "gymnasium.envs.classic_control.cartpole:CartPoleEnv",
        "max_episode_steps": 7,
    }
    env = make_env(ok, source="file x.json")
    assert env.spec.max_episode_steps == 7
    env.close()


def test_hand_built_dataset_info_is_checked_again(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    spec = gym.envs.registration.EnvSpec.from_json(
        json.dumps(_evil_spec(marker) | {"additional_wrappers": []})
    )
    box = gym.spaces.Box(-1, 1, (3,))
    info = DatasetInfo(
        source="hand.hdf5", format="d4rl_hdf5", observation_space=box, action_space=box, env_spec=spec
    )
    with pytest.raises(EnvRefusedError, match=r"hand\.hdf5"):
        info.make_env()
    assert not marker.exists()


def test_evaluate_policy_refuses_before_building(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name, marker = _evil_module(tmp_path, monkeypatch)
    with pytest.raises(EnvRefusedError):
        evaluate_policy(None, f"{name}:CartPole-v1", None, n_episodes=1, seed=0, seq_len=4)  # type: ignore[arg-type]
    assert not marker.exists()


def test_evil_spec_in_a_subprocess_never_runs(tmp_path: Path) -> None:
    """The same refusal through a fresh interpreter (no state left by other tests)."""
    marker = tmp_path / "marker"
    path = _evil_hdf5(tmp_path / "evil.hdf5", marker)
    code = textwrap.dedent(
        f"""
        from offline_data import load_episodes
        try:
            load_episodes({str(path)!r})
        except ValueError as err:
            print("refused:", err)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert "refused: refused env spec 'Evil-v0'" in out.stdout, out.stderr
    assert not marker.exists()
