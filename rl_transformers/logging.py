"""One training logger over TensorBoard, a JSON-lines file and a stdout table.

Method: the trainer *records* named scalars during an iteration and *dumps* them once per logging window
(the Stable-Baselines3 ``record``/``dump`` pattern). ``record(key, v)`` keeps the last value of the window,
``record_mean(key, v)`` keeps the mean of every value (or every element of an array) recorded in the window.
``dump(step)`` writes the window to each output, then clears it:

* TensorBoard (``torch.utils.tensorboard.SummaryWriter``): one scalar per key at ``global_step=step``.
* JSON lines (``progress.jsonl``): one object per dump, ``{"step": step, key: value, ...}``. Non-finite
  values are written as ``NaN`` / ``Infinity`` (what Python's ``json`` reads back), never dropped.
* stdout: a compact table grouped by tag prefix; pass ``stdout=False`` to switch it off.

Hyper-parameters go to TensorBoard twice (``log_hparams``): as an HParams-plugin session (its hyper-parameters
and status) and as a markdown table under the text tag ``hyperparameters`` (the CleanRL habit, readable without
the plugin). No run writes an HParams *experiment* definition: TensorBoard's HParams plugin takes the first
one it finds anywhere under ``--logdir`` (``backend_context._find_experiment_tag``), so in a log directory
mixing algorithms (``runs/ppo/...`` beside ``runs/dt/...``) the other algorithm's hyper-parameters and metrics
would be hidden. Without one, the plugin derives the experiment from every run (the union of the sessions'
hyper-parameters and of their scalar tags), so each algorithm's runs show their own columns and metrics.

Tags (the names and meanings every trainer shares, Stable-Baselines3's where a name exists) live in
:mod:`rl_transformers.tags` (import them from there). The logger never invents a tag, except the
``time/<name>_s`` convention of :func:`measure_time`.

Resume: open the logger on the old run directory with ``purge_step=<resumed step + 1>``; TensorBoard hides
events at or after that step and the JSONL file is rewritten without them, so the curve continues cleanly.
"""

from __future__ import annotations

import json
import math
import numbers
import sys
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from time import perf_counter
from types import TracebackType
from typing import IO, Any

import numpy as np
import torch

from rl_transformers.utils.atomic import atomic_write_text
from rl_transformers.utils.config_json import to_jsonable

__all__ = [
    "OUTPUTS",
    "Logger",
    "Timer",
    "hparams_markdown",
    "measure_time",
]


OUTPUTS = ("stdout", "json", "tensorboard")
"""Output names accepted by ``exclude=`` in :meth:`Logger.record` / :meth:`Logger.record_mean`."""

_HPARAMS_TEXT_TAG = "hyperparameters"


def _as_value(value: Any) -> float | int | str:
    """A recorded value as a Python scalar: tensors/arrays of one element are unwrapped, bools become ints."""
    if isinstance(value, torch.Tensor | np.ndarray):
        size = value.numel() if isinstance(value, torch.Tensor) else value.size
        if size != 1:
            raise ValueError(f"record() takes a scalar; got shape {tuple(value.shape)} (use record_mean)")
        value = value.item()
    if isinstance(value, bool | np.bool_):
        return int(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, str):
        return value
    raise TypeError(f"cannot record a value of type {type(value).__name__}: {value!r}")


def _as_floats(value: Any) -> list[float]:
    """Every element of a scalar, sequence, array or tensor, as Python floats (for ``record_mean``)."""
    if isinstance(value, torch.Tensor):
        return [float(v) for v in value.detach().double().cpu().reshape(-1).tolist()]
    if isinstance(value, np.ndarray | list | tuple):
        return [float(v) for v in np.asarray(value, dtype=np.float64).reshape(-1)]
    if isinstance(value, numbers.Real):
        return [float(value)]
    raise TypeError(f"record_mean takes numbers or arrays; got {type(value).__name__}: {value!r}")


def _check_exclude(exclude: str | tuple[str, ...]) -> frozenset[str]:
    names = (exclude,) if isinstance(exclude, str) else tuple(exclude)
    bad = [n for n in names if n not in OUTPUTS]
    if bad:
        raise ValueError(f"unknown output(s) {bad} in exclude; valid: {list(OUTPUTS)}")
    return frozenset(names)


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """A nested JSON-able mapping flattened to ``{"a.b.c": leaf}`` (lists are kept as leaves)."""
    if isinstance(tree, Mapping):
        out: dict[str, Any] = {}
        for key, sub in tree.items():
            out.update(_flatten(sub, f"{prefix}{key}."))
        return out if out or not prefix else {prefix[:-1]: "{}"}
    return {prefix[:-1]: tree}


def hparams_markdown(hparams: Mapping[str, Any] | Any) -> str:
    """A two-column markdown table ``| parameter | value |`` of flattened hyper-parameters."""
    flat = _flatten(to_jsonable(hparams, strict=False))
    rows = []
    for key, value in flat.items():
        cells = [key, value if isinstance(value, str) else json.dumps(value)]
        cells = [c.replace("|", "\\|").replace("\n", " ") for c in cells]  # keep one row per parameter
        rows.append(f"| {cells[0]} | {cells[1]} |")
    return "\n".join(["| parameter | value |", "|---|---|", *rows])


