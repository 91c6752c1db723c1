"""Provenance: which code, on which machine, produced a run or a measurement.

:func:`git_sha` reads the commit of the checkout that holds the imported ``rl_transformers`` package
(``git -C <package dir>``), never of the current directory, so a record written from anywhere names the code
that produced it (None when the package is not inside a git checkout, e.g. installed from a wheel); ``-dirty``
is appended when that checkout has uncommitted changes to tracked files.

:func:`machine_info` is the record itself (versions, device, threads, cores, load, time, commit). Benchmarks
store it beside their tables (`benchmarks/studies/meta.py`); every training run appends one per invocation
to ``<run>/system_info.json`` (:func:`record_invocation`), so a number read from a run names its commit and
machine without anyone having to write them down.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from rl_transformers.utils.atomic import atomic_write_json
from rl_transformers.utils.training import available_cores

__all__ = [
    "PACKAGE_DIR",
    "SYSTEM_INFO_FILE",
    "device_name",
    "finish_machine_info",
    "git_output",
    "git_sha",
    "machine_info",
    "read_invocations",
    "record_invocation",
]

PACKAGE_DIR = Path(__file__).resolve().parent.parent
"""Directory of the ``rl_transformers`` package (its checkout is the one whose commit is recorded)."""

SYSTEM_INFO_FILE = "system_info.json"
"""File of a run directory holding one :func:`machine_info` record (plus the command) per invocation."""


def git_output(directory: Path | str, *args: str, timeout: float = 10) -> str:
    """The stripped stdout of ``git -C directory args`` (``--no-optional-locks``, so it never takes the index
    lock a user's ``git commit`` needs); raises ``OSError`` / ``subprocess.SubprocessError`` on failure."""
    base = ["git", "--no-optional-locks", "-C", str(directory)]
    return subprocess.run(
        [*base, *args], capture_output=True, text=True, timeout=timeout, check=True
    ).stdout.strip()


def git_sha(directory: Path | str = PACKAGE_DIR) -> str | None:
    """HEAD of the git checkout containing ``directory`` (+ ``-dirty``), or None outside a checkout.

    When the status check fails or times out the commit is still returned, marked ``-status-unknown``."""
    try:
        sha = git_output(directory, "rev-parse", "HEAD", timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    try:
        dirty = git_output(directory, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return sha + "-status-unknown"
    return sha + ("-dirty" if dirty else "")


def device_name(device: torch.device) -> str:
    """GPU name, or the CPU model name from /proc/cpuinfo."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def _load() -> list[float] | None:
    """The 1, 5 and 15-minute load averages (None where the OS has none, e.g. Windows)."""
    try:
        return list(os.getloadavg())
    except (AttributeError, OSError):
        return None


def machine_info(device: torch.device | str = "cpu", threads: int | None = None) -> dict[str, Any]:
    """Versions, device, threads, load and time of a run (plus the git commit of the package)."""
    device = torch.device(device)
    return {
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "device": str(device),
        "device_name": device_name(device),
        "git_sha": git_sha(),
        "threads": torch.get_num_threads() if threads is None else threads,
        "cores": available_cores(),
        "loadavg_start": _load(),
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def finish_machine_info(info: dict[str, Any]) -> dict[str, Any]:
    """``info`` from :func:`machine_info` taken before a measurement, plus the load and time after it."""
    return info | {
        "loadavg_end": _load(),
        "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def read_invocations(run_dir: str | Path) -> list[dict[str, Any]]:
    """The invocation records of ``run_dir`` (oldest first); [] for runs written before the file existed.

    A file that is not the documented JSON shape raises ``ValueError`` naming it (it is data, read with
    ``json`` only)."""
    path = Path(run_dir) / SYSTEM_INFO_FILE
    if not path.is_file():
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from err
    records = data.get("invocations") if isinstance(data, dict) else None
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise ValueError(f"{path}: expected {{'invocations': [{{...}}, ...]}}")
    return records


def record_invocation(
    run_dir: str | Path, device: torch.device | str, *, step: int, world_size: int = 1
) -> dict[str, Any]:
    """Append this process's :func:`machine_info`, command line, start ``step`` (0 fresh, >0 resumed) and
    world size to ``<run_dir>/system_info.json`` (rewritten atomically); returns the new record. An unreadable
    file is moved to ``system_info.json.unreadable`` with a warning (the run goes on)."""
    record = {
        "command": [Path(sys.argv[0]).name, *sys.argv[1:]] if sys.argv and sys.argv[0] else [],
        "start_step": int(step),
        "world_size": int(world_size),
        **machine_info(device),
    }
    try:
        records = read_invocations(run_dir)
    except ValueError as err:  # never lose a run over its provenance: keep the bad file aside, start anew
        path = Path(run_dir) / SYSTEM_INFO_FILE
        aside = path.with_name(path.name + ".unreadable")
        os.replace(path, aside)
        print(f"warning: {err}; moved to {aside} and started a new record", file=sys.stderr)
        records = []
    atomic_write_json(Path(run_dir) / SYSTEM_INFO_FILE, {"invocations": [*records, record]})
    return record
