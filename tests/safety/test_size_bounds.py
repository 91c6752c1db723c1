"""Every size a checkpoint's config names is bounded before anything is built from it.

Before: a PPO checkpoint whose config said ``mem_len`` 10^6 was evaluated with gigabytes (10^9: an allocation
traceback, the XL memory preallocates (B, M, d) per layer) and ``n_layers`` 10^4 took 45 s and 1.3 GB before its
error. Now one estimate (:mod:`rl_transformers.agents.memory_bound`) is checked first: refused above the limit
with the estimate in the message, the limit raised knowingly with ``--max-memory-gib``; and a config describing
far more parameters than the weights it ships is refused before the shape check builds it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rl_transformers.agents import load
from rl_transformers.agents.memory_bound import DEFAULT_LIMIT_GIB, LIMIT_FLAG, backbone_bytes, check_memory
from rl_transformers.agents.ppo_agent import PPOAgent
from rl_transformers.algos.ppo import train
from rl_transformers.backbone import BackboneConfig
from rl_transformers.utils.errors import UserError
from tests.safety.runs import tiny
from tests.safety.test_dt_eval_env import run as dt_run  # noqa: F401  (the tiny DT run fixture)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = train(tiny(tmp_path_factory.mktemp("bounds"))).run_dir
    assert run_dir is not None
    return run_dir


def _copy_with(run_dir: Path, tmp_path: Path, change) -> Path:
    ckpt = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    change(ckpt)
    out = tmp_path / "run" / "checkpoints" / "last.pt"
    out.parent.mkdir(parents=True)
    torch.save(ckpt, out)
    return out


def _mem_len(value: int):
    def change(ckpt: dict) -> None:
        ckpt["config"]["policy"]["backbone"]["memory_options"]["mem_len"] = value

    return change


@pytest.mark.parametrize("mem_len", [10**7, 10**9])
def test_a_huge_mem_len_is_refused_with_the_estimate(ppo_run: Path, tmp_path: Path, mem_len: int) -> None:
    path = _copy_with(ppo_run, tmp_path, _mem_len(mem_len))
    start = time.perf_counter()
    with pytest.raises(UserError, match=r"needs an estimated [0-9.e+]+ GiB") as info:
        load(path)
    assert time.perf_counter() - start < 5  # refused before anything of that size was allocated
    assert LIMIT_FLAG in str(info.value) and str(path) in str(info.value)


def test_the_limit_is_raised_knowingly(ppo_run: Path, tmp_path: Path) -> None:
    path = _copy_with(ppo_run, tmp_path, _mem_len(10**5))
    agent = load(path)  # within the default limit
    assert isinstance(agent, PPOAgent) and agent.config.policy.backbone.options("memory").mem_len == 10**5
    with pytest.raises(UserError, match="needs an estimated"):
        load(path, max_memory_gib=0.01)
    with pytest.raises(UserError, match="positive number of GiB"):
        load(path, max_memory_gib=float("nan"))


def test_many_layers_next_to_one_layers_weights_are_refused_at_once(ppo_run: Path, tmp_path: Path) -> None:
    def change(ckpt: dict) -> None:
        ckpt["config"]["policy"]["backbone"]["n_layers"] = 10**4

    path = _copy_with(ppo_run, tmp_path, change)
    start = time.perf_counter()
    with pytest.raises(
        UserError, match=r"describes a model of about [0-9,]+ parameters, but the checkpoint ships"
    ):
        load(path)
    assert time.perf_counter() - start < 5


def test_dt_model_kwargs_are_bounded(dt_run: tuple[Path, Path], tmp_path: Path) -> None:  # noqa: F811
    run_dir, _ = dt_run

    def mem(ckpt: dict) -> None:
        ckpt["model_kwargs"]["backbone"].update(memory="xl", memory_options={"mem_len": 10**9})

    with pytest.raises(UserError, match="needs an estimated"):
        load(_copy_with(run_dir, tmp_path / "a", mem))

    def steps(ckpt: dict) -> None:
        ckpt["model_kwargs"]["max_ep_len"] = 10**9

    with pytest.raises(UserError, match="describes a model of about"):
        load(_copy_with(run_dir, tmp_path / "b", steps))


def test_the_estimate_grows_with_each_size() -> None:
    """Independent of the refusal: the estimate is monotone in every size it reads, and linear in mem_len."""
    base = BackboneConfig(d_model=16, n_layers=1, n_heads=2, memory="xl", memory_options={"mem_len": 1000})
    small = backbone_bytes(base, batch=2, tokens=8)
    for bigger in (
        BackboneConfig(d_model=32, n_layers=1, n_heads=2, memory="xl", memory_options={"mem_len": 1000}),
        BackboneConfig(d_model=16, n_layers=2, n_heads=2, memory="xl", memory_options={"mem_len": 1000}),
        BackboneConfig(d_model=16, n_layers=1, n_heads=2, memory="xl", memory_options={"mem_len": 2000}),
    ):
        assert backbone_bytes(bigger, batch=2, tokens=8) > small
    assert backbone_bytes(base, batch=4, tokens=8) > small
    # per extra memory slot: 1 layer x 6 d values for each of 2 sequences, plus each head's score (float32)
    more = BackboneConfig(d_model=16, n_layers=1, n_heads=2, memory="xl", memory_options={"mem_len": 1001})
    assert backbone_bytes(more, batch=2, tokens=8) - small == 4 * 2 * (6 * 16 + 2 * 8)
    check_memory(int(DEFAULT_LIMIT_GIB * 2**30), "x", "y")  # at the limit: accepted
    with pytest.raises(UserError):
        check_memory(int(DEFAULT_LIMIT_GIB * 2**30) + 1, "x", "y")


def test_evaluate_script_names_the_flag(ppo_run: Path, tmp_path: Path) -> None:
    path = _copy_with(ppo_run, tmp_path, _mem_len(10**9))
    out = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "evaluate.py"), str(path), "--episodes", "1"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 2 and out.stderr.startswith("error: ") and "Traceback" not in out.stderr
    assert LIMIT_FLAG in out.stderr and "GiB" in out.stderr
