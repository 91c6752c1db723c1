"""Training-loop helpers: seeding, CPU threads, graceful Ctrl-C, finiteness checks, linear schedules.

Method: :func:`seed_everything` seeds every global generator (Python, NumPy, torch CPU + CUDA) and can switch
torch to deterministic kernels. :func:`set_threads` sizes torch's intra-op pool to the cores this process may
use. :class:`GracefulInterrupt` turns the first SIGINT (Ctrl-C) / SIGTERM into a flag the loop polls, so it can
finish the current update, save a checkpoint and exit; a second signal raises ``KeyboardInterrupt``.
:func:`check_finite` stops training with a :class:`NonFiniteError` naming the quantity and the step.
:func:`linear_schedule` / :func:`linear_warmup` give learning-rate factors for annealing (CleanRL PPO) and
warm-up (Decision Transformer, Chen et al. 2021, arXiv:2106.01345).
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType, TracebackType
from typing import Any

import numpy as np
import torch

__all__ = [
    "GracefulInterrupt",
    "NonFiniteError",
    "available_cores",
    "check_finite",
    "linear_schedule",
    "linear_warmup",
    "seed_everything",
    "set_threads",
]


def seed_everything(seed: int, deterministic: bool = False) -> None:
    """Seed Python ``random``, NumPy's global RNG and torch (CPU and all CUDA devices).

    ``deterministic=True`` also asks torch for deterministic kernels (``torch.use_deterministic_algorithms``,
    cuDNN deterministic without autotuning, ``CUBLAS_WORKSPACE_CONFIG`` set if unset). That is slower and
    raises on ops that have no deterministic implementation. Environments are seeded separately, through
    ``env.reset(seed=...)``. ``PYTHONHASHSEED`` only matters for subprocesses, so it is set for them.
    """
    seed = int(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # seeds every CUDA device too
    os.environ.setdefault("PYTHONHASHSEED", str(seed))
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False


def available_cores() -> int:
    """Number of CPU cores this process may run on (its affinity mask where the OS exposes it)."""
    if hasattr(os, "sched_getaffinity"):
        return max(len(os.sched_getaffinity(0)), 1)
    return os.cpu_count() or 1


def set_threads(n: int | None = None) -> int:
    """Set torch's intra-op threads (and inter-op threads when still possible) to ``n``; return ``n``.

    ``n=None`` uses :func:`available_cores`. When many processes share the machine (subprocess vector envs,
    parallel seeds, test workers), give each about one thread: ``set_threads(1)`` in every worker, or the
    pools oversubscribe the cores and everything slows down. The inter-op pool can only be sized before
    torch first uses it; later calls leave it unchanged.
    """
    n = available_cores() if n is None else int(n)
    if n < 1:
        raise ValueError(f"number of threads must be >= 1, got {n}")
    torch.set_num_threads(n)
    # RuntimeError once parallel work has started: the inter-op pool can no longer be resized
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(n)
    return n


class GracefulInterrupt:
    """Context manager turning the first Ctrl-C into ``self.requested = True`` instead of an exception.

    >>> with GracefulInterrupt() as stop:
    ...     for update in range(num_updates):
    ...         train_one_update()
    ...         if stop.requested:
    ...             manager.save(state, step)
    ...             break

    A second signal raises ``KeyboardInterrupt`` (to abort a stuck save). Handlers are installed only in
    the main thread (Python delivers signals there; elsewhere the context does nothing and ``installed`` is
    False) and the previous handlers are restored on exit. By default SIGTERM (cluster pre-emption,
    ``kill``) is handled like SIGINT.
    """

    def __init__(
        self, signals: Sequence[int] = (signal.SIGINT, signal.SIGTERM), message: bool = True
    ) -> None:
        self.signals = tuple(signals)
        self.message = message
        self.requested = False
        self.signal_received: int | None = None
        self.installed = False
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt(f"second {signal.Signals(signum).name}: aborting")
        self.requested = True
        self.signal_received = signum
        if self.message:
            sys.stderr.write(
                f"\n{signal.Signals(signum).name} received: stopping after the current update "
                "(a checkpoint will be saved). Press Ctrl-C again to abort now.\n"
            )
            sys.stderr.flush()

    def __enter__(self) -> GracefulInterrupt:
        self.requested = False
        self.signal_received = None
        if threading.current_thread() is not threading.main_thread():
            return self
        for signum in self.signals:
            self._previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self._handle)
        self.installed = True
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self.installed:
            return
        for signum, previous in self._previous.items():
            # None: the previous handler was not installed from Python; the default is the best we can do
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()
        self.installed = False


class NonFiniteError(RuntimeError):
    """A loss, gradient norm or other training quantity became NaN or infinite."""

    def __init__(self, name: str, step: int | None, detail: str) -> None:
        where = "" if step is None else f" at step {step}"
        super().__init__(f"non-finite {name}{where}: {detail}")
        self.name = name
        self.step = step


def check_finite(value: Any, name: str, step: int | None = None) -> Any:
    """Raise :class:`NonFiniteError` if ``value`` (number, array or tensor) has a NaN or infinity; else return it.

    For a CUDA tensor this synchronises with the device; call it on values you already move to the host
    (logged losses) or once per update rather than per layer.
    """
    if isinstance(value, torch.Tensor):
        finite = torch.isfinite(value.detach())
        if bool(finite.all()):
            return value
        n_nan = int(torch.isnan(value.detach()).sum())
        n_inf = int((~finite).sum()) - n_nan
        if value.numel() == 1:
            detail = f"value {value.item()}"
        else:
            detail = f"{n_nan} NaN and {n_inf} inf of {value.numel()} elements (shape {tuple(value.shape)})"
        raise NonFiniteError(name, step, detail)
    if isinstance(value, np.ndarray) or (isinstance(value, list | tuple) and value):
        array = np.asarray(value, dtype=np.float64)
        finite_mask = np.isfinite(array)
        if finite_mask.all():
            return value
        n_nan = int(np.isnan(array).sum())
        n_inf = int((~finite_mask).sum()) - n_nan
        raise NonFiniteError(name, step, f"{n_nan} NaN and {n_inf} inf of {array.size} elements")
    number = float(value)
    if not math.isfinite(number):
        raise NonFiniteError(name, step, f"value {number}")
    return value


def linear_schedule(start: float, end: float, fraction: float) -> float:
    """``start + (end - start) * fraction`` with ``fraction`` clipped to [0, 1].

    PPO learning-rate annealing: ``lr = linear_schedule(lr0, 0.0, update / num_updates)``.
    """
    fraction = min(max(float(fraction), 0.0), 1.0)
    return start + (end - start) * fraction


def warmup_cosine(step: int, warmup_steps: int, total_steps: int) -> float:
    """:func:`linear_warmup`, then a cosine decay from 1 to 0 at ``total_steps`` (Loshchilov & Hutter 2017,
    arXiv 1608.03983, without restarts): ``0.5 (1 + cos(π (step - warmup) / (total - warmup)))``."""
    import math

    if step < warmup_steps:
        return linear_warmup(step, warmup_steps)
    span = max(total_steps - warmup_steps, 1)
    progress = min(max(step - warmup_steps, 0) / span, 1.0)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def linear_warmup(step: int, warmup_steps: int) -> float:
    """Learning-rate factor rising linearly to 1 over ``warmup_steps`` (``(step + 1) / warmup_steps``),
    then 1; the Decision Transformer schedule. ``warmup_steps <= 0`` means no warm-up."""
    if warmup_steps <= 0:
        return 1.0
    return min((step + 1) / warmup_steps, 1.0)
