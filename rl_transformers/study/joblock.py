"""A study job's ``running.lock``: two invocations over the same run directories never run one job twice.

The lock is a JSON file in the job's directory: the host, the pids holding it (the launching process, then also
its worker subprocess), when it was taken, the holder's run timeout and a random token. Taking it, adding a pid and
releasing it happen under an exclusive ``flock`` on a guard file beside it, so two invocations that both find a
stale lock cannot both take it over, and a holder whose lock was taken over cannot delete or rewrite its
successor's (the token no longer matches).

A lock is stale - taken over without asking - when every pid in it is dead on this host, or, for a holder on
another host (a Ray node sharing the file system), whose pids cannot be checked, when it is older than the
holder's run timeout plus 10 minutes; the worker stops itself at that timeout (``study/worker.py``
``--deadline-s``), so a worker orphaned there by a killed launcher is gone before the lock expires. Limits: on a
cluster *without* a shared file system each node sees only its own locks, so there the lock guards against
nothing across nodes; hosts are told apart by hostname (containers sharing a file system need distinct
hostnames); a launcher killed in the instant between starting its worker and naming it in the lock leaves that
worker unlisted.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_transformers.utils.atomic import atomic_write_json
from rl_transformers.utils.process import process_alive

__all__ = ["LOCK", "JobLock", "acquire", "holder"]

LOCK = "running.lock"
GUARD = ".running.lock.guard"
GRACE_S = 600.0
"""How long past its run timeout another host's lock is still honoured."""


@contextlib.contextmanager
def _guarded(run_dir: Path) -> Iterator[None]:
    """Hold an exclusive flock on the directory's guard file (POSIX; elsewhere no guard)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    with open(run_dir / GUARD, "a") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(guard, fcntl.LOCK_UN)


def _read(lock: Path) -> dict[str, Any] | None:
    """The lock's fields; None when there is none or it is not a lock this module wrote (it writes atomically, so
    unparseable content is never a live holder's). An unreadable file (permissions, I/O) raises ``OSError``."""
    try:
        held = json.loads(lock.read_text())
        held["pids"] = [int(p) for p in held["pids"]]
        held["host"], held["started"] = str(held["host"]), float(held["started"])
        if held.get("timeout_s") is not None:
            held["timeout_s"] = float(held["timeout_s"])
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError, OverflowError):
        return None
    return held


def holder(lock: Path) -> str | None:
    """Who holds ``lock`` (``"host pids [...]"``), or None when there is no live holder: no lock, an unreadable
    one, every pid dead on this host, or another host's lock older than its run timeout + 10 minutes."""
    held = _read(lock)
    if held is None:
        return None
    if held["host"] == socket.gethostname():
        live = any(process_alive(pid) for pid in held["pids"])
    else:
        timeout = held.get("timeout_s")
        live = timeout is None or time.time() - held["started"] <= timeout + GRACE_S
    return f"{held['host']} pids {held['pids']}" if live else None


@dataclass
class JobLock:
    """A lock this process holds; :meth:`add_pid` and :meth:`release` act only while it is still ours."""

    path: Path
    content: dict[str, Any]

    def _ours(self) -> bool:
        held = _read(self.path)
        return held is not None and held.get("token") == self.content["token"]

    def add_pid(self, pid: int) -> None:
        """Name ``pid`` (the worker) as a holder too: a launcher killed alone leaves the job held while it runs."""
        with _guarded(self.path.parent):
            if self._ours():
                self.content = {**self.content, "pids": [*self.content["pids"], pid]}
                atomic_write_json(self.path, self.content)

    def release(self) -> None:
        with _guarded(self.path.parent):
            if self._ours():
                self.path.unlink(missing_ok=True)


def acquire(run_dir: Path, timeout_s: float | None = None) -> JobLock | str:
    """Take ``run_dir``'s lock (a stale one is taken over); returns it, or who holds it (see :func:`holder`).

    ``timeout_s`` is this holder's run timeout, written into the lock for invocations on other hosts."""
    lock = run_dir / LOCK
    with _guarded(run_dir):
        held = holder(lock)
        if held is not None:
            return held
        content = {
            "host": socket.gethostname(),
            "pids": [os.getpid()],
            "started": time.time(),
            "timeout_s": timeout_s,
            "token": uuid.uuid4().hex,
        }
        atomic_write_json(lock, content)
        return JobLock(lock, content)
