"""utils/process.py: the one process-alive check (study job locks, dataset-build leftovers)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rl_transformers.utils.process import process_alive

ROOT = Path(__file__).resolve().parents[2]


def test_live_and_dead_processes() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert process_alive(child.pid) and process_alive(os.getpid())
    finally:
        child.kill()
        child.wait()
    assert not process_alive(child.pid)  # reaped: the pid names no process now


@pytest.mark.parametrize(
    "pid", [0, -1, -os.getpid(), 2**63], ids=["zero", "minus-one", "a-group", "overflow"]
)
def test_group_addresses_and_impossible_pids_are_no_process(pid: int) -> None:
    assert not process_alive(pid)


def test_init_of_another_user_is_alive() -> None:
    if os.geteuid() == 0:
        pytest.skip("root may signal every process: no PermissionError to exercise")
    assert process_alive(1)


def test_no_other_module_checks_processes_itself() -> None:
    """One check: ``os.kill(pid, 0)`` appears nowhere else in the package."""
    hits = [
        path.relative_to(ROOT).as_posix()
        for folder in ("rl_transformers", "offline_data", "envs", "scripts")
        for path in (ROOT / folder).rglob("*.py")
        if re.search(r"os\.kill\([^,()]+,\s*0\)", path.read_text())
    ]
    assert hits == ["rl_transformers/utils/process.py"]
