"""Ctrl-C while a script is still importing: one line and exit status 130, not a traceback.

A script of this checkout (``scripts/*.py``) spends seconds importing torch and the package before its
``main`` runs under :func:`~rl_transformers.utils.errors.run_cli`, which turns errors and interrupts into
one-line messages. A ``KeyboardInterrupt`` in that window used to end in a traceback through the import
machinery. ``import rl_transformers`` (the first import of every script) installs :func:`install`'s hook for
scripts only: an uncaught ``KeyboardInterrupt`` prints ``interrupted: ...`` and exits 130 (what a shell reports
for SIGINT); ``--debug`` or ``RLT_DEBUG=1`` keep the traceback. ``run_cli`` removes the hook when ``main``
starts (:func:`uninstall`), so later interrupts follow the script's own rules (a script without ``run_cli``
keeps the hook: its Ctrl-C is the same one line). The ``rlt`` command installs it before importing the
command it runs (``install(command=True)``). Standard library only: this runs
before anything heavy is imported.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["MESSAGE", "install", "uninstall"]

MESSAGE = "interrupted: Ctrl-C (exit status 130; --debug shows where)"
_EXIT = 130


def _a_script_of_this_checkout() -> bool:
    argv0 = sys.argv[0] if sys.argv else ""
    if not argv0.endswith(".py"):
        return False
    path = Path(argv0).resolve()
    return path.parent.name == "scripts" and (path.parent.parent / "rl_transformers").is_dir()


def _hook(previous: Any) -> Any:
    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        debug = "--debug" in sys.argv[1:] or os.environ.get("RLT_DEBUG", "") not in ("", "0")
        if issubclass(kind, KeyboardInterrupt) and not debug:
            sys.stdout.flush()
            print(MESSAGE, file=sys.stderr, flush=True)
            os._exit(_EXIT)
        previous(kind, value, tb)

    hook.rlt_startup_previous = previous  # type: ignore[attr-defined]
    return hook


def install(command: bool = False) -> None:
    """Install the start-up hook when ``__main__`` is a script of this checkout, or for ``command`` (the ``rlt``
    dispatcher, before it imports the command it runs) (idempotent)."""
    if (command or _a_script_of_this_checkout()) and not hasattr(sys.excepthook, "rlt_startup_previous"):
        sys.excepthook = _hook(sys.excepthook)


def uninstall() -> None:
    """Put back the hook that was there before :func:`install` (``main`` has started)."""
    previous = getattr(sys.excepthook, "rlt_startup_previous", None)
    if previous is not None:
        sys.excepthook = previous
