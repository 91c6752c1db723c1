"""The memory probe's grid: encoders x context bound x k x seeds, resumable, with a stop rule and a dry run.

A **row** is an encoder with its context knob (:mod:`rl_transformers.study.knobs`) either at its default
(``bound="default"``) or raised to cover k (``bound="cover"``: knob = max(default, k + 1)); encoders without a
reach knob (GRU / LSTM / MLP, kernel attentions, ...) have the default row only (a capacity knob, e.g. the
RNNs' hidden size, stays at the encoder's value). A row runs k in increasing
order and **stops** after the first k at which no seed reached the success accuracy (the larger k are reported
as not run). A **cell** is (encoder, knob value, k, seed); default and cover rows share the cells where the
covering value is the default. Where a row's first seed at some k gives exactly an earlier row's cell, the
two are the same model under two names there (:func:`repeat_of`): its other seeds at that k are not run and
the report marks the cell as repeating the other row's. Each cell's result is one JSON file,
``<out>/<encoder>/<knob>=<value>/k<k>-s<seed>.json``, written atomically when the cell finishes: a second
invocation skips finished cells, so an interrupted grid resumes where it stopped (several processes may share
an ``--out`` when their ``--encoders`` are disjoint). A result measured with other settings is refused rather
than mixed in.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from experiments.memory_probe.probe import CellResult, ProbeSettings, measure
from rl_transformers.study import launch
from rl_transformers.study.encoders import Encoder, label
from rl_transformers.study.flags import Flags, StudyFlags
from rl_transformers.study.knobs import Knob, context_knob
from rl_transformers.utils.atomic import atomic_write_json
from rl_transformers.utils.errors import UserError

Bound = Literal["default", "cover"]
KS = (1, 4, 16, 64, 256, 1024)
"""The lookup distances of the probe's grid."""
REQUIRED = {"accuracy", "updates_to_success", "updates_per_s", "k", "seed", "spec", "settings"}
"""Fields every cell result has."""


FLAGS = StudyFlags(out=Path("runs/memory_probe"), docs=None, seeds=(0, 1, 2), timeout_s=None)
"""The probe's values of the shared study flags: cells under ``runs/memory_probe``, documents only with
``--docs``, three seeds, one process and no per-run timeout (the cells run one after another in this process)."""


@dataclass(frozen=True)
class ProbeConfig:
    """The memory probe (``python -m experiments.memory_probe.run``): the shared study flags (``--out``: the
    per-cell result files, <out>/<encoder>/<knob>=<value>/k<k>-s<seed>.json; ``--docs``: write
    memory_probe.{md,json} and plots/memory_probe.png there; ``--no-restore``, ``--seeds``, ``--dry-run``,
    ``--report-only``, ``--stop-starting-after-h``) and the probe's own grid and settings."""

    encoders: tuple[str, ...] = ()
    """Study encoder names (default: every PPO encoder of the study: causal attentions, memories, depths,
    GRU / LSTM / MLP)."""
    ks: tuple[int, ...] = KS
    """Lookup distances k, run in increasing order."""
    bounds: tuple[Bound, ...] = ("default", "cover")
    """Context bounds: the knob's default, and raised to cover k."""
    settings: ProbeSettings = field(default_factory=ProbeSettings)
    """Stream, training and success settings shared by all cells."""
    assumed_updates_per_s: float = 1.0
    """Rate assumed by --dry-run for encoders with no finished cell to measure it from."""
    threads: int = 1
    """torch intra-op threads (one process runs the cells one after another)."""
    note: str = ""
    """A line shown at the top of the documents (e.g. 'partial, smoke grid')."""
    flags: Flags = FLAGS
    """The flags every study driver shares (without a prefix on the command line). With ``--docs``, committed
    cells are restored from ``<docs>/memory_probe.json`` (without it, from ``docs/results/memory_probe.json``)."""

    @property
    def out(self) -> Path:
        """Where the cell files are (``--out``)."""
        return Path(self.flags.out)

    @property
    def seeds(self) -> tuple[int, ...]:
        """Seeds of every cell (``--seeds``; :data:`FLAGS`' when not given)."""
        return self.flags.seeds if self.flags.seeds is not None else FLAGS.seeds or ()

    def __post_init__(self) -> None:
        if not self.ks or any(not isinstance(k, int) or k < 1 for k in self.ks):
            raise UserError(f"k must be integers >= 1, got {list(self.ks)}", source="--ks")
        if sorted(set(self.ks)) != list(self.ks):
            raise UserError(f"k must be distinct and increasing, got {list(self.ks)}", source="--ks")
        if not self.seeds or any(s < 0 for s in self.seeds):
            raise UserError(f"seeds must be >= 0 (at least one), got {list(self.seeds)}", source="--seeds")
        for bound in self.bounds:
            if bound not in ("default", "cover"):
                raise UserError(f"unknown bound {bound!r}; valid: default, cover", source="--bounds")
        if not self.assumed_updates_per_s > 0:
            raise UserError("must be > 0", source="--assumed-updates-per-s")
        if self.flags.workers != 1:
            raise UserError(
                f"the probe measures its cells one after another in one process, got {self.flags.workers}; "
                "to use more cores, run one invocation per core with disjoint --encoders and the same --out",
                source="--workers",
            )
        if self.flags.timeout_s is not None:
            raise UserError(
                f"the probe has no per-run timeout (its cells run in this process), got {self.flags.timeout_s:g}; "
                "bound the invocation with --stop-starting-after-h instead",
                source="--timeout-s",
            )


