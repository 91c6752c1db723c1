"""Each ``rlt`` command is its script: the same ``--help`` (flags, defaults, text) but for the program name, the
same exit status and one-line message for a user error; a tiny run of ``rlt train-ppo`` -> ``rlt evaluate`` works
on the core dependencies alone (the extras' packages blocked) and ``rlt make-dataset`` end to end (the flags of
tests/e2e/test_train_gtrxl.py and tests/offline_data/test_build.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rl_transformers.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "COLUMNS": "120"}


def run(*argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, timeout=300, cwd=cwd, env=ENV
    )


def rlt(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return run("-m", "rl_transformers.cli", *args, cwd=cwd)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_help_is_the_scripts_help(name: str) -> None:
    script = f"scripts/{COMMANDS[name].script}.py"
    mine, theirs = rlt(name, "--help"), run(script, "--help")
    assert mine.returncode == theirs.returncode == 0, mine.stderr + theirs.stderr
    usage, rest = mine.stdout.split("\n", 1)
    assert usage.startswith(f"usage: rlt {name} [-h]")
    assert theirs.stdout == usage.replace(f"rlt {name}", script, 1) + "\n" + rest
    assert "--" in rest and len(rest.splitlines()) > 5  # flags listed, not an empty page


@pytest.mark.parametrize(
    ("name", "args", "message"),
    [
        ("train-dt", (), "error: --dataset is required"),  # a UserError of the command itself
        ("train-ppo", ("--backbone.attention", "ful"), "Did you mean 'full'"),  # a bad flag value (tyro)
    ],
)
def test_a_user_error_is_the_scripts_message_and_status(
    name: str, args: tuple[str, ...], message: str
) -> None:
    mine, theirs = rlt(name, *args), run(f"scripts/{COMMANDS[name].script}.py", *args)
    assert mine.returncode == theirs.returncode == 2
    assert message in mine.stdout + mine.stderr and "Traceback" not in mine.stderr
    script = f"scripts/{COMMANDS[name].script}.py"
    assert words(mine.stderr.replace(f"rlt {name}", script)) == words(theirs.stderr)


def words(text: str) -> list[str]:
    """A message without its box (tyro pads the box's lines to the program name's length)."""
    return text.translate({ord(c): " " for c in "│╭╮╰╯─"}).split()


TINY_PPO = ["--num-envs", "2", "--ppo.num-steps", "16", "--ppo.seq-len", "8", "--ppo.num-minibatches", "2",
            "--ppo.update-epochs", "1", "--backbone.d-model", "16", "--backbone.n-heads", "2",
            "--backbone.n-layers", "1", "--no-progress", "--seed", "5"]  # fmt: skip


CORE_ONLY = (
    "import sys\n"
    "for name in ('minari', 'h5py', 'stable_baselines3', 'scipy', 'matplotlib'):\n"
    "    sys.modules[name] = None  # as if not installed: importing it fails, find_spec says absent\n"
    "from rl_transformers.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)
"""``rlt`` in an install without the extras' packages (the lean core)."""


def core_only(*args: str) -> subprocess.CompletedProcess[str]:
    return run("-c", CORE_ONLY, *args)


def test_train_ppo_then_evaluate_without_the_extras(tmp_path: Path) -> None:
    """The core commands run on the core dependencies alone; a DT run names the extra it needs."""
    done = core_only("train-ppo", "--env-id", "rlt/TMaze-v0", "--env-kwargs", '{"corridor_length": 3}',
                     "--total-timesteps", "64", "--run-root", str(tmp_path), *TINY_PPO)  # fmt: skip
    assert done.returncode == 0, done.stderr
    (run_dir,) = (tmp_path / "ppo" / "rlt-TMaze-v0").iterdir()
    assert json.loads(done.stdout[done.stdout.index("{\n") :])["step"] == 64
    assert (run_dir / "checkpoints" / "last.pt").is_file()
    assert json.loads((run_dir / "config.json").read_text())["policy"]["backbone"]["d_model"] == 16
    done = core_only("evaluate", str(run_dir), "--episodes", "2")
    assert done.returncode == 0, done.stderr
    assert "over 2 episodes" in done.stdout
    assert (run_dir / "eval" / "evaluate-last.json").is_file()
    done = core_only("train-dt", "--dataset", "rlt/cartpole/medium-v0", "--run-root", str(tmp_path))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "needs minari, which is not installed: pip install 'rl-transformers[offline]'" in done.stderr


def test_make_dataset_random_only(tmp_path: Path) -> None:
    args = ["--env-id", "CartPole-v1", "--kinds", "random", "--num-episodes", "2", "--root", str(tmp_path)]
    args += ["--ref-min-score", "9", "--ref-max-score", "500", "--no-progress", "--dataset-prefix", "cli/cp"]
    done = rlt("make-dataset", *args)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["datasets"]["random"]["id"] == "cli/cp/random-v0"
    assert summary["ref_scores"] == [9.0, 500.0]
    assert Path(summary["datasets"]["random"]["path"]).is_dir()
