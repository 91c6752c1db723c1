"""What the offline experiment drivers share (``experiments/offline_tmaze_dt/run.py``,
``experiments/offline_hopper/run.py``): the ``scripts/train_dt.py`` flags of a run's settings, one run of it (one
torch thread, its output to a log), the commit and whether the tree differed from it (a run from uncommitted code
is refused unless asked for), the machine, and the command a record names."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rl_transformers.runs.checkpoint_load import read_checkpoint
from rl_transformers.runs.ledger import note_resume, read_ledger, start_job
from rl_transformers.utils.atomic import atomic_write_json

ROOT = Path(__file__).resolve().parents[1]


def flags(settings: dict[str, Any]) -> list[str]:
    """``train_dt.py`` flags of ``settings`` (``backbone.x`` keys are backbone flags)."""
    out: list[str] = []
    for key, value in settings.items():
        out.append("--" + key.replace("_", "-"))
        out += [str(v) for v in value] if isinstance(value, list) else [str(value)]
    return out


def recorded_command(settings: dict[str, Any]) -> str:
    """The command a record names: ``train_dt.py`` with the settings' flags on the default dataset root."""
    return " ".join(["python", "scripts/train_dt.py", *flags(settings), "--dataset-root datasets/minari"])


def train_dt(
    settings: dict[str, Any], dataset_root: str | Path, run_root: Path, log: Path
) -> tuple[Path, float, list[int]]:
    """Run ``scripts/train_dt.py`` with ``settings`` under ``run_root`` (one torch thread, output to ``log``);
    (its run directory, wall seconds, the steps it resumed from). A run of the same settings stopped midway
    there (a killed job) resumes from its last checkpoint (``train_dt.py`` saves one at every evaluation), and
    the wall seconds are then those of the last stretch."""
    algo = str(settings.get("algo", "dt"))
    last = sorted(run_root.glob(f"{algo}/*/*/checkpoints/last.pt"), key=lambda p: p.stat().st_mtime)
    ledger = read_ledger(run_root)
    resumed: list[int] = []
    if last and ledger is not None and ledger.request == settings:
        resumed = note_resume(run_root, int(read_checkpoint(last[-1])["step"]))
        command = [
            sys.executable,
            "scripts/train_dt.py",
            "--resume",
            str(last[-1].parents[1]),
            "--no-progress",
        ]
    else:  # a fresh run, beside any of other settings
        start_job(run_root, settings)
        command = [sys.executable, "scripts/train_dt.py", *flags(settings)]
        command += ["--dataset-root", str(dataset_root), "--run-root", str(run_root), "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    start = time.time()
    with open(log, "a" if resumed else "w") as out:
        subprocess.run([*command, "--threads", "1"], cwd=ROOT, env=env, stdout=out, stderr=out, check=True)
    wall = time.time() - start
    return max((run_root / algo).glob("*/*"), key=lambda p: p.stat().st_mtime), wall, resumed


def write_record(
    out: Path,
    fields: dict[str, Any],
    settings: dict[str, Any],
    wall: float,
    commit: str,
    dirty: bool,
    resumed: list[int] | None = None,
) -> Path:
    """Write the record ``fields`` + the run's provenance (wall seconds, commit, whether the tree was dirty,
    machine, command; for a resumed run the steps it resumed from, ``resumed_at``, its wall seconds then the last
    stretch's) to ``out`` atomically: a kill leaves the old record or none, never half of one."""
    record = {
        **fields,
        **({"resumed_at": resumed} if resumed else {}),
        "wall_s": round(wall, 1),
        "commit": commit,
        "dirty": dirty,
        "machine": machine(),
        "command": recorded_command(settings),
    }
    return atomic_write_json(out, record, indent=1)


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def commit_state(records: Path) -> tuple[str, bool]:
    """(HEAD commit, whether the tree differs from it outside the records folder)."""
    exclude = (
        f":(exclude){records.resolve().relative_to(ROOT)}" if records.resolve().is_relative_to(ROOT) else ""
    )
    status = git("status", "--porcelain", "--", ".", *([exclude] if exclude else []))
    return git("rev-parse", "HEAD"), bool(status)


def checked_commit(records: Path, allow_dirty: bool) -> tuple[str, bool]:
    """:func:`commit_state`, exiting when the tree has uncommitted changes and ``allow_dirty`` is not set."""
    commit, dirty = commit_state(records)
    if dirty and not allow_dirty:
        sys.exit(f"uncommitted changes outside {records}: commit first (or --allow-dirty for tuning)")
    return commit, dirty


def machine() -> str:
    """CPU model, cores, OS and torch version of this machine."""
    import torch

    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [
            x.split(":", 1)[1].strip() for x in cpuinfo.read_text().splitlines() if x.startswith("model name")
        ]
        model = names[0] if names else model
    return f"{model}, {os.cpu_count()} cores, {platform.system()} {platform.release()}, torch {torch.__version__}"
