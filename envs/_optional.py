"""Lazy import of optional extras (popgym, minigrid) with an error that says how to install them.

The adapters in this package import their third-party simulator only when an environment is built, so that
``import envs`` stays cheap and works without the extras. A missing extra raises :class:`ImportError` naming
the ``pip install rl-transformers[<extra>]`` command.
"""

from __future__ import annotations

import importlib
from types import ModuleType


def import_optional(module: str, extra: str, purpose: str) -> ModuleType:
    """Import ``module`` or raise an :class:`ImportError` that names the extra to install.

    Args:
        module: dotted module name, e.g. ``"popgym.envs"``.
        extra: the optional-dependency group of ``pyproject.toml`` that provides it, e.g. ``"popgym"``.
        purpose: what needed it, for the message (e.g. ``"rlt/popgym-RepeatPreviousEasy-v0"``).
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(
            f"{purpose} needs the optional package {module.split('.')[0]!r}, which is not installed. "
            f"Install it with: pip install rl-transformers[{extra}]  (or: pip install {extra})"
        ) from err