@dataclass(frozen=True)
class Row:
    """An encoder at one context bound."""

    encoder: Encoder
    bound: Bound
    knob: Knob | None

    def value(self, k: int) -> int | None:
        if self.knob is None:
            return None
        return self.knob.covering(k) if self.bound == "cover" else self.knob.default

    def spec(self, k: int) -> str:
        value = self.value(k)
        if self.knob is None or value is None or value == self.knob.default:
            return self.encoder.spec
        return self.knob.apply(self.encoder.spec, value)

    @property
    def name(self) -> str:
        return f"{self.encoder.name} [{self.bound}]"


@dataclass(frozen=True)
class Cell:
    encoder: str
    spec: str
    knob: str | None
    value: int | None
    k: int
    seed: int

    def path(self, out: Path) -> Path:
        where = f"{self.knob}={self.value}" if self.knob is not None else "fixed"
        return Path(out) / label(self.encoder) / where / f"k{self.k}-s{self.seed}.json"


def plan_rows(encoders: list[Encoder], bounds: tuple[Bound, ...]) -> list[Row]:
    """Every row of the grid: the default bound first, then (reach knobs only) the covering bound."""
    rows: list[Row] = []
    for encoder in encoders:
        knob = context_knob(encoder.spec)
        reach = knob is not None and knob.kind == "reach"
        for bound in bounds:
            if bound == "default" or reach:
                rows.append(Row(encoder, bound, knob))
        if "default" not in bounds and not reach:
            rows.append(Row(encoder, "default", knob))  # nothing to raise: its only row
    return rows


def cells_of(row: Row, k: int, seeds: tuple[int, ...]) -> list[Cell]:
    knob = row.knob.name if row.knob is not None else None
    return [Cell(row.encoder.name, row.spec(k), knob, row.value(k), k, s) for s in seeds]


def load_cell(cell: Cell, out: Path, settings: ProbeSettings) -> dict[str, Any] | None:
    """The finished result of ``cell`` (None when not run); a result of other settings or another spec, or an
    unreadable file, is a :class:`UserError` naming the file."""
    path = cell.path(out)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(
            f"unreadable probe result ({exc}); delete it to re-run the cell", source=str(path)
        ) from None
    if not isinstance(data, dict) or not set(data) >= REQUIRED or not isinstance(data["settings"], dict):
        raise UserError("not a probe result (missing fields); delete it to re-run the cell", source=str(path))
    wanted = dataclasses.asdict(settings)
    if data["settings"] != wanted or data["spec"] != cell.spec:
        diff = sorted(k for k in wanted if data["settings"].get(k) != wanted[k])
        what = f"settings {diff}" if diff else f"spec {data['spec']!r} (now {cell.spec!r})"
        raise UserError(
            f"measured with other {what}; use another --out, or delete the file to re-run", source=str(path)
        )
    return data


