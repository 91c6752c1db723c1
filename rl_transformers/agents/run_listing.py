"""What to say when a run directory does not exist: the runs that do, closest first.

A pasted placeholder (``runs/ppo/rlt-TMaze-v0/<run>``) or a mistyped timestamp should not end in a bare "no
such run directory". :func:`missing_run_message` finds the deepest part of the path that exists (the run root,
``runs/ppo/<env>/`` or above), lists the run directories below it (folders holding ``config.json``, as every
trainer writes), and orders them: names close to the one given first (``difflib``), then the newest. The walk
is bounded (depth and folder count), and the working directory, the home folder or ``/`` is never walked: then
the message names the first missing part instead.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

MAX_DEPTH = 4
"""Levels walked below the existing ancestor (``runs/`` -> ``ppo/<env>/<run>`` is 3)."""
MAX_FOLDERS = 5_000
"""Folders visited at most (a huge tree is cut short, never walked whole)."""


def run_dirs_below(root: Path, max_depth: int = MAX_DEPTH, max_folders: int = MAX_FOLDERS) -> list[Path]:
    """Run directories (holding ``config.json``) at most ``max_depth`` levels below ``root``."""
    found: list[Path] = []
    for visited, (top, dirs, files) in enumerate(os.walk(root), start=1):
        here = Path(top)
        depth = len(here.relative_to(root).parts)
        if "config.json" in files and depth > 0:
            found.append(here)
            dirs.clear()  # nothing to find inside a run
        elif depth >= max_depth:
            dirs.clear()
        else:
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        if visited >= max_folders:
            break
    return found


def _existing_ancestor(path: Path) -> Path | None:
    for parent in path.parents:
        if parent.is_dir():
            return parent
    return None


def missing_run_message(
    path: str | Path, what: str = "run directory or checkpoint file", limit: int = 5
) -> str:
    """``"<path>: no such <what>; runs under <root>, closest first: a, b, ... (N in all)"`` (one line)."""
    path = Path(path)
    head = f"{path}: no such {what}"
    root = _existing_ancestor(path)
    unwalked = {Path("."), Path("/"), Path.cwd(), Path.home()}
    if root is None or root in unwalked or root.resolve() in unwalked:
        below = root if root is not None else Path(".")
        missing = below / path.relative_to(below).parts[0] if path.is_relative_to(below) else path
        return f"{head} ({missing} does not exist: train a run first, e.g. make train)"
    runs = run_dirs_below(root)
    if not runs:
        return f"{head}; {root} holds no run (no config.json below it)"
    close = difflib.get_close_matches(path.name, [r.name for r in runs], n=len(runs), cutoff=0.6)
    rank = {name: i for i, name in enumerate(close)}
    newest_first = sorted(runs, key=lambda r: r.name, reverse=True)  # <YYYYmmdd-HHMMSS>-s<seed> names
    ordered = sorted(newest_first, key=lambda r: rank.get(r.name, len(rank)))
    shown = ", ".join(str(r) for r in ordered[:limit])
    more = f" ({len(runs)} in all)" if len(runs) > limit else ""
    return f"{head}; runs under {root}, closest first: {shown}{more}"


__all__ = ["missing_run_message", "run_dirs_below"]
