"""Optional dependencies: which extra of ``pyproject.toml`` provides a package, and one clear error without it.

The core install trains and evaluates PPO agents (``rlt train-ppo``, ``rlt evaluate``); what only some commands
need is an extra: ``offline`` (Minari and D4RL datasets, the behaviour policies of the dataset builder, the offline
table's intervals), ``plots`` (matplotlib figures of the benchmarks and studies), ``study`` (rliable, Optuna, Ray).
Each function that imports such a package calls :func:`need` first, so a missing one is a
:class:`~rl_transformers.utils.errors.UserError` naming the package and the ``pip install`` line instead of a
``ModuleNotFoundError`` deep in a run. Standard library only: :func:`need` finds the package without importing it.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from rl_transformers.utils.errors import UserError

DISTRIBUTION = "rl-transformers"
"""The name ``pip install`` knows this library by."""


@dataclass(frozen=True)
class OptionalPackage:
    """An optional package: its distribution name on PyPI and the extra that installs it."""

    package: str
    extra: str


OPTIONAL: dict[str, OptionalPackage] = {
    "minari": OptionalPackage("minari", "offline"),
    "h5py": OptionalPackage("h5py", "offline"),
    "stable_baselines3": OptionalPackage("stable-baselines3", "offline"),
    "scipy": OptionalPackage("scipy", "offline"),
    "matplotlib": OptionalPackage("matplotlib", "plots"),
    "rliable": OptionalPackage("rliable", "study"),
    "optuna": OptionalPackage("optuna", "study"),
}
"""Import name -> the package and extra (a test keeps each in its extra of ``pyproject.toml``)."""


def install_hint(extra: str) -> str:
    """The command that installs ``extra`` (from PyPI, or from a checkout)."""
    return f"pip install '{DISTRIBUTION}[{extra}]' (in a checkout: pip install -e '.[{extra}]')"


def missing(module: str) -> bool:
    """True when the top-level package of ``module`` cannot be imported (found without importing it)."""
    return importlib.util.find_spec(module.split(".", 1)[0]) is None


def need(module: str, purpose: str, alternative: str | None = None) -> None:
    """Raise a :class:`UserError` when the optional package ``module`` (a key of :data:`OPTIONAL`) is absent.

    ``purpose`` says what needs it (``"reading a D4RL .hdf5 file"``); ``alternative`` (optional) a way to do
    without (``"or --no-plots"``)."""
    entry = OPTIONAL[module]
    if missing(module):
        instead = f", {alternative}" if alternative else ""
        raise UserError(
            f"{purpose} needs {entry.package}, which is not installed: {install_hint(entry.extra)}{instead}"
        )
