"""The benchmark run: registry entries x positions x targets x modes x sizes -> rows, JSON, Markdown, plots.

For each (position, target, mode, shape) group, in order of increasing L:

1. **Static skips**: streaming step of an entry with ``streaming="none"`` or of a non-causal-only entry; sizes
   whose peak memory (extrapolated from shorter lengths, see ``memory.py``) exceeds the budget, or whose call time
   (extrapolated the same way from the measured medians; for a step, also the forward that builds its state)
   exceeds ``max_call_s`` (4x that for the SDPA baseline, so ratios exist where variants run).
2. **Memory** (CPU: a fresh process per config, budget-capped and time-limited, which doubles as a guard: a size
   too big or too slow dies there and is reported ``skipped (memory|time)``, or ``unsupported`` when the entry
   rejects the configuration).
3. **Correctness gate** (``gate.py``, checks in ``correctness.py``): numerical error vs float64, the softmax
   probe for exact entries, error vs dense attention over the full mask. Every timed row is gated: at its own
   length up to ``check_max_len``, above it at the longest checked length of its series or, when none was, by a
   check run at ``check_max_len`` (the row notes "checked at L = ..."). Failing entries are reported as
   ``failed`` and not timed; the backward mode shares the forward gate.
4. **Timing**: warm-up, round-robin repeats over the group's implementations, median and IQR (``timing.py``);
   on GPU the CUDA memory statistics are read around one call first.
5. Derived: tokens/s = B·T / t (T = L, or 1 for a step); dense-equivalent TFLOP/s (formula in :func:`~rl_transformers.bench.rows.flops`);
   ratio to SDPA (same target, mode, size and masking, same run); crossover lengths (``report.py``).

Entries that support only non-causal attention run non-causal (``causal`` False in their rows, with a note) and
are compared with SDPA non-causal measured in the same group.
"""

from __future__ import annotations

import gc
import os
import time
from pathlib import Path
from typing import Any

import torch

from rl_transformers.backbone import registry
from rl_transformers.bench import correctness as corr
from rl_transformers.bench.config import BenchConfig, ResolvedConfig, Shape
from rl_transformers.bench.gate import GateError, Gatekeeper
from rl_transformers.bench.kernels import census
from rl_transformers.bench.memory import Extrapolator, MemoryJob, measure_cpu, measure_gpu
from rl_transformers.bench.ops import Impl, Op, build_op, cheap_step_state, compile_op, registry_impls
from rl_transformers.bench.rows import base_row, skip
from rl_transformers.bench.timing import RepeatPolicy, clock_for, time_interleaved
from rl_transformers.runs.provenance import machine_info

SCHEMA_VERSION = 1
MIB = 2**20
BASELINE_TIME_FACTOR = 4.0
"""The SDPA baseline may take this many times ``max_call_s`` per call, so ratios exist where variants run."""


