"""Reading checkpoints: torch's safe loader, finiteness of weights, and finding the newest loadable file.

Reading is always ``torch.load(weights_only=True)`` (no code from the file runs). A file that does not load
(truncated, garbage, not written by torch) raises :class:`InvalidCheckpointError` naming it; given a run
directory, :func:`latest_checkpoint` / :func:`load_checkpoint` skip such files with a warning and take the
next newest one (``last.pt``, then ``step_<n>.pt`` by decreasing ``n``). The writing side (atomic saves and
the ``step_<n>`` / ``last`` / ``best`` manager) lives in :mod:`rl_transformers.runs.checkpoint`.
"""

from __future__ import annotations

import math
import re
import warnings
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from rl_transformers.utils.errors import UserError

__all__ = [
    "STEP_FILE",
    "InvalidCheckpointError",
    "check_finite_weights",
    "latest_checkpoint",
    "load_checkpoint",
    "load_error_reason",
    "read_checkpoint",
    "step_files",
]

STEP_FILE = re.compile(r"^step_(\d+)\.pt$")


class InvalidCheckpointError(UserError):
    """A checkpoint file that cannot be read (truncated, garbage, or not written by rl_transformers)."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(
            f"checkpoint {path} is not a valid checkpoint (truncated or not written by rl_transformers): "
            f"{reason}"
        )
        self.path = path


def load_error_reason(err: BaseException) -> str:
    """One line saying why ``torch.load(weights_only=True)`` refused a file, without torch's advice to retry
    with ``weights_only=False`` (which would run the file's code)."""
    text = str(err).strip()
    if text.startswith("Weights only load failed"):
        # torch's own advice (retry with weights_only=False) would run the file's code: keep only the cause
        blocks = [b.strip() for b in text.split("\n\n") if b.strip()]
        causes = [b for b in blocks[1:] if "weights_only" not in b and not b.startswith("Check the doc")]
        cause = causes[0].replace("WeightsUnpickler error:", "").strip() if causes else "unsupported content"
        return f"it holds objects other than tensors and plain data ({cause.splitlines()[0]})"[:300]
    text = text.split("\n", 1)[0]
    if not text:
        text = type(err).__name__ + (" (the file ends early)" if isinstance(err, EOFError) else "")
    return text[:300]


def read_checkpoint(path: str | Path, map_location: str | torch.device | None = "cpu") -> Any:
    """``torch.load(path, weights_only=True)``; any failure becomes :class:`InvalidCheckpointError`.

    The result must be a dict (every checkpoint of this package is one).
    """
    path = Path(path)
    try:
        obj = torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise
    except (IsADirectoryError, PermissionError) as err:
        raise InvalidCheckpointError(path, str(err)) from None
    except Exception as err:  # torch raises RuntimeError, UnpicklingError, EOFError, OSError ...
        raise InvalidCheckpointError(path, load_error_reason(err)) from None
    if not isinstance(obj, dict):
        raise InvalidCheckpointError(path, f"it holds a {type(obj).__name__}, not a dict")
    return obj


def check_finite_weights(state: Any, path: str | Path, what: str = "weights") -> None:
    """Refuse (:class:`InvalidCheckpointError`) a state dict with a NaN or infinite floating-point entry: such a
    model acts on garbage and would evaluate silently to a meaningless score."""
    if not isinstance(state, Mapping):
        return
    for name, value in state.items():
        if (
            isinstance(value, torch.Tensor)
            and value.is_floating_point()
            and not bool(torch.isfinite(value).all())
        ):
            bad = int((~torch.isfinite(value)).sum())
            raise InvalidCheckpointError(
                Path(path),
                f"its {what} hold {bad} NaN or infinite value(s) in {name!r}; use an earlier checkpoint",
            )


DT_WHAT = "model its model_kwargs describe"
"""How :func:`check_weights_fit` names a Decision Transformer checkpoint's model."""


def check_weights_fit(build: Callable[[], torch.nn.Module], state: Any, path: str | Path, what: str) -> None:
    """Refuse (:class:`UserError`) weights whose names or shapes differ from the module that ``build`` makes from
    the file's own config, *before* anything is allocated: the module is built on the ``meta`` device (shapes,
    no storage), so a config that describes a model far larger than the weights it ships cannot make the loader
    allocate it. ``what`` names the module and where it is described ("policy its config describes")."""
    try:
        with torch.device("meta"):
            module = build()
    except Exception:  # a part that cannot be built without storage: the real build below reports as before
        return
    want = {k: tuple(v.shape) for k, v in module.state_dict().items() if isinstance(v, torch.Tensor)}
    got = (
        {k: tuple(v.shape) for k, v in state.items() if isinstance(v, torch.Tensor)}
        if isinstance(state, Mapping)
        else {}
    )
    if want == got:
        return
    missing, unexpected = sorted(want.keys() - got.keys()), sorted(got.keys() - want.keys())
    shapes = [f"{k}: {got[k]} in the file, {want[k]} by the config" for k in sorted(want.keys() & got.keys())
              if want[k] != got[k]]  # fmt: skip
    parts = [f"missing {missing[:3]}" if missing else "", f"unexpected {unexpected[:3]}" if unexpected else "",
             "; ".join(shapes[:3])]  # fmt: skip
    size = sum(math.prod(s) for s in want.values())
    raise UserError(
        f"{path}: its weights do not fit the {what} ({size:,} values): " + "; ".join(p for p in parts if p)
    )


def load_checkpoint(path: str | Path, map_location: str | torch.device | None = "cpu") -> Any:
    """Load a checkpoint file, or the newest loadable one of a run directory (see :func:`latest_checkpoint`).

    Always torch's safe loader (``weights_only=True``: tensors and plain containers only). A file given
    explicitly that does not load raises :class:`InvalidCheckpointError`; in a run directory unreadable
    files are skipped with a warning.
    """
    path = Path(path)
    if path.is_file():
        return read_checkpoint(path, map_location)
    candidates = _candidates(path)
    if not candidates:
        raise FileNotFoundError(f"no checkpoint found at {path} (looked for last.pt and step_<n>.pt)")
    errors = []
    for candidate in candidates:
        try:
            return read_checkpoint(candidate, map_location)
        except InvalidCheckpointError as err:
            warnings.warn(f"skipping {err}", stacklevel=2)
            errors.append(str(err))
    raise InvalidCheckpointError(path, "no checkpoint in it loads: " + "; ".join(errors))


def latest_checkpoint(path: str | Path) -> Path | None:
    """The checkpoint to resume from: ``path`` itself if it is a file; else in ``path/checkpoints/`` (or
    ``path``) ``last.pt``, or failing that the ``step_<n>.pt`` with the largest ``n``; ``None`` if none.

    In a directory, files whose zip structure is broken (a torn or foreign file) are skipped with a warning.
    """
    path = Path(path)
    if path.is_file():
        return path
    for candidate in _candidates(path):
        if zipfile.is_zipfile(candidate):
            return candidate
        warnings.warn(
            f"skipping {InvalidCheckpointError(candidate, 'not a torch zip archive')}", stacklevel=2
        )
    return None


def _candidates(path: Path) -> list[Path]:
    """``last.pt`` then ``step_<n>.pt`` by decreasing ``n`` (in ``path/checkpoints`` or ``path``)."""
    directory = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    if not directory.is_dir():
        return []
    found = [directory / "last.pt"] if (directory / "last.pt").is_file() else []
    steps = step_files(directory)
    return found + [steps[n] for n in sorted(steps, reverse=True)]


def step_files(directory: Path) -> dict[int, Path]:
    found = {}
    for entry in directory.iterdir():
        match = STEP_FILE.match(entry.name)
        if match and entry.is_file():
            found[int(match.group(1))] = entry
    return found
