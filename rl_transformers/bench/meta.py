"""Provenance of a benchmark table: the code's git commit and the machine it ran on.

The commit is read from the checkout that holds the imported ``rl_transformers`` package (``git -C <package
dir>``), never from the current directory, so a table written from anywhere names the code that produced it
(None when the package is not inside a git checkout, e.g. installed from a wheel). ``-dirty`` is appended when
that checkout has uncommitted changes to tracked files.
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from rl_transformers.bench.config import cpu_count

PACKAGE_DIR = Path(__file__).resolve().parent.parent
"""Directory of the ``rl_transformers`` package (its checkout is the one whose commit is recorded)."""


def git_sha(directory: Path | str = PACKAGE_DIR) -> str | None:
    """HEAD of the git checkout containing ``directory`` (+ ``-dirty``), or None outside a checkout."""
    base = ["git", "-C", str(directory)]
    try:
        sha = subprocess.run(
            [*base, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        )
        dirty = subprocess.run(
            [*base, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return sha.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


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
        "cores": cpu_count(),
        "loadavg_start": list(os.getloadavg()),
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def finish_machine_info(info: dict[str, Any]) -> dict[str, Any]:
    """``info`` from :func:`machine_info` taken before a measurement, plus the load and time after it."""
    return info | {
        "loadavg_end": list(os.getloadavg()),
        "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def load_text(meta: dict[str, Any]) -> str:
    """The 1-minute load average at the start of a measurement and, when recorded, at its end."""
    text = f"load at start {meta.get('loadavg_start', ['?'])[0]}"
    if "loadavg_end" in meta:
        text += f", at end {meta['loadavg_end'][0]} ({meta.get('timestamp')} to {meta.get('finished')})"
    return text