class Runner:
    """Runs the groups of one benchmark and collects rows (use :func:`run_benchmark`)."""

    def __init__(self, rc: ResolvedConfig, impls: list[Impl], log: Any = None) -> None:
        self.rc = rc
        self.cfg = rc.config
        self.impls = impls
        self.log = (log or _print_flush) if self.cfg.progress else (lambda *a, **k: None)
        self.rows: list[dict[str, Any]] = []
        self.mem_model = Extrapolator(floor=1.0 * MIB)
        self.time_model = Extrapolator()
        self.gatekeeper = Gatekeeper(rc, self._build)
        self.policy = RepeatPolicy(
            warmup=self.cfg.warmup,
            repeats=rc.repeats,
            slow_repeat_s=self.cfg.slow_repeat_s,
            slow_repeats=self.cfg.slow_repeats,
            min_repeat_s=rc.min_repeat_s,
        )

    # -- one group ----------------------------------------------------------------------------------------
    def run_group(self, position: str, target: str, mode: str, shape: Shape) -> list[dict[str, Any]]:
        load = os.getloadavg()[0]
        ops: dict[str, Op] = {}
        rows: dict[str, dict[str, Any]] = {}
        impls = [
            i
            for i in self.impls
            if i.kind != "peer" or (target == "kernel" and position == self.positions[0])
        ]
        flipped = any(i.run_causal(self.cfg.causal) != self.cfg.causal for i in impls if i.kind != "sdpa")
        entries: list[tuple[Impl, bool]] = []
        for impl in impls:
            if impl.kind == "sdpa":
                entries.append((impl, self.cfg.causal))
                if flipped and mode != "step":
                    entries.append((impl, not self.cfg.causal))
            else:
                entries.append((impl, impl.run_causal(self.cfg.causal)))
        for impl, causal in entries:
            label = (
                impl.name if causal == self.cfg.causal or impl.kind != "sdpa" else f"{impl.name} (non-causal)"
            )
            row = base_row(self.rc, impl, label, position, target, mode, shape, causal, load)
            rows[label] = row
            op = self._prepare(impl, row, position, target, mode, shape, causal)
            if op is not None:
                ops[label] = op
        self._time(ops, rows)
        if self.cfg.census:
            self._census(ops, rows)
        self._ratios(rows)
        if self.cfg.profile:
            self._profile(ops, position, target, mode, shape)
        out = list(rows.values())
        self.rows.extend(out)
        del ops
        gc.collect()
        if self.rc.device.type == "cuda":
            torch.cuda.empty_cache()
        return out

    @property
    def positions(self) -> tuple[str, ...]:
        return self.cfg.positions

    def _series(self, impl: Impl, position: str, target: str, mode: str, causal: bool, shape: Shape) -> tuple:
        return (impl.name, position, target, mode, causal, shape.heads, shape.d_head)

    def _prepare(
        self,
        impl: Impl,
        row: dict[str, Any],
        position: str,
        target: str,
        mode: str,
        shape: Shape,
        causal: bool,
    ) -> Op | None:
        """Skips, gate and memory for one implementation; the op to time, or None."""
        if mode == "step" and impl.streaming == "none":
            return skip(row, "streaming='none': the caller recomputes its window, no streaming step")
        if mode == "step" and not causal:
            return skip(row, "non-causal only: no streaming step")
        series = self._series(impl, position, target, mode, causal, shape)
        mem_est = self.mem_model.predict(series, shape)
        row["mem_estimate_bytes"] = mem_est
        limit = self.cfg.max_call_s * (BASELINE_TIME_FACTOR if impl.kind == "sdpa" else 1.0)
        reason = self._estimated_skip(impl, position, target, mode, shape, causal, series, mem_est, limit)
        if reason is not None:
            return skip(row, reason)
        if self.cfg.measure_memory and self.rc.device.type == "cpu":
            job = MemoryJob(
                impl, target, mode, shape, causal, position, self.cfg.n_layers, self.rc.dtype_name,
                self.cfg.seed, self.rc.threads, self.rc.memory_budget,
            )  # fmt: skip
            if not self._measure_in_subprocess(job, row, series, limit):
                return None
        if not self._passes_gate(impl, row, position, target, mode, shape, causal, mem_est):
            return None
        try:
            op = self._build(impl, target, mode, shape, causal, position)
        except torch.OutOfMemoryError as err:
            _free_device(self.rc.device)
            return skip(row, f"skipped (memory): {err}"[:300])
        except Exception as err:
            row["status"], row["reason"] = "error", f"{type(err).__name__}: {err}"
            return None
        if self.cfg.measure_memory and self.rc.device.type == "cuda":
            try:
                result = measure_gpu(op.call, self.rc.device)
            except torch.OutOfMemoryError as err:
                _free_device(self.rc.device)
                return skip(row, f"skipped (memory): {err}"[:300])
            row["peak_mem_bytes"], row["mem_method"] = result["peak_bytes"], result["method"]
            self.mem_model.add(series, shape, result["peak_bytes"])
        row["status"] = "ok" if impl.exact else "approx"
        return op

    def _estimated_skip(
        self,
        impl: Impl,
        position: str,
        target: str,
        mode: str,
        shape: Shape,
        causal: bool,
        series: tuple,
        mem_est: float | None,
        limit: float,
    ) -> str | None:
        """Why the size is skipped before running anything, or None: its extrapolated peak memory exceeds the
        budget, its extrapolated call time exceeds ``limit``, or (a step whose state is built by forwards
        over the past) building that state would."""
        budget = self.rc.memory_budget
        if mem_est is not None and mem_est > budget:
            return f"skipped (memory): estimated {mem_est / MIB:.0f} MiB > budget {budget / MIB:.0f} MiB"
        time_est = self.time_model.predict(series, shape)
        if time_est is not None and time_est > limit:
            return f"skipped (time): estimated {time_est:.1f} s per call > {limit:g} s"
        if mode == "step" and not cheap_step_state(impl, target):
            build_est = self._forward_time(impl, position, target, causal, shape)
            if build_est is not None and build_est > limit:
                return f"skipped (time): building the state needs ~{build_est:.1f} s of forward"
        return None

    def _measure_in_subprocess(
        self, job: MemoryJob, row: dict[str, Any], series: tuple, limit: float
    ) -> bool:
        """CPU peak memory of ``job`` in a fresh process, which doubles as a guard against sizes too big or too
        slow to time here: records the peak in ``row`` and the models; False when the row is skipped
        (memory, time, unsupported) or an error, True when it goes on to the gate."""
        result = measure_cpu(job, timeout=3 * limit + 60)
        if "error" in result:
            kind, detail = result["error"], result.get("detail", "")
            if kind in ("memory", "time", "unsupported"):
                skip(
                    row, f"skipped ({kind}): {detail}" if kind != "unsupported" else f"unsupported: {detail}"
                )
            else:
                row["status"], row["reason"] = "error", detail
            return False
        row["peak_mem_bytes"], row["mem_method"] = result["peak_bytes"], result["method"]
        self.mem_model.add(series, job.shape, result["peak_bytes"])
        if result["call_s"] > limit:
            self.time_model.add(series, job.shape, result["call_s"])
            skip(row, f"skipped (time): one call took {result['call_s']:.1f} s > {limit:g} s")
            return False
        return True

    def _passes_gate(
        self,
        impl: Impl,
        row: dict[str, Any],
        position: str,
        target: str,
        mode: str,
        shape: Shape,
        causal: bool,
        mem_est: float | None,
    ) -> bool:
        """The correctness gate (``gate.py``) for this row: its errors and tolerances recorded in ``row``; False
        when the row fails, is skipped (the gate ran out of memory or time) or is an error."""
        try:
            gate = self.gatekeeper.gate(impl, position, target, mode, shape, causal, mem_est)
        except GateError as err:
            if err.kind == "memory":
                _free_device(self.rc.device)
            if err.kind == "error":
                row["status"], row["reason"] = "error", err.detail
            else:
                skip(row, err.detail)
            return False
        for key in ("num_err", "num_tol", "ref_err", "ref_tol", "probe", "checked_at"):
            row[key] = getattr(gate, key)
        if gate.status == "failed":
            row["status"], row["reason"] = "failed", gate.reason
            return False
        if gate.reason:
            row["note"] = (row["note"] + "; " if row["note"] else "") + gate.reason
        return True

    def _forward_time(
        self, impl: Impl, position: str, target: str, causal: bool, shape: Shape
    ) -> float | None:
        """Measured (or extrapolated) forward time of this implementation at ``shape``."""
        series = self._series(impl, position, target, "forward", causal, shape)
        for length, batch, value in self.time_model.points.get(series, []):
            if length == shape.length and batch == shape.batch:
                return value
        return self.time_model.predict(series, shape)

    def _build(self, impl: Impl, target: str, mode: str, shape: Shape, causal: bool, position: str) -> Op:
        return build_op(
            impl, target, mode, shape, causal=causal, position=position, n_layers=self.cfg.n_layers,
            dtype=self.rc.dtype, device=self.rc.device, seed=self.cfg.seed,
        )  # fmt: skip

    # -- timing -------------------------------------------------------------------------------------------
    def _time(self, ops: dict[str, Op], rows: dict[str, dict[str, Any]]) -> None:
        fns = {label: op.call for label, op in ops.items()}
        if self.cfg.compile:
            for label, op in list(ops.items()):
                compiled_label = f"{label} [compiled]"
                row = rows[compiled_label] = {**rows[label], "variant": compiled_label, "compiled": True}
                compiled = compile_op(op)
                try:  # the compiled module must reproduce the eager output (first call also compiles)
                    start = time.perf_counter()
                    err = corr.rel_max_err(compiled.output(use_runner=True), op.output())
                    compile_s = time.perf_counter() - start
                except Exception as exc:
                    row["status"], row["reason"] = (
                        "error",
                        f"torch.compile: {type(exc).__name__}: {exc}"[:500],
                    )
                    continue
                row["note"] = (row["note"] + "; " if row["note"] else "") + (
                    f"compiled vs eager error {err:.1e}; first call incl. compilation {compile_s:.1f} s"
                )
                if not err <= (row["num_tol"] or corr.numeric_tolerance(op.impl.name, self.rc.dtype)):
                    row["status"], row["reason"] = (
                        "failed",
                        f"compiled output differs from eager by {err:.3g}",
                    )
                    continue
                fns[compiled_label] = compiled.call
        if not fns:
            return
        timings = time_interleaved(fns, self.policy, clock_for(self.rc.device))
        for label, timing in timings.items():
            row = rows[label]
            if timing.error is not None:
                if timing.error.startswith("OutOfMemoryError"):
                    skip(row, f"skipped (memory): {timing.error}"[:300])
                else:
                    row["status"], row["reason"] = "error", timing.error
                continue
            med = timing.median
            row.update(
                time_ms=med * 1e3,
                time_ms_q1=timing.q1 * 1e3,
                time_ms_q3=timing.q3 * 1e3,
                time_ms_iqr=timing.iqr * 1e3,
                repeats=len(timing.samples),
                loops=timing.loops,
                early_stop=timing.early_stop,
                first_call_ms=None if timing.first_call_s is None else timing.first_call_s * 1e3,
                tokens_per_s=row["batch"] * (1 if row["mode"] == "step" else row["length"]) / med,
                tflops=row["flops"] / med / 1e12,
            )
            if timing.early_stop:
                row["note"] = (row["note"] + "; " if row["note"] else "") + (
                    f"early stop after {len(timing.samples)} repeats (> {self.cfg.slow_repeat_s:g} s each)"
                )
            if not row["compiled"]:
                impl_name = row["variant"].removesuffix(" (non-causal)")
                shape = Shape(row["batch"], row["heads"], row["d_head"], row["length"])
                series = (impl_name, row["position"], row["target"], row["mode"], row["causal"], shape.heads,
                          shape.d_head)  # fmt: skip
                self.time_model.add(series, shape, med)

    def _census(self, ops: dict[str, Op], rows: dict[str, dict[str, Any]]) -> None:
        """The attention kernels each timed op ran and the FLOPs they really did (``kernels.py``)."""
        for label, op in ops.items():
            row = rows[label]
            if row["time_ms"] is None:
                continue
            try:
                found = census(op.call)
            except Exception as err:  # a diagnostic: its failure is a note, not the row's
                row["note"] = (row["note"] + "; " if row["note"] else "") + (
                    f"kernel census failed: {type(err).__name__}: {err}"[:200]
                )
                continue
            row["backends"] = found.backends
            row["real_flops"] = found.flops
            row["real_tflops"] = found.flops / (row["time_ms"] / 1e3) / 1e12

    def _ratios(self, rows: dict[str, dict[str, Any]]) -> None:
        baselines = {
            r["causal"]: r["time_ms"]
            for r in rows.values()
            if r["kind"] == "sdpa" and not r["compiled"] and r["time_ms"] is not None
        }
        for row in rows.values():
            base = baselines.get(row["causal"])
            if row["time_ms"] is not None and base:
                row["ratio_sdpa"] = row["time_ms"] / base

    def _profile(self, ops: dict[str, Op], position: str, target: str, mode: str, shape: Shape) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.rc.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        root = Path(self.rc.out) / "profile" / f"{position}-{target}-{mode}-{shape.label()}"
        for label, op in ops.items():
            handler = torch.profiler.tensorboard_trace_handler(str(root), worker_name=_safe(label))
            with torch.profiler.profile(
                activities=activities, record_shapes=True, profile_memory=True, on_trace_ready=handler
            ):
                for _ in range(2):
                    op.call()


