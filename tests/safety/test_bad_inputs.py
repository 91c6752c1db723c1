"""Bad command-line / config input gets a clear error: the value, the valid choices or closest match, the flag.

In-process cases parse the real CLIs with tyro (as the scripts do) or build the configs; a few subprocess cases
check what a user sees: exit status 2, the message, no traceback (unless --debug).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import tyro

from rl_transformers.algos.dt_config import DTConfig
from rl_transformers.algos.ppo_config import PPOConfig, TrainConfig
from rl_transformers.backbone import BackboneConfig
from rl_transformers.backbone.cli import cli_registry
from rl_transformers.policies.gtrxl import PolicyConfig
from rl_transformers.runs.distributed import DistContext, resolve_device
from rl_transformers.utils.errors import UserError

ROOT = Path(__file__).resolve().parents[2]


def _cli_error(cls: type, args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The message tyro prints for ``args`` (exit status 2), box drawing removed and lines joined."""
    with pytest.raises(SystemExit) as info:
        tyro.cli(cls, registry=cli_registry(), args=args)
    assert info.value.code == 2
    text = capsys.readouterr().err
    assert "Traceback" not in text
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


# -- flags parsed by the CLIs (tyro prints the config's own check) ----------------------------------------------
CLI_CASES: dict[str, tuple[type, list[str], list[str]]] = {
    "memory option of the wrong type": (
        TrainConfig,
        ["--backbone.memory-options", '{"mem_len": "abc"}'],
        ["mem_len='abc'", "must be an int", "memory 'xl'", "--backbone.memory-options"],
    ),
    "unknown memory option": (
        TrainConfig,
        ["--backbone.memory-options", '{"mem_lenn": 8}'],
        ["unknown option 'mem_lenn'", "Did you mean 'mem_len'", "--backbone.memory-options"],
    ),
    "unknown attention": (
        TrainConfig,
        ["--backbone.attention", "lineer"],
        ["unknown attention 'lineer'", "Did you mean 'linear'", "--backbone.attention lineer"],
    ),
    "local window 0": (
        TrainConfig,
        ["--backbone.attention", "local", "--backbone.attention-options", '{"window": 0}'],
        ["window=0", "attend only itself", "--backbone.attention-options"],
    ),
    "local window negative": (
        TrainConfig,
        ["--backbone.attention", "local", "--backbone.attention-options", '{"window": -4}'],
        ["local window must be an int >= 0, got -4", "--backbone.attention-options"],
    ),
    "linear chunk size 0": (
        TrainConfig,
        ["--backbone.attention", "linear", "--backbone.attention-options", '{"chunk_size": 0}'],
        ["chunk_size", "0", "--backbone.attention-options"],
    ),
    "n_heads not dividing d_model": (
        TrainConfig,
        ["--backbone.n-heads", "3"],
        ["d_model=64 is not divisible by n_heads=3", "valid n_heads", "--backbone.n-heads 3"],
    ),
    "unknown device": (
        TrainConfig,
        ["--device", "cudaa"],
        ["'cudaa'", "cuda:N", "did you mean 'cuda'", "--device"],
    ),
    "minibatches not dividing the batch": (
        TrainConfig,
        ["--num-envs", "3", "--ppo.num-minibatches", "5"],
        ["num_minibatches=5", "--ppo.num-minibatches", "12 training sequences", "valid: 1, 2, 3, 4, 6, 12"],
    ),
    "seq_len not dividing num_steps": (
        TrainConfig,
        ["--ppo.num-steps", "20", "--ppo.seq-len", "16"],
        ["num_steps=20 must be a multiple of seq_len=16", "--ppo.seq-len"],
    ),
    "learning rate 0": (TrainConfig, ["--ppo.learning-rate", "0"], ["--ppo.learning-rate", "> 0, got 0"]),
    "negative budget": (TrainConfig, ["--total-timesteps", "-5"], ["--total-timesteps", ">= 1, got -5"]),
    "zero envs": (TrainConfig, ["--num-envs", "0"], ["--num-envs", ">= 1, got 0"]),
    "gamma above 1": (TrainConfig, ["--ppo.gamma", "1.5"], ["--ppo.gamma", "[0, 1], got 1.5"]),
    "DT unknown device": (DTConfig, ["--device", "gpu"], ["unknown device 'gpu'", "--device"]),
    "DT batch size 0": (DTConfig, ["--batch-size", "0"], ["--batch-size", ">= 1, got 0"]),
    "DT negative learning rate": (DTConfig, ["--learning-rate", "-1e-4"], ["--learning-rate", "> 0"]),
    "DT unknown aux-loss weight": (
        DTConfig,
        ["--backbone.depth", "universal", "--aux-weights", "act_pondr", "0.1"],
        ["unknown aux loss 'act_pondr'", "did you mean 'act_ponder'", "--aux-weights"],
    ),
}