def _format_value(value: float | int | str) -> str:
    if isinstance(value, str):
        return value if len(value) <= 24 else value[:21] + "..."
    if isinstance(value, int):
        return str(value)
    return f"{value:.4g}"


class Logger:
    """Records scalars and writes them to TensorBoard, ``progress.jsonl`` and stdout at each ``dump``.

    Args:
        log_dir: run directory holding the event files and ``progress.jsonl``; ``None`` writes stdout only.
        stdout: print a table at each dump.
        tensorboard: write TensorBoard event files into ``log_dir``.
        jsonl: append to ``log_dir / jsonl_name``.
        purge_step: when resuming, the first step of the continued run; events and JSONL rows at or after it
            (left by the interrupted run) are discarded.
        stream: where the table goes (``sys.stdout`` at call time when ``None``).
    """

    def __init__(
        self,
        log_dir: str | Path | None,
        *,
        stdout: bool = True,
        tensorboard: bool = True,
        jsonl: bool = True,
        jsonl_name: str = "progress.jsonl",
        purge_step: int | None = None,
        stream: IO[str] | None = None,
    ) -> None:
        self.log_dir = None if log_dir is None else Path(log_dir)
        self.stdout = stdout
        self._stream = stream
        self._values: dict[str, float | int | str] = {}
        self._sums: dict[str, tuple[float, int]] = {}
        self._excluded: dict[str, frozenset[str]] = {}
        self.last_step: int | None = None
        self._writer: Any = None
        self._jsonl: IO[str] | None = None
        self.jsonl_path: Path | None = None
        self._closed = False
        if self.log_dir is None:
            return
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if jsonl:
            self.jsonl_path = self.log_dir / jsonl_name
            if purge_step is not None:
                _purge_jsonl(self.jsonl_path, purge_step)
            self._jsonl = self.jsonl_path.open("a", encoding="utf-8")
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # deferred: importing tensorboard is slow

            self._writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=purge_step)

    # --- recording -----------------------------------------------------------------------------------
    def record(self, key: str, value: Any, exclude: str | tuple[str, ...] = ()) -> None:
        """Set ``key`` to ``value`` for the current window (the last value recorded wins).

        ``value``: a Python/NumPy number, a one-element tensor/array, a bool (stored as 0/1) or a string
        (strings go to stdout and JSONL only). ``exclude``: outputs in :data:`OUTPUTS` to skip.
        """
        self._values[key] = _as_value(value)
        self._sums.pop(key, None)
        self._excluded[key] = _check_exclude(exclude)

    def record_mean(self, key: str, value: Any, exclude: str | tuple[str, ...] = ()) -> None:
        """Add ``value`` (a number, or every element of an array/tensor/list) to the window mean of ``key``."""
        floats = _as_floats(value)
        total, count = self._sums.get(key, (0.0, 0))
        self._sums[key] = (total + math.fsum(floats), count + len(floats))
        self._values.pop(key, None)
        self._excluded[key] = _check_exclude(exclude)

    def pending(self) -> dict[str, float | int | str]:
        """The values the next ``dump`` would write (means resolved), sorted by key."""
        merged: dict[str, float | int | str] = dict(self._values)
        for key, (total, count) in self._sums.items():
            if count > 0:
                merged[key] = total / count
        return dict(sorted(merged.items()))

    def non_finite_keys(self) -> list[str]:
        """Keys of the current window whose value is NaN or infinite (they are still logged as is)."""
        return [k for k, v in self.pending().items() if isinstance(v, float) and not math.isfinite(v)]

    # --- writing -------------------------------------------------------------------------------------
    def dump(self, step: int) -> dict[str, float | int | str]:
        """Write the window at ``step`` to every output, flush the JSONL file, clear the window.

        Returns the dict of values written (empty, and nothing written, when nothing was recorded).
        """
        self._check_open()
        values = self.pending()
        excluded = self._excluded
        self._values, self._sums, self._excluded = {}, {}, {}
        if not values:
            return {}
        step = int(step)
        self.last_step = step
        if self._writer is not None:
            for key, value in values.items():
                if not isinstance(value, str) and "tensorboard" not in excluded.get(key, ()):
                    self._writer.add_scalar(key, value, global_step=step)
        if self._jsonl is not None:
            row = {"step": step} | {k: v for k, v in values.items() if "json" not in excluded.get(k, ())}
            self._jsonl.write(json.dumps(row) + "\n")
            self._jsonl.flush()
        if self.stdout:
            shown = {k: v for k, v in values.items() if "stdout" not in excluded.get(k, ())}
            if shown:
                stream = self._stream if self._stream is not None else sys.stdout
                stream.write(_table(step, shown))
                stream.flush()
        return values

    def log_hparams(
        self, hparams: Mapping[str, Any] | Any, metrics: Mapping[str, float | None], step: int | None = None
    ) -> None:
        """Write an HParams-plugin session (no experiment definition, see the module docstring) and a markdown
        table (text tag ``hyperparameters``).

        Args:
            hparams: a (nested) dict or dataclass config; nested keys are flattened to ``a.b.c``, values that
                are not numbers/strings/bools become strings.
            metrics: the run's key scalar tags (e.g. ``{EP_REW_MEAN: None}``). The HParams dashboard lists
                every scalar tag of the runs; a numeric value here is also written as a scalar at ``step``
                when ``step`` is given (e.g. final scores), otherwise values are ignored.
            step: see ``metrics``.
        """
        self._check_open()
        if self._writer is None:
            return
        from torch.utils.tensorboard.summary import hparams as hparams_summary

        flat = {}
        for key, value in _flatten(to_jsonable(hparams, strict=False)).items():
            flat[key] = value if isinstance(value, bool | int | float | str) else json.dumps(value)
        _experiment, start_info, end_info = hparams_summary(flat, {k: 0.0 for k in metrics})
        file_writer = self._writer._get_file_writer()
        for summary in (start_info, end_info):  # no experiment definition: it would hide other algorithms
            file_writer.add_summary(summary)
        if step is not None:
            for key, value in metrics.items():
                if value is not None:
                    self._writer.add_scalar(key, float(value), global_step=step)
        self._writer.add_text(_HPARAMS_TEXT_TAG, hparams_markdown(hparams), global_step=0)

    def text(self, tag: str, text: str, step: int = 0) -> None:
        """Write a (markdown) text entry to TensorBoard."""
        self._check_open()
        if self._writer is not None:
            self._writer.add_text(tag, text, global_step=step)

    @contextmanager
    def measure_time(self, name: str, mean: bool = False) -> Iterator[Timer]:
        """Shorthand for ``measure_time(name, self, mean=mean)``."""
        with measure_time(name, self, mean=mean) as timer:
            yield timer

    def flush(self) -> None:
        """Push buffered JSONL lines and TensorBoard events to disk."""
        if self._jsonl is not None:
            self._jsonl.flush()
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        """Flush and close every output (idempotent). Values recorded since the last dump are dropped."""
        if self._closed:
            return
        self._closed = True
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
        if self._jsonl is not None:
            self._jsonl.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this Logger is closed")

    def __enter__(self) -> Logger:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _purge_jsonl(path: Path, purge_step: int) -> None:
    """Rewrite ``path`` without rows whose step is ``>= purge_step`` (temp file + ``os.replace``)."""
    if not path.exists():
        return
    kept, damaged = [], []
    text = path.read_bytes().decode("utf-8", errors="replace")
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            step = row.get("step")
            if step is not None and not isinstance(step, int | float):
                raise TypeError(f"step {step!r}")
        except (ValueError, AttributeError, TypeError):  # a line cut by a crash, or garbage: drop it
            damaged.append(number)
            continue
        if step is None or step < purge_step:
            kept.append(line + "\n")
    if damaged:
        shown = ", ".join(map(str, damaged[:10])) + (" ..." if len(damaged) > 10 else "")
        warnings.warn(
            f"{path}: skipped {len(damaged)} damaged line(s) (line {shown}) on resume", stacklevel=3
        )
    atomic_write_text(path, "".join(kept))


