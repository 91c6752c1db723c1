"""The ledger of a job folder that may be killed and run again: what it was started for, where it resumed.

A long job (one seed of an experiment, one arm of a comparison) works in a folder of its own, and a later
invocation of the same job resumes the run checkpointed there. Its ledger, ``<folder>/job.json``, holds the
request the folder was started for (any JSON value: the job's flags or settings) and the steps each later
invocation resumed from, so the job's record can say how it ran. The caller compares the request with its own to
decide whether the folder's checkpoint belongs to it; what to do with a folder of another request (refuse it, or
start afresh beside it) is the caller's rule. Writes are atomic: a kill leaves the old ledger or the new one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_transformers.utils.atomic import atomic_write_json

LEDGER = "job.json"
"""The ledger's file name in its job folder."""


@dataclass(frozen=True)
class Ledger:
    """What a job folder was started for (``request``) and the steps its runs resumed from, oldest first."""

    request: Any
    resumed_at: list[int]


def read_ledger(folder: Path) -> Ledger | None:
    """The ledger of ``folder``, or None where no job was started there."""
    path = folder / LEDGER
    if not path.exists():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    return Ledger(data["request"], [int(s) for s in data["resumed_at"]])


def start_job(folder: Path, request: Any) -> None:
    """Start ``folder``'s ledger afresh for ``request`` (the folder is created where missing)."""
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_json(folder / LEDGER, {"request": request, "resumed_at": []})


def note_resume(folder: Path, step: int) -> list[int]:
    """Record in ``folder``'s ledger that its job resumes from ``step``; every step it resumed from so far."""
    ledger = read_ledger(folder)
    if ledger is None:
        raise FileNotFoundError(f"{folder / LEDGER}: no job was started in this folder")
    resumed = [*ledger.resumed_at, int(step)]
    atomic_write_json(folder / LEDGER, {"request": ledger.request, "resumed_at": resumed})
    return resumed
