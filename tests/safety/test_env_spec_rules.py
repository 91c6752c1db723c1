"""What an env spec from a file may ask for beyond its env: wrappers by callable from a named list,
no keyword that names a path, bounded sizes (envs/file_rules.py through envs/resolve.py)."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import pytest

from envs.file_rules import HARMLESS_WRAPPERS, MAX_FILE_INT
from envs.resolve import EnvRefusedError, make_env, resolve_env

CARTPOLE = "gymnasium.envs.classic_control.cartpole:CartPoleEnv"


def spec_with(*wrappers: dict, **extra) -> dict:
    return {"id": "CartPole-v1", "entry_point": CARTPOLE, "additional_wrappers": list(wrappers), **extra}


def record_video(folder: Path) -> dict:
    return {
        "name": "RecordVideo",
        "entry_point": "gymnasium.wrappers:RecordVideo",
        "kwargs": {"video_folder": str(folder)},
    }


def test_record_video_from_a_file_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "videos"
    for spec in (spec_with(record_video(folder)), json.dumps(spec_with(record_video(folder)))):
        with pytest.raises(EnvRefusedError, match=r"gymnasium\.wrappers:RecordVideo") as info:
            make_env(spec, source="file x.json")
        assert "file x.json" in str(info.value) and "TimeLimit" in str(info.value)  # names the allowed list
    # the class under its defining module is the same callable, refused the same way
    moved = {**record_video(folder), "entry_point": f"{gym.wrappers.RecordVideo.__module__}:RecordVideo"}
    with pytest.raises(EnvRefusedError, match="is not one of the wrappers"):
        resolve_env(spec_with(moved), source="file x.json")
    assert not folder.exists()


@pytest.mark.parametrize(
    "entry_point",
    [
        "gymnasium.wrappers:RescaleAction",
        "gymnasium.wrappers:TransformObservation",
        "gymnasium.wrappers:HumanRendering",
    ],
)
def test_other_gymnasium_wrappers_are_refused(entry_point: str) -> None:
    with pytest.raises(EnvRefusedError, match="is not one of the wrappers"):
        resolve_env(spec_with({"name": "w", "entry_point": entry_point, "kwargs": {}}), source="file x.json")


def test_the_harmless_wrappers_still_load_under_any_module_path() -> None:
    wrappers = [
        {
            "name": "TimeLimit",
            "entry_point": "gymnasium.wrappers.common:TimeLimit",
            "kwargs": {"max_episode_steps": 9},
        },
        {"name": "Stats", "entry_point": "gymnasium.wrappers:RecordEpisodeStatistics", "kwargs": {}},
        {"name": "Flat", "entry_point": "envs.wrappers:FloatFlattenObservation", "kwargs": {}},
    ]
    env = make_env(spec_with(*wrappers), source="file x.json")
    try:
        assert isinstance(env, gym.wrappers.common.RecordEpisodeStatistics | gym.Wrapper)
        names = []
        inner = env
        while isinstance(inner, gym.Wrapper):
            names.append(type(inner).__name__)
            inner = inner.env
        assert {"TimeLimit", "RecordEpisodeStatistics", "FloatFlattenObservation"} <= set(names)
    finally:
        env.close()
    assert len(HARMLESS_WRAPPERS) == len(set(HARMLESS_WRAPPERS))


def test_a_user_allowed_module_admits_its_wrappers_but_never_paths(tmp_path: Path) -> None:
    folder = tmp_path / "videos"
    spec = spec_with(record_video(folder))
    with pytest.raises(EnvRefusedError, match="names a path option 'video_folder'"):
        resolve_env(spec, source="file x.json", allow_modules=["gymnasium.wrappers"])
    plain = {"name": "RecordVideo", "entry_point": "gymnasium.wrappers:RecordVideo", "kwargs": {}}
    assert resolve_env(spec_with(plain), source="file x.json", allow_modules=["gymnasium.wrappers"])
    with pytest.raises(EnvRefusedError):
        resolve_env(spec_with(plain), source="file x.json")
    assert not folder.exists()


@pytest.mark.parametrize(
    "kwargs,expected",
    [
        ({"xml_file": "model.xml"}, "path option 'xml_file'"),
        ({"log_dir": "x"}, "path option 'log_dir'"),
        ({"name": "/etc/passwd"}, "looks like a path"),
        ({"name": "~/secrets"}, "looks like a path"),
        ({"corridor_length": MAX_FILE_INT + 1}, f"corridor_length={MAX_FILE_INT + 1} is larger than"),
        ({"sizes": [1, 2, -(10**12)]}, "sizes[2]=-1000000000000 is larger than"),
        ({"nested": {"folder": "a"}}, "path option 'folder'"),
    ],
    ids=["xml-file", "log-dir", "absolute-value", "home-value", "huge-int", "huge-in-list", "nested-path"],
)
def test_file_kwargs_naming_paths_or_huge_sizes_are_refused(kwargs: dict, expected: str) -> None:
    spec = {"id": "rlt/TMazeShort-v0", "entry_point": "envs.tmaze:TMazeEnv", "kwargs": kwargs}
    with pytest.raises(EnvRefusedError) as info:
        resolve_env(spec, source="dataset d.hdf5")
    assert expected in str(info.value) and "dataset d.hdf5" in str(info.value)


def test_huge_time_limit_and_wrapper_kwargs_are_refused() -> None:
    with pytest.raises(EnvRefusedError, match="max_episode_steps=1000000000 is larger"):
        resolve_env(spec_with(max_episode_steps=10**9), source="file x.json")
    limit = {
        "name": "T",
        "entry_point": "gymnasium.wrappers:TimeLimit",
        "kwargs": {"max_episode_steps": 10**9},
    }
    with pytest.raises(EnvRefusedError, match="larger than"):
        resolve_env(spec_with(limit), source="file x.json")


def test_the_projects_own_specs_pass() -> None:
    """Every env this project registers, written out as a file would store it, resolves again unchanged."""
    import envs

    envs.register_all()
    for env_id in [i for i in gym.registry if i.startswith("rlt/")]:
        data = (
            json.loads(gym.registry[env_id].to_json())
            if isinstance(gym.registry[env_id].entry_point, str)
            else None
        )
        if data is None:
            continue
        spec = resolve_env(data, source="file x.json")
        assert spec.id == env_id and spec.kwargs == data["kwargs"] and spec.entry_point == data["entry_point"]
