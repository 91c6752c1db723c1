"""Whether a process is alive: the one check behind every lock and leftover that names its holder by pid (the
study's ``running.lock``, leftovers of killed dataset builds)."""

from __future__ import annotations

import os

__all__ = ["process_alive"]


def process_alive(pid: int) -> bool:
    """True when a process ``pid`` exists on this host (ours, or another user's).

    ``pid <= 0`` is never a process (``kill(0)`` and ``kill(-1)`` address process groups), nor is a pid out of
    the platform's range; ``PermissionError`` means a live process we may not signal."""
    if pid <= 0:
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        return True
    return True
