"""Atomic dataset writes: build beside the target under a hidden temporary name, then rename.

A directory is built as ``<parent>/.rlt-build-<pid>-<token>/...`` and moved into place with one
``rename`` (same file system, so atomic). Minari's ``list_local_datasets`` skips hidden directories
(``minari.storage.local.list_non_hidden_dirs``: names starting with ``.``) and our loaders look only at the
final path, so a build killed at any moment leaves nothing that is listed or loaded; :func:`clean_stale`
removes such leftovers (those whose process is gone) at the start of the next build. Replacing an existing
directory (``--overwrite``) swaps the two in one ``renameat2(RENAME_EXCHANGE)`` on Linux -- the old dataset
stays complete until the new one is -- and falls back to two renames elsewhere. Files (D4RL-format HDF5,
policies, training state) go through :func:`atomic_file`: a hidden temporary file beside the target, then
``os.replace``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

__all__ = ["TEMP_PREFIX", "atomic_file", "clean_stale", "new_temp_dir", "replace_dir"]

TEMP_PREFIX = ".rlt-build-"
"""Name prefix of every temporary directory / file of a build (hidden: Minari and our loaders skip it)."""
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _temp_name(stem: str = "") -> str:
    return f"{TEMP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}{stem}"


def new_temp_dir(parent: Path) -> Path:
    """Create and return an empty hidden build directory in ``parent`` (created if needed)."""
    parent.mkdir(parents=True, exist_ok=True)
    path = parent / _temp_name()
    path.mkdir()
    return path


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale(parent: Path) -> list[Path]:
    """Remove leftovers of killed builds in ``parent`` (entries named ``.rlt-build-<pid>-*`` whose pid is gone)."""
    removed: list[Path] = []
    if not parent.is_dir():
        return removed
    for entry in parent.iterdir():
        if not entry.name.startswith(TEMP_PREFIX):
            continue
        pid_text = entry.name[len(TEMP_PREFIX) :].split("-", 1)[0]
        if pid_text.isdigit() and _pid_alive(int(pid_text)):
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
    result = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    return result == 0


def replace_dir(new: Path, target: Path) -> None:
    """Move the complete directory ``new`` to ``target``, replacing an existing ``target`` atomically."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        os.rename(new, target)
        return
    if _exchange(new, target):  # ``new`` now holds the old dataset
        shutil.rmtree(new, ignore_errors=True)
        return
    old = target.parent / _temp_name("-old")
    os.rename(target, old)
    os.rename(new, target)
    shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def atomic_file(path: Path, suffix: str = "") -> Iterator[Path]:
    """Yield a hidden temporary path beside ``path``; on success it replaces ``path`` (``os.replace``).

    ``suffix`` is appended to the temporary name (some writers insist on an extension, e.g. ``.zip``).
    On an exception the temporary file is removed and ``path`` is untouched.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.parent / _temp_name(f"-{path.name}{suffix}")
    try:
        yield temp
        with open(temp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
