"""Crash-safe checkpoints and a manager for ``step_<n>.pt`` / ``last.pt`` / ``best.pt``.

Method: :func:`atomic_save` writes with ``torch.save`` into a temporary file in the destination directory,
``fsync``s it, then ``os.replace``s it over the target, so a crash or Ctrl-C mid-write leaves either the old
file or the new one, never a torn one. RNG state capture lives in :mod:`rl_transformers.utils.rng`.

:class:`CheckpointManager` lays out ``<run_dir>/checkpoints/``::

    step_<n>.pt    one per save, the newest ``keep_last`` kept (None = all, 0 = none)
    last.pt        the most recent save
    best.pt        the save with the best ``metric`` so far (``mode`` "max" or "min"), when tracked
    index.json     labels: step and metric value of ``last`` and ``best``, the kept steps

``last.pt`` and ``best.pt`` are hard links to the step file when the file system allows (no extra copy).
A dict payload gets a ``"checkpoint_meta"`` entry ``{"step", "metric", "metric_value"}``.

A failed write (e.g. a full disk) raises :class:`CheckpointWriteError` naming the file and the last good
checkpoint, which is left untouched. Reading checkpoints (the safe loader, finding the newest loadable file)
lives in :mod:`rl_transformers.runs.checkpoint_load`.
"""

from __future__ import annotations

import errno
import json
import math
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import torch

from rl_transformers.utils.atomic import atomic_link, atomic_write, atomic_write_json
from rl_transformers.runs.checkpoint_load import read_checkpoint, step_files
from rl_transformers.utils.errors import UserError
from rl_transformers.runs.paths import run_subdir

__all__ = [
    "CheckpointManager",
    "CheckpointWriteError",
    "atomic_save",
]

META_KEY = "checkpoint_meta"


def atomic_save(obj: Any, path: str | Path) -> Path:
    """``torch.save(obj)`` to ``path`` atomically (:func:`rl_transformers.utils.atomic.atomic_write`: temp file
    in the same directory, fsync, ``os.replace``). On any failure (including ``KeyboardInterrupt``) the temp
    file is removed and ``path`` is untouched."""
    return atomic_write(path, lambda f: torch.save(obj, f))


