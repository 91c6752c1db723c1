"""Atomic file and directory writes: the one implementation every writer of the suite uses (checkpoints,
configs, logs, evaluation reports, study records, benchmark results, datasets).

Method: write into a fresh temporary file in the destination's directory (``mkstemp``: a unique name, so two
processes writing the same target never share a temp file), flush and ``fsync`` it, ``os.replace`` it over the
target, then ``fsync`` the directory so the rename itself survives a power cut. A crash, a kill or Ctrl-C at any
moment leaves either the old file or the new one, never a torn one; on any failure (``KeyboardInterrupt``
included) the temp file is removed and the target is untouched. Files get mode 0644, as a plain write would.

Writers that must open the file themselves (h5py, SB3's zip) use :func:`atomic_file`: a hidden temporary *path*
beside the target, named ``.rlt-build-<pid>-<token>-<name>``, put in place the same way. Directories (a Minari
dataset) are built under such a hidden name (:func:`new_temp_dir`) and moved into place with one rename
(:func:`replace_dir`; an existing target is swapped with ``renameat2(RENAME_EXCHANGE)`` on Linux, so the old one
stays complete until the new one is). Minari lists no hidden directory and our loaders look only at final paths,
so a build killed at any moment leaves nothing that is listed or loaded; :func:`clean_stale` removes such
leftovers whose process is gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from rl_transformers.utils.process import process_alive

__all__ = [
    "TEMP_PREFIX",
    "atomic_file",
    "atomic_link",
    "atomic_write",
    "atomic_write_json",
    "atomic_write_text",
    "clean_stale",
    "fsync_dir",
    "new_temp_dir",
    "replace_dir",
]

TEMP_PREFIX = ".rlt-build-"
"""Name prefix of the temporary paths of :func:`atomic_file` and :func:`new_temp_dir` (hidden; followed by the
writer's pid, so :func:`clean_stale` can tell a live build from a dead one's leftover)."""
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


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


# -- writers that open the file themselves, and whole directories ----------------------------------------------
def _build_name(stem: str = "") -> str:
    return f"{TEMP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}{stem}"


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str], suffix: str = "") -> Iterator[Path]:
    """Yield a hidden temporary path beside ``path`` for a writer to create; when the block ends normally it is
    fsynced and replaces ``path`` (then the directory is fsynced). ``suffix`` is appended to the temporary name
    (some writers insist on an extension, e.g. ``.zip``). On an exception the temporary file is removed and
    ``path`` is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.parent / _build_name(f"-{path.name}{suffix}")
    try:
        yield temp
        with open(temp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def new_temp_dir(parent: Path) -> Path:
    """Create and return an empty hidden build directory in ``parent`` (created if needed)."""
    parent.mkdir(parents=True, exist_ok=True)
    path = parent / _build_name()
    path.mkdir()
    return path


def clean_stale(parent: Path) -> list[Path]:
    """Remove leftovers of killed builds in ``parent`` (entries named ``.rlt-build-<pid>-*`` whose pid is gone);
    returns them."""
    removed: list[Path] = []
    if not parent.is_dir():
        return removed
    for entry in parent.iterdir():
        if not entry.name.startswith(TEMP_PREFIX):
            continue
        pid_text = entry.name[len(TEMP_PREFIX) :].split("-", 1)[0]
        if pid_text.isdigit() and process_alive(int(pid_text)):
            continue  # a build running right now
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry)
    return removed


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically with renameat2(RENAME_EXCHANGE); False when the system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return bool(renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0)


def replace_dir(new: Path, target: Path) -> None:
    """Move the complete directory ``new`` to ``target``, replacing an existing ``target`` atomically; the
    rename is made durable (the parent directory is fsynced)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        os.rename(new, target)
    elif _exchange(new, target):  # ``new`` now holds the old directory
        shutil.rmtree(new, ignore_errors=True)
    else:
        old = target.parent / _build_name("-old")
        os.rename(target, old)
        os.rename(new, target)
        shutil.rmtree(old, ignore_errors=True)
    fsync_dir(target.parent)
