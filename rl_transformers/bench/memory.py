"""Peak memory of one call, and the estimate that decides whether a size is run at all.

CPU: a fresh process per config (forked from a ``forkserver`` that has imported torch and the registry, so it
starts in milliseconds and has no threads or memory of earlier configs). The child fixes glibc's mmap threshold
(64 KiB) so freed blocks go back to the OS instead of being reused unseen below the peak mark, builds the op
(weights, inputs, step state), runs a tiny warm-up of the same implementation (library initialisation), trims
the heap (``malloc_trim``), resets the
kernel's peak-RSS mark (``/proc/self/clear_refs``), reads the current RSS as the baseline, runs one call and
reports ``VmHWM - baseline``: the extra resident memory of the call beyond its inputs and weights. Without
``clear_refs`` it falls back to ``ru_maxrss`` (a high-water mark since process start; then the baseline is that
mark before the call). The child also times the call, caps its data segment (``RLIMIT_DATA``) at baseline +
budget - an allocation beyond the budget fails inside the child instead of taking the machine down - and is
killed after ``timeout`` seconds: both come back as "skipped (memory)" / "skipped (time)".

GPU: in-process, ``torch.cuda.reset_peak_memory_stats()``; ``max_memory_allocated() - memory_allocated()``
around one synchronised call (same definition: extra memory of the call).

Estimate before running a size: from the peaks measured at the two longest smaller lengths of the same series,
peak(L) ~ peak(L1) · (L / L1)^s · (B / B1), with the log-log slope s clamped to [1, 2] (2 with one point, i.e.
quadratic attention as the worst case). A size whose estimate exceeds the budget is skipped.
"""

from __future__ import annotations

import ctypes
import gc
import math
import multiprocessing as mp
import resource
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from rl_transformers.bench.config import Shape
from rl_transformers.bench.ops import Impl, build_op

_CTX: Any = None
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters


def _context() -> Any:
    global _CTX
    if _CTX is None:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["rl_transformers.bench._preload"])
        _CTX = ctx
    return _CTX


