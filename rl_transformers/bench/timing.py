"""Timing: warm-up, round-robin repeats over implementations, median and IQR.

Method. Every implementation of one size is warmed up (``warmup`` calls; fewer when a call already takes longer
than ``slow_repeat_s``), then its loop count n is calibrated so
that one repeat (n back-to-back calls) lasts at least ``min_repeat_s`` (timer overhead and jitter of very short
calls average out). Repeats then go round-robin - A B C, B C A, C A B, ... - so drift of the machine (other
tenants, thermal state) affects every implementation alike. An implementation stops after ``repeats`` repeats,
or after ``slow_repeats`` when one repeat took longer than ``slow_repeat_s`` (marked ``early_stop``). The per-call
time of a repeat is its duration / n; we report the median and the inter-quartile range (q3 - q1, linear
interpolation) over repeats. The garbage collector is paused while timing.

Clocks: ``time.perf_counter`` on CPU; on GPU, CUDA events recorded around the n calls after a
``torch.cuda.synchronize()``, read after synchronising again (``elapsed_time``, ms). The CUDA path takes the
event class and the synchronise function as arguments, so its control flow is tested on CPU with stand-ins.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch


def quantile(values: list[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default) of a non-empty list."""
    xs = sorted(values)
    if len(xs) == 1:
        return xs[0]
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass
class Timing:
    """Per-call times (seconds) of one implementation."""

    samples: list[float] = field(default_factory=list)
    loops: int = 1
    """Calls per repeat."""
    early_stop: bool = False
    first_call_s: float | None = None
    """Duration of the first warm-up call (includes compilation for compiled implementations)."""
    error: str | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def q1(self) -> float:
        return quantile(self.samples, 0.25)

    @property
    def q3(self) -> float:
        return quantile(self.samples, 0.75)

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1


class CpuClock:
    """Wall-clock time of n calls."""

    def time(self, fn: Callable[[], Any], n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            fn()
        return time.perf_counter() - start


class CudaClock:
    """CUDA-event time of n calls (synchronised before and after)."""

    def __init__(self, event_cls: Any = None, synchronize: Callable[[], None] | None = None) -> None:
        self.event_cls = event_cls if event_cls is not None else torch.cuda.Event
        self.synchronize = synchronize if synchronize is not None else torch.cuda.synchronize

    def time(self, fn: Callable[[], Any], n: int) -> float:
        start, end = self.event_cls(enable_timing=True), self.event_cls(enable_timing=True)
        self.synchronize()
        start.record()
        for _ in range(n):
            fn()
        end.record()
        self.synchronize()
        return start.elapsed_time(end) / 1000.0


def clock_for(device: torch.device) -> CpuClock | CudaClock:
    return CudaClock() if device.type == "cuda" else CpuClock()


@dataclass(frozen=True)
class RepeatPolicy:
    warmup: int = 2
    repeats: int = 10
    slow_repeat_s: float = 2.0
    slow_repeats: int = 3
    min_repeat_s: float = 0.02
    max_loops: int = 10_000


def time_interleaved(
    fns: dict[str, Callable[[], Any]],
    policy: RepeatPolicy,
    clock: CpuClock | CudaClock | None = None,
) -> dict[str, Timing]:
    """Round-robin timing of ``fns`` (see the module docstring). An exception marks that entry's ``error``."""
    clock = clock or CpuClock()
    timings = {name: Timing() for name in fns}
    active: list[str] = []
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for name, fn in fns.items():
            timing = timings[name]
            try:
                for i in range(max(1, policy.warmup)):
                    elapsed = clock.time(fn, 1)
                    if i == 0:
                        timing.first_call_s = elapsed
                    if elapsed > policy.slow_repeat_s:
                        break  # a slow call is its own warm-up: the repeats themselves are few and long
                timing.loops = _calibrate(fn, clock, elapsed, policy)
            except Exception as err:  # the caller reports it in the row
                timing.error = f"{type(err).__name__}: {err}"
                continue
            active.append(name)
        rounds = 0
        while active:
            order = active[rounds % len(active) :] + active[: rounds % len(active)]
            for name in order:
                timing = timings[name]
                try:
                    per_call = clock.time(fns[name], timing.loops) / timing.loops
                except Exception as err:
                    timing.error = f"{type(err).__name__}: {err}"
                    active.remove(name)
                    continue
                timing.samples.append(per_call)
                repeat_s = per_call * timing.loops
                if len(timing.samples) >= policy.repeats:
                    active.remove(name)
                elif repeat_s > policy.slow_repeat_s and len(timing.samples) >= policy.slow_repeats:
                    timing.early_stop = True
                    active.remove(name)
            rounds += 1
    finally:
        if gc_was_enabled:
            gc.enable()
    return timings


def _calibrate(fn: Callable[[], Any], clock: CpuClock | CudaClock, last: float, policy: RepeatPolicy) -> int:
    """Loops per repeat so that a repeat lasts >= ``min_repeat_s`` (from the last warm-up call's time)."""
    if last >= policy.min_repeat_s:
        return 1
    loops = 1
    per_call = max(last, 1e-7)
    while loops < policy.max_loops and per_call * loops < policy.min_repeat_s:
        loops = min(policy.max_loops, max(loops * 2, int(policy.min_repeat_s / per_call) + 1))
        per_call = clock.time(fn, loops) / loops
    return loops
