"""The correctness gate of a benchmark row: run the checks of ``correctness.py`` and decide pass / fail.

Every timed row is gated. The checks run at the row's own length when it is at most ``check_max_len`` (and the
float64 twin fits the memory budget); a longer row is gated at the longest length of its series already
checked, or - when none was (e.g. ``--lengths 4096`` alone) - by a check run now at ``check_max_len``. Either
way the row says so (``checked_at`` and a note "checked at L = ..."), and a failure at the smaller length fails
the row. The backward mode shares the forward gate; the streaming step has its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from rl_transformers.bench import correctness as corr
from rl_transformers.bench.config import ResolvedConfig, Shape
from rl_transformers.bench.ops import Impl, Op, resolved_options

KNOWN_FULL_MASK = {
    "sdpa": lambda options, length: True,
    "full": lambda options, length: options.get("max_cache") is None or options["max_cache"] >= length,
    "local": lambda options, length: options.get("window", 64) >= length,
}
"""Exact entries whose mask is the full one at a given length: their ``ref_err`` must be numerical (gated)."""
KNOWN_MASK_TOLERANCE = 1e-6
"""Gate on ``ref_err`` (float64 vs float64) for :data:`KNOWN_FULL_MASK` entries and exact peers."""


@dataclasses.dataclass
class Gate:
    """Outcome of the correctness gate of one (implementation, target, size)."""

    status: str
    reason: str = ""
    num_err: float | None = None
    num_tol: float | None = None
    ref_err: float | None = None
    ref_tol: float | None = None
    probe: dict[str, Any] | None = None
    checked_at: int | None = None


class GateError(Exception):
    """The gate could not run: ``kind`` is 'unsupported', 'memory' or 'error' (the row says why)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail


Builder = Callable[[Impl, str, str, Shape, bool, str], Op]
"""build(impl, target, mode, shape, causal, position) -> Op."""


class Gatekeeper:
    """Runs and caches the gates of one benchmark run."""

    def __init__(self, rc: ResolvedConfig, build: Builder) -> None:
        self.rc = rc
        self.cfg = rc.config
        self.build = build
        self.gates: dict[tuple[Any, ...], Gate] = {}
        self.probes: dict[tuple[str, str, bool, int, int], corr.ProbeResult] = {}

    def gate(
        self,
        impl: Impl,
        position: str,
        target: str,
        mode: str,
        shape: Shape,
        causal: bool,
        mem_est: float | None,
    ) -> Gate:
        """The gate of a row (raises :class:`GateError` when it cannot run)."""
        kind = "step" if mode == "step" else "forward"
        series = (impl.name, position, target, kind, causal, shape.heads, shape.d_head)
        too_big = mem_est is not None and 2 * mem_est > self.rc.memory_budget
        if shape.length <= self.rc.check_max_len and not too_big:
            return self._cached(impl, position, target, kind, shape, causal, series)
        previous = [g for k, g in self.gates.items() if k[: len(series)] == series and g.checked_at]
        gate = (
            max(previous, key=lambda g: g.checked_at or 0)
            if previous
            else self._cached(impl, position, target, kind, self.smaller(shape, mem_est), causal, series)
        )
        why = "timed length above check_max_len" if not too_big else "the float64 check would exceed memory"
        note = f"checked at L = {gate.checked_at} ({why})"
        return dataclasses.replace(gate, reason=f"{gate.reason}; {note}" if gate.reason else note)

    def smaller(self, shape: Shape, mem_est: float | None = None) -> Shape:
        """The shape at which a row too long (or too big) to check is checked (same batch, heads, head size).

        At most ``check_max_len``, halved while the float64 twin (~2x the estimated peak, assumed to shrink only
        linearly with L: conservative) would exceed the memory budget; never below 64.
        """
        length = min(self.rc.check_max_len, shape.length)
        if mem_est is not None:
            while length > 64 and (
                length == shape.length or 2 * mem_est * length / shape.length > self.rc.memory_budget
            ):
                length //= 2
        return Shape(shape.batch, shape.heads, shape.d_head, length)

    def _cached(
        self, impl: Impl, position: str, target: str, kind: str, shape: Shape, causal: bool, series: tuple
    ) -> Gate:
        key = (*series, shape.batch, shape.length)
        if key not in self.gates:
            try:
                self.gates[key] = self._check(impl, position, target, kind, shape, causal)
            except ValueError as err:
                raise GateError("unsupported", f"unsupported: {err}") from err
            except torch.OutOfMemoryError as err:
                raise GateError("memory", f"skipped (memory): correctness check: {err}"[:300]) from err
            except Exception as err:
                raise GateError("error", f"{type(err).__name__}: {err}") from err
        return self.gates[key]

    def _check(self, impl: Impl, position: str, target: str, kind: str, shape: Shape, causal: bool) -> Gate:
        op = self.build(impl, target, kind, shape, causal, position)
        op.module.eval()
        name = impl.attention or impl.name
        gate = Gate(status="ok", checked_at=shape.length)
        gate.num_tol = corr.numeric_tolerance(name, self.rc.dtype)
        gate.num_err = corr.numerical_error(op)
        failures = []
        if not gate.num_err <= gate.num_tol:
            failures.append(
                f"numerical error {gate.num_err:.3g} > {gate.num_tol:g} (vs float64 run of the same op)"
            )
        if kind == "forward" and shape.length <= self.cfg.ref_max_len:
            gate.ref_err = corr.reference_error(op, position, self.cfg.n_layers)
            gate.ref_tol = self.ref_tolerance(impl, target, shape)
            if gate.ref_tol is not None and not (gate.ref_err is not None and gate.ref_err <= gate.ref_tol):
                failures.append(f"error vs dense reference {gate.ref_err:.3g} > {gate.ref_tol:g}")
        if impl.kind == "ours" and impl.exact:
            probe = self._probe(impl, position, causal, shape)
            gate.probe = {**probe.to_dict(), "length": self.cfg.probe_len}
            if not probe.ok:
                failures.append(f"softmax probe: {probe.reason}")
        if failures:
            gate.status, gate.reason = "failed", "; ".join(failures)
        return gate

    def ref_tolerance(self, impl: Impl, target: str, shape: Shape) -> float | None:
        if impl.kind == "peer":
            return KNOWN_MASK_TOLERANCE if impl.peer.reference_mask is not None else None
        name = (impl.attention or impl.name) if impl.kind == "ours" else "sdpa"
        if impl.exact:
            rule = KNOWN_FULL_MASK.get(name)
            full = rule is not None and rule(resolved_options(impl, shape.length), shape.length)
            return KNOWN_MASK_TOLERANCE if full else None
        if target != "kernel":
            return None
        return corr.APPROX_REF_TOLERANCE.get(name)

    def _probe(self, impl: Impl, position: str, causal: bool, shape: Shape) -> corr.ProbeResult:
        key = (impl.name, position, causal, shape.heads, shape.d_head)
        if key not in self.probes:
            small = Shape(1, shape.heads, shape.d_head, self.cfg.probe_len)
            self.probes[key] = corr.probe_softmax_structure(impl, position, causal, small, self.cfg.seed)
        return self.probes[key]