class CheckpointWriteError(UserError):
    """Writing a checkpoint failed (e.g. no space left on device); earlier checkpoints are unchanged.

    ``errno`` is the one of the underlying ``OSError`` (also its ``__cause__``)."""

    def __init__(self, message: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno


def _errno_of(err: BaseException) -> int | None:
    """The errno of a failed write: an ``OSError``'s own, or one in its causes (torch wraps them)."""
    current: BaseException | None = err
    while current is not None:
        if isinstance(current, OSError) and current.errno is not None:
            return current.errno
        current = current.__cause__ or current.__context__
    return None


def _write_reason(err: BaseException) -> str:
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    text = str(err).strip().splitlines()
    return (text[0] if text else type(err).__name__)[:300]


def _all_finite(obj: Any) -> bool:
    if isinstance(obj, torch.Tensor):
        return not obj.is_floating_point() or bool(torch.isfinite(obj).all())
    if isinstance(obj, Mapping):
        return all(_all_finite(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return all(_all_finite(v) for v in obj)
    return True


def finite_checkpoint(path: Path) -> bool:
    """Whether the checkpoint file loads (safe loader) and every floating-point tensor in it is finite."""
    try:
        return _all_finite(read_checkpoint(path))
    except (OSError, UserError):
        return False


def _index_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"step {value!r} is not a whole number >= 0")
    return value


# --- manager -------------------------------------------------------------------------------------------


class CheckpointManager:
    """Saves ``step_<n>.pt`` + ``last.pt`` (+ ``best.pt``) under ``run_dir/checkpoints`` with labels.

    Args:
        run_dir: the run directory (``checkpoints/`` is created inside).
        keep_last: how many ``step_<n>.pt`` files to keep (``None`` keeps all, ``0`` writes none: only
            ``last.pt`` / ``best.pt``).
        metric: name of the metric that selects ``best.pt`` (e.g. ``"eval/normalized_score"``); ``None``
            disables ``best.pt``.
        mode: ``"max"`` or ``"min"``: whether larger or smaller metric values are better.

    A manager opened on an existing run directory (resume) reads ``index.json`` and keeps the best value
    seen so far, so a resumed run only replaces ``best.pt`` with a truly better checkpoint.
    """

    def __init__(
        self,
        run_dir: str | Path,
        keep_last: int | None = 3,
        metric: str | None = None,
        mode: Literal["max", "min"] = "max",
    ) -> None:
        if keep_last is not None and keep_last < 0:
            raise ValueError(f"keep_last must be None or >= 0, got {keep_last}")
        if mode not in ("max", "min"):
            raise ValueError(f"mode must be one of ['max', 'min'], got {mode!r}")
        self.directory = run_subdir(run_dir, "checkpoints")  # a symbolic link out of the run is refused
        for stale in self.directory.glob(".*.tmp"):  # temp files of a killed save: never loadable
            stale.unlink(missing_ok=True)
        self.keep_last = keep_last
        self.metric = metric
        self.mode = mode
        self.best_step: int | None = None
        self.best_value: float | None = None
        self.last_step: int | None = None
        self._restore_labels(self._read_index())

    @property
    def last_path(self) -> Path:
        return self.directory / "last.pt"

    @property
    def best_path(self) -> Path:
        return self.directory / "best.pt"

    @property
    def index_path(self) -> Path:
        return self.directory / "index.json"

    def step_path(self, step: int) -> Path:
        return self.directory / f"step_{int(step)}.pt"

    def is_better(self, value: float | None) -> bool:
        """Whether ``value`` would replace ``best.pt`` (NaN and ``None`` never do)."""
        if self.metric is None or value is None or not math.isfinite(value):
            return False
        if self.best_value is None:
            return True
        return value > self.best_value if self.mode == "max" else value < self.best_value

    def save(self, state: Any, step: int, metric_value: float | None = None) -> Path:
        """Save ``state`` for ``step``; update ``last.pt``, ``best.pt`` (if better) and ``index.json``.

        Returns the path written first (``step_<n>.pt``, or ``last.pt`` when ``keep_last == 0``).
        """
        if metric_value is not None and self.metric is None:
            raise ValueError(
                "metric_value given but this CheckpointManager tracks no metric (pass metric=...)"
            )
        step = int(step)
        value = None if metric_value is None else float(metric_value)
        payload = state
        if isinstance(state, Mapping):
            meta = {"step": step, "metric": self.metric, "metric_value": value}
            payload = {**state, META_KEY: meta}
        target = self.last_path if self.keep_last == 0 else self.step_path(step)
        try:
            primary = atomic_save(payload, target)
            if self.keep_last != 0:
                atomic_link(primary, self.last_path)
        except (OSError, RuntimeError) as err:  # torch.save reports a failed write as RuntimeError
            self._write_failed(target, err)
        self.last_step = step
        if self.is_better(value):
            self._link_best(primary, step, value)
        self._prune()
        self._write_index_safely(step, value)
        return primary

    def update_metric(self, step: int, metric_value: float | None) -> bool:
        """Attach the evaluation of the checkpoint saved for ``step`` (saved *before* evaluating, so an
        evaluation error loses nothing); it becomes ``best.pt`` when better. Returns whether it did."""
        value = None if metric_value is None else float(metric_value)
        if self.metric is None or step != self.last_step:
            return False
        source = self.last_path if self.keep_last == 0 else self.step_path(step)
        if not source.is_file():
            source = self.last_path
        better = self.is_better(value)
        if better:
            self._link_best(source, step, value)
        self._write_index_safely(step, value)
        return better

    def _link_best(self, source: Path, step: int, value: float | None) -> None:
        try:
            atomic_link(source, self.best_path)
        except OSError as err:
            self._write_failed(self.best_path, err)
        self.best_step, self.best_value = step, value

    def _write_index_safely(self, step: int, value: float | None) -> None:
        # the index is written last, and its atomic write fsyncs the directory: that makes the links and
        # removals before it durable too
        try:
            self._write_index(step, value)
        except OSError as err:
            self._write_failed(self.index_path, err)

    def _write_failed(self, target: Path, err: OSError | RuntimeError) -> None:
        code = _errno_of(err)
        reason = "no space left on device" if code == errno.ENOSPC else _write_reason(err)
        good = self.last_good()
        last = (
            f"the last good checkpoint is {good}" if good is not None else "no earlier good checkpoint exists"
        )
        raise CheckpointWriteError(
            f"could not write checkpoint {target}: {reason}; {last} (unchanged). Free space "
            "(or move the run elsewhere), then --resume it",
            code,
        ) from err

    def load(
        self,
        which: Literal["last", "best"] | int = "last",
        map_location: str | torch.device | None = "cpu",
    ) -> Any:
        """Load ``"last"``, ``"best"`` or the checkpoint of a given step (safe loader)."""
        if which == "last":
            path = self.last_path
        elif which == "best":
            path = self.best_path
        elif isinstance(which, int):
            path = self.step_path(which)
        else:
            raise ValueError(f"which must be 'last', 'best' or a step number, got {which!r}")
        if not path.is_file():
            raise FileNotFoundError(f"no checkpoint {path}")
        return read_checkpoint(path, map_location)

    def last_good(self) -> Path | None:
        """The newest checkpoint on disk that loads and holds only finite floating-point values (``last.pt``,
        else the ``step_<n>.pt`` files newest first), None when there is none. A checkpoint written after the
        weights went NaN is never "good": resuming from it would only repeat the failure."""
        steps = sorted(step_files(self.directory).items(), reverse=True)
        for path in (self.last_path, *(p for _, p in steps)):
            if path.is_file() and finite_checkpoint(path):
                return path
        return None

    def kept_steps(self) -> list[int]:
        """Steps of the ``step_<n>.pt`` files on disk, ascending."""
        return sorted(step_files(self.directory))

    def _prune(self) -> None:
        if self.keep_last is None:
            return
        steps = self.kept_steps()
        for step in steps[: max(len(steps) - self.keep_last, 0)]:
            self.step_path(step).unlink(missing_ok=True)

    def _read_index(self) -> dict[str, Any]:
        """``index.json`` as a dict; a damaged one is reported and ignored (the next save rewrites it)."""
        if not self.index_path.is_file():
            return {}
        try:
            data = json.loads(self.index_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:  # ValueError: bad JSON or bytes that are not UTF-8
            self._index_damaged(f"it does not read as JSON ({str(err).splitlines()[0][:120]})")
            return {}
        if not isinstance(data, dict):
            self._index_damaged(f"it holds a {type(data).__name__}, not an object")
            return {}
        return data

    def _index_damaged(self, reason: str) -> None:
        warnings.warn(
            f"ignoring {self.index_path}: {reason}; the labels are rebuilt from the checkpoints (last: the newest "
            "step file; best: unknown until the next evaluation) and the file is rewritten at the next save",
            stacklevel=4,
        )

    def _restore_labels(self, index: dict[str, Any]) -> None:
        """``best`` / ``last`` from ``index``; labels of the wrong type are reported and rebuilt instead."""
        try:
            best, last = index.get("best"), index.get("last")
            if best and index.get("metric") == self.metric and index.get("mode") == self.mode:
                step, value = _index_int(best["step"]), float(best["metric_value"])
                if math.isfinite(value):
                    self.best_step, self.best_value = step, value
            if last:
                self.last_step = _index_int(last["step"])
        except (KeyError, TypeError, ValueError, OverflowError) as err:
            self.best_step = self.best_value = None
            self._index_damaged(f"a label is malformed ({type(err).__name__}: {str(err)[:120]})")
            self.last_step = None
        if self.last_step is None:
            steps = self.kept_steps()
            self.last_step = steps[-1] if steps else None

    def _write_index(self, step: int, value: float | None) -> None:
        now = time.strftime("%Y-%m-%dT%H:%M:%S")
        best = None
        if self.best_step is not None:
            best = {"file": self.best_path.name, "step": self.best_step, "metric_value": self.best_value}
        index = {
            "metric": self.metric,
            "mode": self.mode,
            "last": {"file": self.last_path.name, "step": step, "metric_value": value, "saved_at": now},
            "best": best,
            "steps": self.kept_steps(),
        }
        atomic_write_json(self.index_path, index)