CURVE_STRIDE = 10
"""The documents keep every 10th point of each cell's accuracy curve."""
SAME = ("accuracy", "updates_to_success", "parameters", "replay_exact")
"""Fields of two cells that must be equal for one row to repeat another, with their curves' kept points."""


def repeat_of(cfg: ProbeConfig, row: Row, rows: list[Row], k: int) -> Row | None:
    """The earlier row of ``rows`` (any of them when ``row`` is not one; the same bound, another encoder) that
    ``row`` repeats at ``k``: the first seed's cells of both finished with equal training curves (the accuracy
    of every 10th update to 4 decimals: what the committed documents keep, so a fresh checkout decides the
    same), final accuracy, updates to success, parameter count and replay flag. That is the same
    model under two names at this k (such rows are marked instead of re-run; the screening found
    ``local`` equal to ``full`` and ``early_exit`` to GTrXL). Checked per k, since the knob and the episodes
    change with k: ``bigbird`` equals ``full`` over the short episodes of k = 1 and 4, not at k = 16."""
    first = cfg.seeds[0]

    def cell(r: Row) -> dict[str, Any] | None:
        return load_cell(cells_of(r, k, (first,))[0], cfg.out, cfg.settings)

    mine = cell(row)
    if mine is None:
        return None
    for other in rows[: rows.index(row)] if row in rows else rows:
        if other.bound != row.bound or other.encoder.name == row.encoder.name:
            continue
        theirs = cell(other)
        if theirs is not None and _kept(mine) == _kept(theirs):
            return other
    return None


def _kept(result: dict[str, Any]) -> tuple[Any, ...]:
    """What a committed record keeps of a cell and :func:`repeat_of` compares: the :data:`SAME` fields and every
    :data:`CURVE_STRIDE`-th point of the curve (so a fresh checkout's restored cells give the same answer)."""
    curve = result.get("curve")
    return (*(result.get(f) for f in SAME), curve[::CURVE_STRIDE] if isinstance(curve, list) else None)


def finished_results(cfg: ProbeConfig, row: Row, k: int) -> list[dict[str, Any]]:
    """The finished cells of ``row`` at ``k``, in seed order."""
    found = (load_cell(c, cfg.out, cfg.settings) for c in cells_of(row, k, cfg.seeds))
    return [r for r in found if r is not None]


def succeeded(results: list[dict[str, Any]]) -> bool:
    """Whether any seed of a (row, k) reached the success accuracy."""
    return any(r.get("updates_to_success") is not None for r in results)


Measure = Callable[[str, int, int, ProbeSettings], CellResult]


def run_grid(
    cfg: ProbeConfig,
    rows: list[Row],
    measure_cell: Measure = measure,
    log: Callable[[str], None] = print,
    peers: list[Row] | None = None,
    start_by: float | None = None,
) -> dict[str, int | None]:
    """Run every pending cell of ``rows`` (see the module docstring); returns, per row name, the k at which
    it stopped (None: it ran every k). Where a row's first seed at k equals an earlier row's
    (:func:`repeat_of`; ``peers``: the rows compared with, default ``rows``: the script passes every encoder's,
    so a run of some encoders finds the rows they repeat among the others), its other seeds at k are not run:
    that row's cells stand for them. No cell starts after ``start_by`` (a ``time.time()``, from
    ``--stop-starting-after-h``): the grid stops there, and the next invocation resumes it."""
    peers = rows if peers is None else peers
    stopped: dict[str, int | None] = {}
    total = len({c.path(cfg.out) for row in rows for k in cfg.ks for c in cells_of(row, k, cfg.seeds)})
    seen: set[Path] = set()
    for row in rows:
        stopped[row.name] = None
        for k in cfg.ks:
            results = []
            for cell in cells_of(row, k, cfg.seeds):
                seen.add(cell.path(cfg.out))
                result = load_cell(cell, cfg.out, cfg.settings)
                if result is None and launch.past(start_by):
                    log("--stop-starting-after-h reached: no more cells start; rerun the command to resume")
                    return stopped
                if result is None:
                    where = f"{cell.knob}={cell.value}" if cell.knob else "no knob"
                    log(f"[cell {len(seen)} of at most {total}] {row.name} k={k} seed={cell.seed} {where}")
                    measured = measure_cell(cell.spec, k, cell.seed, cfg.settings)
                    result = {
                        "encoder": cell.encoder,
                        "knob": cell.knob,
                        "value": cell.value,
                        **measured.to_dict(),
                    }
                    atomic_write_json(cell.path(cfg.out), result)
                    log(
                        f"    accuracy {result['accuracy']:.3f}, updates to {cfg.settings.success:.0%}: "
                        f"{result['updates_to_success']}, {result['updates_per_s']:.2f} updates/s"
                    )
                results.append(result)
                same = repeat_of(cfg, row, peers, k) if cell.seed == cfg.seeds[0] else None
                if same is not None:
                    log(
                        f"{row.name} k={k}: seed {cell.seed} equals {same.name}'s cell (the same model); its other seeds are {same.name}'s"
                    )
                    results = finished_results(cfg, same, k)
                    break
            if not succeeded(results):
                stopped[row.name] = k
                log(f"{row.name}: no seed reached {cfg.settings.success:.0%} at k={k}; the row stops here")
                break
    return stopped