def _table(step: int, values: Mapping[str, float | int | str]) -> str:
    """An SB3-like box: one section per tag prefix, keys indented under it."""
    rows: list[tuple[str, str]] = [("step", str(step))]
    group = None
    for key, value in values.items():
        prefix, sep, leaf = key.partition("/")
        if sep:
            if prefix != group:
                rows.append((prefix + "/", ""))
                group = prefix
            rows.append(("    " + leaf, _format_value(value)))
        else:
            group = None
            rows.append((key, _format_value(value)))
    key_w = max(len(k) for k, _ in rows)
    val_w = max(len(v) for _, v in rows)
    dashes = "-" * (key_w + val_w + 7)
    lines = [dashes, *(f"| {k:<{key_w}} | {v:<{val_w}} |" for k, v in rows), dashes]
    return "\n".join(lines) + "\n"


class Timer:
    """Elapsed wall-clock seconds of a :func:`measure_time` block (``elapsed`` is set when the block ends)."""

    def __init__(self) -> None:
        self.start = perf_counter()
        self.elapsed: float | None = None


@contextmanager
def measure_time(name: str, logger: Logger | None = None, *, mean: bool = False) -> Iterator[Timer]:
    """Time a block; record the seconds under ``time/<name>_s`` (or ``name`` itself if it contains ``/``).

    ``mean=True`` uses ``record_mean`` (average over the blocks of a window) instead of ``record``.
    Without a logger it only measures: ``with measure_time("x") as t: ...; t.elapsed``.
    """
    key = name if "/" in name else f"time/{name}_s"
    timer = Timer()
    try:
        yield timer
    finally:
        timer.elapsed = perf_counter() - timer.start
        if logger is not None:
            (logger.record_mean if mean else logger.record)(key, timer.elapsed)
