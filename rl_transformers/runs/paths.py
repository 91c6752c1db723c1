"""Files of a run stay inside its run directory: symbolic links out of it are refused, never followed.

A run directory may be shared (copied, mounted, handed over by another user). Its ``checkpoints/`` or
``eval/`` being a symbolic link would make a trainer prune ``step_<n>.pt`` files, replace ``last.pt`` or write
evaluation files in whatever directory the link points to. Every writer therefore checks the entries it writes
through (:data:`RUN_ENTRIES`) with :func:`check_run_dir` when a run starts, and :func:`run_subdir` whenever it
opens one of the subdirectories on its own (the checkpoint manager, ``evaluate.py``'s default output). A link
is refused with :class:`RunDirError` naming it, where it points and the fix. The run directory itself may be a
link (the user chose where runs live); only what lies inside it is checked. Files inside ``checkpoints/``
that are links are harmless: every write replaces the link itself (``os.replace``), every prune removes only
the link.
"""

from __future__ import annotations

import os
from pathlib import Path

from rl_transformers.utils.errors import UserError

__all__ = ["RUN_ENTRIES", "RunDirError", "check_run_dir", "run_subdir"]

RUN_SUBDIRS = ("checkpoints", "eval")
"""Subdirectories of a run that trainers and ``evaluate.py`` write into."""
RUN_ENTRIES = (*RUN_SUBDIRS, "progress.jsonl", "config.json", "system_info.json", "run.lock")
"""Entries of a run directory that its writers open, append to or replace."""


class RunDirError(UserError):
    """An entry of a run directory that would take a write outside it (a symbolic link)."""


def _refuse_link(path: Path) -> None:
    if path.is_symlink():
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        raise RunDirError(
            f"{path} is a symbolic link (to {target}); files of a run are written only inside its directory, so "
            f"it is not followed. Replace the link by a real directory or file (e.g. rm {path}, then copy "
            "what you need into the run)"
        )


def check_run_dir(run_dir: str | Path) -> Path:
    """Refuse (:class:`RunDirError`) a run directory whose written entries (:data:`RUN_ENTRIES`) are symbolic
    links or whose subdirectories are not directories; returns ``run_dir``."""
    run_dir = Path(run_dir)
    for name in RUN_ENTRIES:
        _refuse_link(run_dir / name)
    for name in RUN_SUBDIRS:
        path = run_dir / name
        if path.exists() and not path.is_dir():
            raise RunDirError(f"{path} is not a directory; a run keeps its {name} files there: move it away")
    return run_dir


def run_subdir(run_dir: str | Path, name: str, *, create: bool = True) -> Path:
    """``run_dir/name`` (``checkpoints`` / ``eval``), created if missing, refused when it is a symbolic link."""
    path = Path(run_dir) / name
    _refuse_link(path)
    if create:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise RunDirError(
                f"{path} is not a directory; a run keeps its {name} files there: move it away"
            ) from None
    _refuse_link(path)  # made a link meanwhile
    return path