def _status_bytes(key: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _maxrss_bytes() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: kB


@dataclass(frozen=True)
class MemoryJob:
    """Everything a child needs to rebuild and run one op."""

    impl: Impl
    target: str
    mode: str
    shape: Shape
    causal: bool
    position: str
    n_layers: int
    dtype: str
    seed: int
    threads: int
    budget_bytes: float


def malloc_returns_memory() -> Any:
    """Make glibc give large blocks back to the OS at free() (fixed mmap threshold, no dynamic raise), so RSS
    tracks live memory and freed blocks are not silently reused below the peak mark; returns malloc_trim."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(M_MMAP_THRESHOLD, 64 * 1024)
        libc.mallopt(M_TRIM_THRESHOLD, 128 * 1024)
        return libc.malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


def measure_rss(call: Callable[[], object], trim: Any = None) -> dict[str, Any]:
    """Extra resident memory of one ``call`` in this process (meant for a fresh child, after
    :func:`malloc_returns_memory` and a warm-up): collect, trim the heap, reset the peak mark, run, read it."""
    gc.collect()
    if trim is not None:
        trim(0)
    if _reset_peak() and _status_bytes("VmRSS") is not None:
        method, baseline = "vmhwm", _status_bytes("VmRSS")
    else:
        method, baseline = "ru_maxrss", _maxrss_bytes()
    start = time.perf_counter()
    call()
    call_s = time.perf_counter() - start
    peak = _status_bytes("VmHWM") if method == "vmhwm" else _maxrss_bytes()
    return {"peak_bytes": max(0, int(peak or 0) - int(baseline or 0)), "call_s": call_s, "method": method}


def _child(job: MemoryJob, conn: Any) -> None:
    try:
        trim = malloc_returns_memory()
        torch.set_num_threads(job.threads)
        dtype = getattr(torch, job.dtype)
        common = dict(
            causal=job.causal, position=job.position, n_layers=job.n_layers, dtype=dtype, seed=job.seed
        )
        small = Shape(job.shape.batch, job.shape.heads, job.shape.d_head, min(64, job.shape.length))
        try:
            build_op(job.impl, job.target, job.mode, small, **common).call()  # library initialisation
            op = build_op(job.impl, job.target, job.mode, job.shape, **common)
        except ValueError as err:  # the entry rejects this configuration
            conn.send({"error": "unsupported", "detail": str(err)[:300]})
            return
        data = _status_bytes("VmData")
        if data is not None and math.isfinite(job.budget_bytes):
            limit = int(data + job.budget_bytes)
            resource.setrlimit(resource.RLIMIT_DATA, (limit, resource.getrlimit(resource.RLIMIT_DATA)[1]))
        conn.send(measure_rss(op.call, trim))
    except (MemoryError, RuntimeError) as err:
        text = str(err)
        if isinstance(err, MemoryError) or "allocate" in text:
            conn.send({"error": "memory", "detail": text[:300]})
        else:
            conn.send({"error": "error", "detail": f"{type(err).__name__}: {text[:300]}"})
    except Exception as err:
        conn.send(
            {"error": "error", "detail": f"{type(err).__name__}: {err}\n{traceback.format_exc()[-600:]}"}
        )
    finally:
        conn.close()


def measure_cpu(job: MemoryJob, timeout: float) -> dict[str, Any]:
    """Run ``job`` in a fresh process: dict with peak_bytes / call_s / method, or error = memory | time |
    unsupported | error (with a detail)."""
    return run_in_child(_child, (job,), timeout)


def run_in_child(target: Callable[..., None], args: tuple[Any, ...], timeout: float) -> dict[str, Any]:
    """``target(*args, conn)`` in a fresh forkserver process; the dict it sends on ``conn``, or error = memory
    (the process died) | time (no answer within ``timeout`` s, then it is killed) | error (a bad exit code)."""
    ctx = _context()
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=target, args=(*args, child), daemon=True)
    proc.start()
    child.close()
    result: dict[str, Any]
    if parent.poll(timeout):
        try:
            result = parent.recv()
        except EOFError:
            result = {
                "error": "memory",
                "detail": f"process died (exit code {proc.exitcode}), likely out of memory",
            }
    else:
        result = {"error": "time", "detail": f"no result within {timeout:.0f} s"}
    proc.join(5)
    if proc.is_alive():
        proc.kill()
        proc.join()
    if "error" not in result and proc.exitcode not in (0, None):
        result = {"error": "error", "detail": f"exit code {proc.exitcode}"}
    parent.close()
    return result


def measure_gpu(call: Any, device: torch.device) -> dict[str, Any]:
    """Extra CUDA memory of one call (``max_memory_allocated`` after a peak reset, minus the baseline)."""
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    baseline = torch.cuda.memory_allocated(device)
    start = time.perf_counter()
    call()
    torch.cuda.synchronize(device)
    call_s = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated(device)
    return {"peak_bytes": int(peak - baseline), "call_s": call_s, "method": "cuda_max_memory_allocated"}


@dataclass
class Extrapolator:
    """Power-law extrapolation of a per-series quantity (peak bytes, seconds) in L, linear in B."""

    floor: float = 0.0
    points: dict[Any, list[tuple[int, int, float]]] = field(default_factory=dict)

    def add(self, key: Any, shape: Shape, value: float) -> None:
        self.points.setdefault(key, []).append((shape.length, shape.batch, max(value, self.floor)))

    def predict(self, key: Any, shape: Shape) -> float | None:
        pts = sorted(p for p in self.points.get(key, []) if p[0] < shape.length)
        if not pts:
            return None
        l2, b2, v2 = pts[-1]
        slope = 2.0
        if len(pts) >= 2:
            l1, b1, v1 = pts[-2]
            if l1 != l2 and v1 > 0 and v2 > 0:
                slope = math.log((v2 / b2) / (v1 / b1)) / math.log(l2 / l1)
                slope = min(2.0, max(1.0, slope))
        return v2 * (shape.length / l2) ** slope * (shape.batch / b2)
