"""Atomic file writes: the one implementation every writer of the suite uses (checkpoints, configs, logs,
evaluation reports, study records, benchmark results).

Method: write into a fresh temporary file in the destination's directory (``mkstemp``: a unique name, so two
processes writing the same target never share a temp file), flush and ``fsync`` it, ``os.replace`` it over the
target, then ``fsync`` the directory so the rename itself survives a power cut. A crash, a kill or Ctrl-C at any
moment leaves either the old file or the new one, never a torn one; on any failure (``KeyboardInterrupt``
included) the temp file is removed and the target is untouched. Files get mode 0644, as a plain write would.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

__all__ = ["atomic_link", "atomic_write", "atomic_write_json", "atomic_write_text", "fsync_dir"]


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Make a rename in ``directory`` durable (POSIX); silently skipped where directories can't be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _temp_path(path: Path) -> tuple[int, Path]:
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    return fd, Path(name)


def atomic_write(path: str | os.PathLike[str], write: Callable[[IO[bytes]], Any]) -> Path:
    """Call ``write(f)`` on a binary temp file beside ``path``, then put it in place atomically (see the
    module docstring). Creates the parent directory. Returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _temp_path(path)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically. Returns ``path``."""
    data = text.encode("utf-8")
    return atomic_write(path, lambda f: f.write(data))


def atomic_write_json(path: str | os.PathLike[str], data: Any, indent: int | None = 2, **dumps: Any) -> Path:
    """Write ``data`` as JSON (``indent``, a final newline; ``dumps`` go to :func:`json.dumps`) to ``path``
    atomically. Returns ``path``."""
    return atomic_write_text(path, json.dumps(data, indent=indent, **dumps) + "\n")


def atomic_link(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """Make ``dst`` an (atomic) hard link to ``src``, or a copy where hard links are not supported."""
    dst = Path(dst)
    fd, tmp = _temp_path(dst)
    os.close(fd)
    tmp.unlink()
    try:
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