def estimate(
    cfg: ProbeConfig,
    rows: list[Row],
    peers: list[Row] | None = None,
    restored: dict[Path, dict[str, Any]] | None = None,
) -> str:
    """The dry run: cells (at most: rows stop at their first failing k), finished, and the time left from
    measured rates (updates / s of finished cells of the same encoder and knob value, else of the same
    encoder, else the median of every finished cell of ``rows`` and ``peers``, else ``assumed_updates_per_s``).
    ``restored``: results a run would restore first (by cell path), counted as finished."""

    def cells(of: list[Row]) -> dict[Path, Cell]:
        found: dict[Path, Cell] = {}
        for row in of:
            for k in cfg.ks:
                for cell in cells_of(row, k, cfg.seeds):
                    found.setdefault(cell.path(cfg.out), cell)
        return found

    unique = cells(rows)
    everything = {**cells(peers or []), **unique}
    restored = restored or {}
    finished = {p: restored.get(p) or load_cell(c, cfg.out, cfg.settings) for p, c in everything.items()}
    rates: dict[tuple[str, int | None], list[float]] = {}
    for path, result in finished.items():
        if result is not None:
            cell = everything[path]
            rates.setdefault((cell.encoder, cell.value), []).append(result["updates_per_s"])
    overall = [r for rs in rates.values() for r in rs]
    seconds, fallback = 0.0, 0
    for path, cell in unique.items():
        if finished[path] is not None:
            continue
        same = rates.get((cell.encoder, cell.value)) or [
            r for (name, _), rs in rates.items() if name == cell.encoder for r in rs
        ]
        if same:
            rate = sum(same) / len(same)
        else:
            rate, fallback = (
                statistics.median(overall) if overall else cfg.assumed_updates_per_s,
                fallback + 1,
            )
        seconds += (cfg.settings.updates + 1) / rate
    n_done = sum(finished[p] is not None for p in unique)
    pending = len(unique) - n_done
    other = (
        f"the median of the {len(overall)} finished cells, {statistics.median(overall):.2f} updates/s"
        if overall
        else f"the assumed {cfg.assumed_updates_per_s:g} updates/s"
    )
    lines = [
        f"{len(rows)} rows, {len(unique)} cells at most ({n_done} finished, {pending} to run; rows stop at "
        f"their first k where no seed reaches {cfg.settings.success:.0%})",
        f"estimated time for the cells to run: {seconds / 3600:.1f} h ({seconds:.0f} s) on one process "
        f"({pending - fallback} from their encoder's measured rates, {fallback} at {other})",
    ]
    return "\n".join(lines)


__all__ = [
    "CURVE_STRIDE",
    "KS",
    "Cell",
    "ProbeConfig",
    "Row",
    "cells_of",
    "estimate",
    "finished_results",
    "load_cell",
    "plan_rows",
    "repeat_of",
    "run_grid",
]
