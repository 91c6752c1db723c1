"""User errors and the command-line wrapper every script runs its ``main`` through.

A :class:`UserError` is a bad input from a person — a flag, a config file, a dataset, a checkpoint — as opposed
to a bug. :func:`run_cli` prints it as ``error: <message>`` on stderr and exits with status 2, without a
traceback, unless ``--debug`` is on the command line or ``RLT_DEBUG=1`` is set. Every other exception keeps its
traceback. ``UserError`` subclasses ``ValueError`` so code that already catches ``ValueError`` keeps working.
A full disk (or a quota, a read-only file system) met anywhere -- an ``OSError`` with that ``errno`` in the
exception or its causes, as torch and h5py wrap it -- is reported the same way (:func:`storage_failure`).

This module imports only the standard library, so any layer (the backbone included) can raise its errors
without an import circle.
"""

from __future__ import annotations

import difflib
import errno
import os
import re
import sys
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")

DEBUG_FLAG = "--debug"
DEBUG_ENV = "RLT_DEBUG"
EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130
"""A Ctrl-C that :func:`run_cli` reports (``on_interrupt``): the shell's status for SIGINT, 128 + 2."""


class UserError(ValueError):
    """A bad input a person can fix: the message names the value, the valid choices and where it came from.

    ``source`` (optional) names the flag or file the value came from (``"--device"``, ``"runs/x/config.json"``);
    it is prefixed to the message once.
    """

    def __init__(self, message: str, *, source: str | None = None) -> None:
        self.source = source
        self.detail = message
        super().__init__(f"{source}: {message}" if source else message)


def closest(value: object, choices: Iterable[object]) -> str | None:
    """The choice closest to ``value`` (difflib), or ``None`` when nothing is close."""
    names = [str(c) for c in choices]
    match = difflib.get_close_matches(str(value), names, n=1)
    return match[0] if match else None


def choice_hint(value: object, choices: Iterable[object]) -> str:
    """``"valid: a, b, c (did you mean 'b'?)"`` for an error message."""
    names = [str(c) for c in choices]
    hint = f"valid: {', '.join(names)}"
    match = closest(value, names)
    return hint + (f" (did you mean {match!r}?)" if match else "")


def debug_requested(argv: list[str] | None = None) -> bool:
    """``--debug`` on the command line or ``RLT_DEBUG`` set to a true value."""
    argv = sys.argv[1:] if argv is None else argv
    env = os.environ.get(DEBUG_ENV, "").strip().lower()
    return DEBUG_FLAG in argv or env not in ("", "0", "false", "no", "off")


def _user_error_in(err: BaseException) -> UserError | None:
    """The :class:`UserError` ``err`` is or wraps (``raise ... from``), so wrapped user errors stay user errors."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        if isinstance(current, UserError):
            return current
        seen.add(id(current))
        current = current.__cause__
    return None


_STORAGE_ERRNOS = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
}
_ERRNO_TEXT = re.compile(r"errno = (\d+)")  # h5py's RuntimeError text for a failed write


def storage_failure(err: BaseException) -> str | None:
    """``"no space left on device (writing <file>)"`` when ``err`` or an exception in its causes / contexts is
    a write that failed for lack of space, quota or a read-only file system; else None."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        code = current.errno if isinstance(current, OSError) else None
        if code is None and isinstance(current, RuntimeError):
            match = _ERRNO_TEXT.search(str(current))
            code = int(match.group(1)) if match else None
        if code in _STORAGE_ERRNOS:
            name = getattr(current, "filename", None)
            return _STORAGE_ERRNOS[code] + (f" (writing {name})" if name else "")
        current = current.__cause__ or current.__context__
    return None


_resumable = False


def offer_resume() -> None:
    """Say that this command has ``--resume`` (the trainers' :func:`~rl_transformers.runs.resume.parse_cli`
    calls it): :func:`run_cli`'s full-disk message then advises it; commands without one are not told to."""
    global _resumable
    _resumable = True


def run_cli(main: Callable[[], T], argv: list[str] | None = None, on_interrupt: str | None = None) -> T:
    """Run a script's ``main()``: user errors become ``error: <message>`` and exit status 2.

    ``--debug`` is removed from ``sys.argv`` before ``main`` parses it (so every script accepts it without
    declaring it) and, like ``RLT_DEBUG=1``, lets user errors raise with their traceback. Other exceptions,
    ``KeyboardInterrupt`` and ``SystemExit`` pass through untouched, except a full disk
    (:func:`storage_failure`), which is reported as a user error too. ``on_interrupt``: for scripts whose
    Ctrl-C is an ordinary way to stop (resumable studies), a ``KeyboardInterrupt`` prints
    ``interrupted: <on_interrupt>`` instead of a traceback and exits with :data:`EXIT_INTERRUPTED`.
    """
    from rl_transformers.startup import uninstall

    uninstall()  # main starts: interrupts now follow this function's rules, not the start-up hook's
    if argv is None:
        argv = sys.argv
    debug = debug_requested(argv[1:])
    if DEBUG_FLAG in argv[1:]:
        argv[:] = [argv[0], *(a for a in argv[1:] if a != DEBUG_FLAG)]
    try:
        return main()
    except KeyboardInterrupt:
        if on_interrupt is None or debug:
            raise
        print(f"interrupted: {on_interrupt}", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    except Exception as err:
        user = _user_error_in(err)
        storage = storage_failure(err) if user is None else None
        if storage is not None and not debug:
            again = (
                "; this run continues with --resume <run directory>"
                if _resumable
                else ": the same command again"
            )
            print(f"error: {storage}. Free space (or write elsewhere) and run again{again}", file=sys.stderr)
            print(
                f"  (while: {type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''})",
                file=sys.stderr,
            )
            sys.exit(EXIT_USER_ERROR)
        if user is None or debug:
            raise
        print(f"error: {user}", file=sys.stderr)
        if user is not err:
            print(f"  (while: {type(err).__name__}: {err})", file=sys.stderr)
        print(f"  (run with {DEBUG_FLAG} or {DEBUG_ENV}=1 for the traceback)", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)


def describe(value: Any) -> str:
    """``repr`` of a value with its type, for messages about wrong types: ``'abc' (str)``."""
    return f"{value!r} ({type(value).__name__})"
