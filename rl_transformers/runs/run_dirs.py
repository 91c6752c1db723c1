"""Run directories: every training run gets its own ``<root>/<algo>/<name>/<YYYYmmdd-HHMMSS>-s<seed>/``.

``checkpoints/`` and ``eval/`` sit inside. The directory is claimed with an atomic ``mkdir``, so two runs that
start in the same second (e.g. a seed sweep) get ``...-s<seed>``, ``...-s<seed>_1`` and never share files.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

__all__ = ["make_run_dir", "sanitize_name"]


_UNSAFE = re.compile(r"[^A-Za-z0-9._=+-]+")


def sanitize_name(name: str) -> str:
    """``name`` made safe as one path component: ``/``, ``:``, spaces and other odd characters become ``-``.

    >>> sanitize_name("mujoco/halfcheetah/medium-v0")
    'mujoco-halfcheetah-medium-v0'
    """
    clean = _UNSAFE.sub("-", str(name)).strip("-.")
    return clean or "unnamed"


def make_run_dir(
    root: str | Path = "runs", *, algo: str, name: str, seed: int, now: datetime | None = None
) -> Path:
    """Create and return ``root/<algo>/<name>/<YYYYmmdd-HHMMSS>-s<seed>/`` with ``checkpoints/`` and ``eval/``.

    ``algo`` and ``name`` (an env id or dataset id) are sanitised by :func:`sanitize_name`. If the directory
    already exists (another run started in the same second), ``_1``, ``_2`` ... is appended. ``now`` fixes
    the timestamp (tests); default is the local time.
    """
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    parent = Path(root) / sanitize_name(algo) / sanitize_name(name)
    parent.mkdir(parents=True, exist_ok=True)
    base = f"{stamp}-s{int(seed)}"
    for attempt in range(10_000):
        run_dir = parent / (base if attempt == 0 else f"{base}_{attempt}")
        try:
            run_dir.mkdir()  # atomic: exactly one process wins a given name
        except FileExistsError:
            continue
        (run_dir / "checkpoints").mkdir()
        (run_dir / "eval").mkdir()
        return run_dir
    raise RuntimeError(f"could not create a fresh run directory under {parent} for {base}")
