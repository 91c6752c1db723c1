"""envs.resolve: unknown ids get the closest registered ids, bad kwargs name the env and keyword."""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
from pathlib import Path

import pytest

from envs.resolve import EnvKwargsError, UnknownEnvError, make_env, resolve_env
from rl_transformers.algos.env_util import make_vec_env
from rl_transformers.utils.errors import UserError

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("env_id", "closest"),
    [
        ("CartPol-v1", "CartPole-v1"),
        ("rlt/TMaze-v7", "rlt/TMaze-v0"),
        ("tmaze", "rlt/TMaze-v0"),
        ("Pendulum-v9", "Pendulum-v1"),
    ],
)
def test_unknown_ids_name_the_closest_registered_ids(env_id: str, closest: str) -> None:
    with pytest.raises(UnknownEnvError, match=r"unknown environment id .*\(from --env-id\).*Closest") as info:
        make_vec_env(env_id, 1)
    assert f"'{closest}'" in str(info.value)
    assert isinstance(info.value, UserError)  # printed without a traceback by the CLIs


def test_registered_ids_resolve_as_gymnasium_does() -> None:
    assert resolve_env("CartPole-v1", source="t").entry_point.endswith(":CartPoleEnv")
    assert resolve_env("CartPole", source="t").id == "CartPole-v1"  # unversioned: the latest version
    assert resolve_env("rlt/TMaze-v0", source="t").kwargs == {"corridor_length": 10}


def test_bad_env_kwargs_name_the_env_and_the_keyword() -> None:
    with pytest.raises(
        EnvKwargsError,
        match=r"'rlt/TMaze-v0' does not accept the keyword argument 'corridor_lenght'.*'corridor_length'",
    ):
        make_vec_env("rlt/TMaze-v0", 2, {"corridor_lenght": 5})
    with pytest.raises(
        EnvKwargsError,
        match=r"building env 'rlt/TMaze-v0' with keyword arguments \{'corridor_length': 'abc'\}",
    ):
        make_env("rlt/TMaze-v0", source="--env-kwargs", corridor_length="abc")
    envs = make_vec_env("rlt/TMaze-v0", 2, {"corridor_length": 3})
    assert envs.num_envs == 2
    envs.close()


@pytest.mark.skipif(
    mp.get_start_method() != "fork", reason="the platform starts processes by spawn / forkserver"
)
def test_async_envs_work_from_a_script_without_a_main_guard(tmp_path: Path) -> None:
    """Python's default start method (fork on Linux before 3.14) is kept on purpose: spawn / forkserver re-import
    the user's script in every env worker, which crashes a script without ``if __name__ == "__main__":``."""
    script = tmp_path / "unguarded.py"
    script.write_text(
        "from rl_transformers.algos.env_util import make_vec_env\n"
        "envs = make_vec_env('rlt/TMaze-v0', 2, {'corridor_length': 3}, vectorization='async')\n"
        "print('observations', envs.reset(seed=0)[0].tolist())\n"
        "envs.close()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("observations [[")
