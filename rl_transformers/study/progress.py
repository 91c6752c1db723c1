"""The study's progress over jobs: done / running / left and an ETA from measured rates.

On a terminal a ``tqdm`` bar over the invocation's jobs (the outcome lines printed above it); elsewhere (a log
file, CI, ``nohup``) one plain line per event, since a bar's carriage returns make a file unreadable.

ETA: each job has an estimated duration from the rates measured by earlier runs (:func:`study.run.estimate`:
steps/s of the same task and encoder, else scaled from similar runs). As jobs of this invocation finish, the
estimates are corrected by what they actually took: ``scale`` = sum of their wall-clock times / sum of their
estimates (this machine now, its load included). Then

    ETA = scale * (sum of the estimates of the jobs not started
                   + sum over running jobs of max(estimate - elapsed, 0)) / workers

which assumes the ``workers`` slots stay busy (a lower bound near the end, when fewer jobs than workers are left).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO


def eta_seconds(
    pending: list[float],
    running: list[tuple[float, float]],
    finished: list[tuple[float, float]],
    workers: int,
) -> float:
    """The ETA above. ``pending``: estimates of the jobs not started; ``running``: (estimate, elapsed s);
    ``finished``: (estimate, actual s) of this invocation's finished jobs."""
    est_done = sum(e for e, _ in finished)
    scale = sum(a for _, a in finished) / est_done if finished and est_done > 0 else 1.0
    left = sum(pending) + sum(max(e - t, 0.0) for e, t in running)
    return scale * left / max(1, workers)


def duration(seconds: float) -> str:
    """``1h 05m``, ``4m 10s``, ``12s``."""
    s = round(max(seconds, 0.0))
    if s >= 3600:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s}s"


class Progress:
    """Counts the jobs of one invocation (:meth:`start`, :meth:`finish` by job name) and shows them."""

    def __init__(
        self,
        estimates: dict[str, float],
        workers: int,
        log: Callable[[str], None] = print,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        bar: bool | None = None,
    ) -> None:
        """``estimates``: {job name: estimated seconds} of the jobs to run; ``bar`` None: a tqdm bar when
        ``stream`` (default stderr) is a terminal."""
        self.estimates, self.workers, self.log, self.clock = dict(estimates), max(1, workers), log, clock
        self.started: dict[str, float] = {}
        self.finished: dict[str, float] = {}
        stream = self._stream = sys.stderr if stream is None else stream
        use_bar = bar if bar is not None else bool(getattr(stream, "isatty", lambda: False)())
        self._bar: Any = None
        if use_bar:
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=len(self.estimates), unit="run", desc="study", file=stream, dynamic_ncols=True
            )

    def eta(self) -> float:
        now = self.clock()
        pending = [e for n, e in self.estimates.items() if n not in self.started]
        running = [(self.estimates[n], now - t) for n, t in self.started.items() if n not in self.finished]
        done = [(self.estimates[n], self.finished[n] - self.started[n]) for n in self.finished]
        return eta_seconds(pending, running, done, self.workers)

    def counts(self) -> tuple[int, int, int]:
        """(done, running, left) of this invocation's jobs."""
        done = len(self.finished)
        running = len(self.started) - done
        return done, running, len(self.estimates) - done - running

    def status(self) -> str:
        done, running, left = self.counts()
        return (
            f"{done}/{len(self.estimates)} done, {running} running, {left} left, ETA {duration(self.eta())}"
        )

    def start(self, name: str) -> None:
        self.started.setdefault(name, self.clock())
        self._refresh()

    def drop(self, name: str) -> None:
        """Job ``name`` will not run in this invocation (not started): out of the counts and the ETA."""
        self.estimates.pop(name, None)
        self.started.pop(name, None)
        if self._bar is not None:
            self._bar.total = len(self.estimates)
            self._refresh()

    def finish(self, name: str, line: str) -> None:
        """Job ``name`` ended; ``line`` says how (printed above the bar, or with the counts)."""
        self.started.setdefault(name, self.clock())
        self.finished[name] = self.clock()
        if self._bar is not None:
            self._bar.write(line, file=self._stream)
            self._bar.update(1)
            self._refresh()
        else:
            self.log(f"{line}  [{self.status()}]")

    def _refresh(self) -> None:
        if self._bar is not None:
            _, running, left = self.counts()
            self._bar.set_postfix_str(f"{running} running, {left} left, ETA {duration(self.eta())}")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