@pytest.mark.parametrize("case", list(CLI_CASES))
def test_cli_flag_errors(case: str, capsys: pytest.CaptureFixture[str]) -> None:
    cls, args, fragments = CLI_CASES[case]
    message = _cli_error(cls, args, capsys)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


# -- checks made when the run starts (UserError -> run_cli) ------------------------------------------------------
def _aux_on_gru() -> None:
    TrainConfig(
        policy=PolicyConfig(kind="gru"), ppo=PPOConfig(aux_weights={"ponder": 0.1})
    ).check_aux_weights()


def _aux_typo() -> None:
    policy = PolicyConfig(backbone=BackboneConfig(depth="universal"))
    TrainConfig(policy=policy, ppo=PPOConfig(aux_weights={"act_pondr": 0.1})).check_aux_weights()


RUN_CASES: dict[str, tuple[Callable[[], object], list[str]]] = {
    "aux weight for a model without aux losses": (
        _aux_on_gru,
        ["unknown aux loss 'ponder'", "no aux losses", "--ppo.aux-weights"],
    ),
    "aux weight typo": (
        _aux_typo,
        ["unknown aux loss 'act_pondr'", "did you mean 'act_ponder'", "--ppo.aux-weights"],
    ),
    "unknown device at resolve time": (
        lambda: resolve_device("cuda:x", DistContext()),
        ["'cuda:x'", "valid: auto, cpu, cuda, cuda:N, mps", "--device"],
    ),
}


@pytest.mark.parametrize("case", list(RUN_CASES))
def test_run_time_errors(case: str) -> None:
    build, fragments = RUN_CASES[case]
    with pytest.raises(UserError) as info:
        build()
    for fragment in fragments:
        assert fragment in str(info.value), f"{fragment!r} not in {info.value}"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_cuda_requested_without_cuda() -> None:
    with pytest.raises(UserError, match=r"--device: device 'cuda' was asked for but CUDA is not available"):
        resolve_device("cuda", DistContext())


# -- what a user sees -----------------------------------------------------------------------------------------
def _run(script: str, *args: str, cwd: Path, debug: bool = False) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "400", "RLT_DEBUG": "0"}
    cmd = [sys.executable, str(ROOT / "scripts" / script), *args, *(["--debug"] if debug else [])]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def test_script_user_error_has_no_traceback(tmp_path: Path) -> None:
    """A check made after parsing (aux weights on a GRU policy) goes through run_cli: 'error:', status 2."""
    args = ["--policy", "gru", "--ppo.aux-weights", "ponder", "0.1", "--run-root", str(tmp_path / "runs")]
    proc = _run("train_gtrxl.py", *args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: --ppo.aux-weights: unknown aux loss 'ponder'"), proc.stderr
    assert "Traceback" not in proc.stderr
    debug = _run("train_gtrxl.py", *args, cwd=tmp_path, debug=True)
    assert debug.returncode != 0 and "Traceback" in debug.stderr and "UserError" in debug.stderr


@pytest.mark.parametrize(
    ("script", "args", "fragments"),
    [
        (
            "evaluate.py",
            ["no-such-run", "--episodes", "0"],
            ["episodes (--episodes) must be an int >= 1", "got 0"],
        ),
        (
            "train_gtrxl.py",
            ["--backbone.memory-options", '{"mem_len": "abc"}'],
            ["mem_len='abc' (str) must be an int", "--backbone.memory-options"],
        ),
    ],
    ids=["evaluate-episodes-0", "train-memory-options"],
)
def test_script_parse_errors(tmp_path: Path, script: str, args: list[str], fragments: list[str]) -> None:
    proc = _run(script, *args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    message = " ".join(re.sub(r"[│╭╮╰╯─]", " ", proc.stderr).split())
    for fragment in fragments:
        assert fragment in message, message


def test_evaluate_missing_run_is_a_user_error(tmp_path: Path) -> None:
    """A run directory that does not exist: 'error: <path>: no such run ...', status 2, no traceback."""
    proc = _run("evaluate.py", str(tmp_path / "no-such-run"), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"error: {tmp_path / 'no-such-run'}: no such run directory"), proc.stderr
