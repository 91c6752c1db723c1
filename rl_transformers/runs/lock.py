"""One process per run directory: ``<run>/run.lock``, taken when a trainer starts (fresh or ``--resume``).

Method: the lock is an exclusive, non-blocking ``flock`` on ``<run>/run.lock``, held by an open descriptor for as
long as the run lasts; the file also records the holder (host, pid, start time, command line) for the message
a second process gets. The kernel drops a ``flock`` when its holder dies, however it dies, so a lock left
behind by a killed process is not held and the next start takes it over without asking; the holder written
in the file is then replaced. A second start while the holder lives fails at once with
:class:`RunLockedError`, naming the holder and the lock file, before it trains or writes anything in the run.

Release (:meth:`RunLock.release`) removes the file while still holding the lock; a process that had opened the
old file checks after locking that its descriptor is still the file at that path (same inode) and retries
otherwise, so a removed lock is never held by two processes.

Limits: a ``flock`` binds every process that shares the descriptor (a ``fork``ed env worker of the holder holds
the run too while it lives); on a network file system without ``flock`` support (some NFS set-ups lock only on
the local host) the lock guards processes of one host only. Without ``fcntl`` (Windows) the file itself is the
lock: created exclusively, stale when the pid it names is dead on this host (:func:`process_alive`).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import IO, Any

from rl_transformers.utils.errors import UserError
from rl_transformers.utils.process import process_alive
from rl_transformers.runs.paths import check_run_dir

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["LOCK_FILE", "RunLock", "RunLockedError", "acquire_run_lock", "claim_run", "lock_holder"]

LOCK_FILE = "run.lock"
_ATTEMPTS = 20


class RunLockedError(UserError):
    """Another live process holds the run directory's lock (the message names it)."""


def _describe(holder: dict[str, Any] | None) -> str:
    if not holder:
        return (
            "a process that has written no host and pid in the lock (one starting right now, or another "
            "program holding a flock on the file: `fuser -v` or `lsof` on it names the process)"
        )
    when = holder.get("started")
    since = f", since {when}" if isinstance(when, str) else ""
    pid = holder.get("pid")
    gone = ""
    if holder.get("host") == socket.gethostname() and isinstance(pid, int) and not process_alive(pid):
        gone = " (that process is gone, but a child process it started, e.g. an env worker, still holds the lock)"
    return f"process {pid!r} on host {holder.get('host')!r}{since}{gone}"


def lock_holder(run_dir: str | Path) -> dict[str, Any] | None:
    """What ``<run>/run.lock`` says about its holder (host, pid, started, command), or None when there is no
    readable lock file. It says nothing about whether that holder still lives."""
    try:
        data = json.loads((Path(run_dir) / LOCK_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _content() -> dict[str, Any]:
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "command": " ".join(sys.argv)[:500],
    }


def _locked_message(path: Path, holder: dict[str, Any] | None) -> str:
    return (
        f"run directory {path.parent} is in use by {_describe(holder)} (lock file {path}). One process per "
        "run: wait for it to finish or stop it (Ctrl-C saves a checkpoint). If no such process runs any more "
        f"(a host that went down), delete {path} and start again"
    )


class RunLock:
    """The lock of one run directory, held by this process until :meth:`release` (or until it exits)."""

    def __init__(self, path: Path, handle: IO[str] | None) -> None:
        self.path = path
        self._handle = handle

    @property
    def held(self) -> bool:
        return self._handle is not None or (fcntl is None and self.path.exists())

    def release(self) -> None:
        """Remove the lock file and drop the lock (idempotent)."""
        handle, self._handle = self._handle, None
        if handle is None:
            if fcntl is None:  # pragma: no cover - Windows: the file is the lock
                holder = lock_holder(self.path.parent)
                if holder and holder.get("pid") == os.getpid():
                    self.path.unlink(missing_ok=True)
            return
        with contextlib.suppress(OSError):
            if _same_file(handle, self.path):
                self.path.unlink()
        handle.close()  # closing drops the flock

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _same_file(handle: IO[str], path: Path) -> bool:
    try:
        here, there = os.fstat(handle.fileno()), os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def acquire_run_lock(run_dir: str | Path) -> RunLock:
    """Take ``run_dir``'s lock; :class:`RunLockedError` names the live holder. A lock file whose holder is gone
    is taken over. The lock file is never a symbolic link (one is refused, not followed)."""
    path = Path(run_dir) / LOCK_FILE
    if path.is_symlink():
        raise UserError(f"{path} is a symbolic link; a run's lock is a plain file: remove the link")
    if fcntl is None:  # pragma: no cover - Windows
        return _acquire_exclusive(path)
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    for _ in range(_ATTEMPTS):
        try:
            fd = os.open(path, flags, 0o644)
        except OSError as err:
            raise UserError(f"cannot create the run lock {path}: {err.strerror or err}") from None
        handle = os.fdopen(fd, "r+", encoding="utf-8")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise RunLockedError(_locked_message(path, _read_holder(path))) from None
        except OSError as err:  # flock not supported here: say so rather than run unguarded silently
            handle.close()
            raise UserError(
                f"cannot lock {path} ({err.strerror or err}); the file system lacks flock"
            ) from None
        if not _same_file(handle, path):  # the holder released (removed) it meanwhile: lock the new file
            handle.close()
            continue
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(_content()) + "\n")
        handle.flush()
        return RunLock(path, handle)
    raise RunLockedError(_locked_message(path, _read_holder(path)))


def _read_holder(path: Path) -> dict[str, Any] | None:
    """The holder written in the lock; a holder that has just taken the lock may not have written it yet."""
    for _ in range(10):
        holder = lock_holder(path.parent)
        if holder:
            return holder
        time.sleep(0.05)
    return None


def _acquire_exclusive(path: Path) -> RunLock:  # pragma: no cover - Windows
    for _ in range(_ATTEMPTS):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            holder = _read_holder(path)
            pid = holder.get("pid") if holder else None
            live = (
                holder is None
                or (
                    holder.get("host") == socket.gethostname() and isinstance(pid, int) and process_alive(pid)
                )
                or holder.get("host") != socket.gethostname()
            )
            if live:
                raise RunLockedError(_locked_message(path, holder)) from None
            path.unlink(missing_ok=True)  # a dead holder's lock
            continue
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(_content()) + "\n")
        return RunLock(path, None)
    raise RunLockedError(_locked_message(path, _read_holder(path)))


def claim_run(run_dir: str | Path) -> RunLock:
    """What a trainer does first with its run directory (fresh or resumed): refuse symbolic links out of it
    (:func:`~rl_transformers.runs.paths.check_run_dir`), then take its lock."""
    check_run_dir(run_dir)
    return acquire_run_lock(run_dir)