def _free_device(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _print_flush(line: str) -> None:
    print(line, flush=True)


def _safe(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in label)


def select_impls(cfg: BenchConfig) -> tuple[list[Impl], list[str]]:
    """SDPA + registry entries (+ installed peers with ``--peers``); second value: notes for the report."""
    impls = registry_impls(cfg.attentions, cfg.exclude, cfg.options_by_attention)
    notes: list[str] = []
    if cfg.peers:
        from rl_transformers.bench.peers import peer_impls

        peers, missing = peer_impls()
        impls += peers
        if missing:
            notes.append(f"peers not installed (pip install the bench-peers extra): {', '.join(missing)}")
    if cfg.sdpa_backends:
        from rl_transformers.bench.peers import sdpa_backend_impls

        impls += sdpa_backend_impls()
    return impls, notes


def run_benchmark(
    cfg: BenchConfig, impls: list[Impl] | None = None, write: bool = True, deadline: float | None = None
) -> dict[str, Any]:
    """Run the benchmark of ``cfg``; returns the results dict (and writes JSON / Markdown / plots to ``out``).

    ``deadline`` (a ``time.monotonic()`` value): groups not started by then are left out, and the notes say how
    many (a time-boxed run, e.g. on a lent GPU, still returns every row it measured).
    """
    from rl_transformers.bench import report

    rc = cfg.resolve()
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(rc.threads)
    notes: list[str] = []
    if impls is None:
        impls, notes = select_impls(cfg)
    meta = machine_info(rc.device, rc.threads)
    meta["dtype"] = rc.dtype_name
    meta["registry"] = registry.available()
    meta["config"] = rc.to_dict()
    start = time.perf_counter()
    runner = Runner(rc, impls)
    left_out = 0
    try:
        for position in cfg.positions:
            registry.get("position", position)
            for target in rc.targets:
                for mode in cfg.modes:
                    for shape in rc.shapes:
                        if target == "model" and shape.length > rc.model_max_len:
                            continue
                        if deadline is not None and time.monotonic() > deadline:
                            left_out += 1
                            continue
                        t0 = time.perf_counter()
                        rows = runner.run_group(position, target, mode, shape)
                        runner.log(
                            _progress_line(position, target, mode, shape, rows, time.perf_counter() - t0)
                        )
    finally:
        torch.set_num_threads(previous_threads)
    meta["loadavg_end"] = list(os.getloadavg())
    meta["wall_s"] = time.perf_counter() - start
    loaded = max(meta["loadavg_start"][0], meta["loadavg_end"][0]) > meta["cores"]
    if loaded:
        notes.append(
            f"machine load above the core count during the run (load {meta['loadavg_start'][0]:.1f} -> "
            f"{meta['loadavg_end'][0]:.1f} on {meta['cores']} cores): absolute times are noisy, ratios less so"
        )
    if left_out:
        notes.append(f"time budget reached: {left_out} groups (position, target, mode, size) not run")
    meta["notes"] = notes
    results = {
        "schema_version": SCHEMA_VERSION,
        "meta": meta,
        "rows": runner.rows,
        "crossover": report.crossovers(runner.rows),
    }
    if write:
        report.write_all(results, rc.out, plots=cfg.plots)
    return results


def _progress_line(
    position: str, target: str, mode: str, shape: Shape, rows: list[dict], seconds: float
) -> str:
    parts = []
    for r in rows:
        if r["time_ms"] is not None:
            parts.append(f"{r['variant']}={r['time_ms']:.3g}ms")
        else:
            parts.append(f"{r['variant']}={r['status']}")
    return f"[{seconds:6.1f}s] {position}/{target}/{mode}/{shape.label()}: " + " ".join(parts)


def main_exit_code(results: dict[str, Any]) -> int:
    """0 unless a row errored (failed gates are results, not crashes)."""
    return 1 if any(r["status"] == "error" for r in results["rows"]) else 0
