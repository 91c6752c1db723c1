"""Updates/s and memory of the Decision Transformer at long context: every row of the offline memory table.

The offline memory table's speed column ("updates/s and peak memory per (attention, K), measured side by side"). For each corridor
length L and each row of :func:`rl_transformers.study.offline_memory.rows` (an attention with K = L + 1, a
memory with K_s = ⌈(L + 1) / 3⌉ and 3 segments, the floor), the real trainer of the table's job is built —
``DTTrainer`` on the T-Maze dataset with the row's backbone and ``dt_args`` (batch 32, aligned windows),
evaluation off — and its ``update()`` (sample, forward, backward, clip, AdamW, scheduler) is measured:

- **saved bytes**: one update under ``torch.autograd.graph.saved_tensors_hooks``; ``saved_bytes`` sums the bytes
  of every tensor autograd saves for the backward (an upper bound of the activation memory: a tensor saved by
  two operations counts twice), ``peak_saved_bytes`` is the most of them alive at once (a segmented update
  backpropagates each segment before the next, so only one segment's activations live at a time). Both are
  deterministic: independent of the machine's load.
- **peak RSS**: the extra resident memory of one update (after one warm-up update, which allocates AdamW's
  state) in a fresh process, by :func:`rl_transformers.bench.memory.measure_rss` (glibc returns freed blocks,
  peak mark reset before the update).
- **updates/s**: after the saved-bytes update and ``warmup`` more, the rows of one L are timed in interleaved
  rounds, the order rotated each round (:func:`benchmarks.studies.dt_timing.time_rounds`), by CPU time and
  wall clock, one torch thread; ``full`` is always timed as the reference, and each row's ratio to ``full`` is
  the median over rounds of its per-round speed over ``full``'s in the same round (>1: faster than ``full``).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.studies.dt_timing import time_rounds
from benchmarks.studies.meta import load_text
from rl_transformers.bench.memory import malloc_returns_memory, measure_rss, run_in_child
from rl_transformers.runs.provenance import finish_machine_info, machine_info
from rl_transformers.study import offline_memory as om
from rl_transformers.utils.atomic import atomic_write_text
from rl_transformers.utils.errors import UserError, choice_hint
from rl_transformers.utils.tables import markdown_table

REFERENCE = "full"
MIB = 2**20


@dataclass(frozen=True)
class DTLongConfig:
    """Updates/s and memory of every (row, K) of the offline memory table."""

    lengths: tuple[int, ...] = om.LENGTHS
    """Corridor lengths L (datasets rlt/tmaze-<L>/<dataset-name> under --dataset-root)."""
    rows: tuple[str, ...] = ()
    """Rows of the table to measure (default: all); ``full`` is always added as the reference of the ratios."""
    rounds: int = 5
    """Interleaved timing rounds per length (medians are reported)."""
    updates: int | None = None
    """Timed updates per row and round (default: enough for about --round-s seconds, from the warm-up)."""
    round_s: float = 2.0
    """Target seconds per row and round when --updates is not given."""
    warmup: int = 1
    """Untimed updates per row after the saved-bytes update (which is the first)."""
    rss: bool = True
    """Also measure the peak RSS increase of one update in a fresh process per (row, L)."""
    rss_timeout_s: float = 900.0
    """Give up a fresh-process measurement after this many seconds."""
    dataset_root: Path = Path(om.DATASETS)
    """Root of the Minari datasets (built by scripts/make_memory_dataset.py)."""
    dataset_name: str = om.DATASET_NAME
    """Dataset name under rlt/tmaze-<L>/."""
    threads: int = 1
    """torch CPU threads (1: CPU time and wall clock agree on an idle machine)."""
    out: Path | None = Path("benchmarks/results/dt_long_context")
    """Directory for results.json and results.md (printed only when None)."""
    dry_run: bool = False
    """Print what would be measured and a rough duration, then exit."""


@dataclass(frozen=True)
class Cell:
    """One (row, L): the row of the table and the trainer configuration of its job."""

    row: om.Row
    length: int
    config: Any  # DTConfig (imported lazily: the trainer pulls in the whole library)

    @property
    def name(self) -> str:
        return self.row.name


def choose_rows(names: tuple[str, ...], table: list[om.Row]) -> list[om.Row]:
    """The rows named (all when empty), ``full`` first; an unknown name is a UserError with the closest match."""
    known = [r.name for r in table]
    if REFERENCE not in known:
        raise UserError(f"the table has no {REFERENCE!r} row, the reference of the ratios", source="--rows")
    for name in names:
        if name not in known:
            raise UserError(f"unknown row {name!r}; {choice_hint(name, sorted(known))}", source="--rows")
    chosen = {*(names or known), REFERENCE}
    return sorted((r for r in table if r.name in chosen), key=lambda r: r.name != REFERENCE)


def dataset_id(length: int, name: str) -> str:
    return f"rlt/tmaze-{length}/{name}"


def check_datasets(cfg: DTLongConfig) -> None:
    for length in cfg.lengths:
        if length < 1:
            raise UserError(f"corridor length {length} must be >= 1", source="--lengths")
        path = Path(cfg.dataset_root) / dataset_id(length, cfg.dataset_name)
        if not path.is_dir():
            raise UserError(
                f"no dataset {dataset_id(length, cfg.dataset_name)} under {cfg.dataset_root} (build it: "
                f"{om.DATASET_COMMAND})",
                source="--lengths",
            )


def trainer_config(row: om.Row, length: int, cfg: DTLongConfig, run_root: Path) -> Any:
    """The table job's ``DTConfig`` (as the study's worker builds it), without evaluation."""
    from rl_transformers.algos.dt_config import DTConfig
    from rl_transformers.study.encoders import dt_backbone

    return DTConfig(
        dataset=dataset_id(length, cfg.dataset_name),
        dataset_root=Path(cfg.dataset_root),
        backbone=dt_backbone(row.encoder(length).spec),
        **{**row.dt_args(length), "eval_episodes": 0},
        total_steps=1_000_000,
        seed=0,
        device="cpu",
        threads=cfg.threads,
        run_root=run_root,
        progress=False,
    )


def build_trainer(config: Any) -> Any:
    from rl_transformers.algos.dt import DTTrainer
    from rl_transformers.runs.distributed import DistContext

    return DTTrainer(config, DistContext(), torch.device("cpu"))


class _Saved:
    """A tensor autograd saved, counted while it lives (autograd drops it once its backward has run)."""

    __slots__ = ("meter", "nbytes", "tensor")

    def __init__(self, tensor: torch.Tensor, meter: dict[str, int]) -> None:
        self.tensor, self.nbytes, self.meter = tensor, tensor.numel() * tensor.element_size(), meter
        meter["total"] += self.nbytes
        meter["live"] += self.nbytes
        meter["peak"] = max(meter["peak"], meter["live"])

    def __del__(self) -> None:
        self.meter["live"] -= self.nbytes


def saved_bytes(update: Callable[[], object]) -> dict[str, int]:
    """``saved_bytes`` (sum over the update) and ``peak_saved_bytes`` (most alive at once) of one call."""
    meter = {"total": 0, "live": 0, "peak": 0}
    with torch.autograd.graph.saved_tensors_hooks(lambda t: _Saved(t, meter), lambda s: s.tensor):
        update()
    return {"saved_bytes": meter["total"], "peak_saved_bytes": meter["peak"]}


def _rss_child(config: Any, threads: int, conn: Any) -> None:
    """In a fresh process: build the trainer, one warm-up update (AdamW's state), then the measured update."""
    try:
        trim = malloc_returns_memory()
        torch.set_num_threads(threads)
        trainer = build_trainer(config)
        trainer.update()
        conn.send(measure_rss(trainer.update, trim))
    except MemoryError as err:
        conn.send({"error": "memory", "detail": str(err)[:300]})
    except Exception as err:
        conn.send(
            {"error": "error", "detail": f"{type(err).__name__}: {err}\n{traceback.format_exc()[-600:]}"}
        )
    finally:
        conn.close()


def auto_updates(cfg: DTLongConfig, per_update_s: float) -> int:
    if cfg.updates is not None:
        return cfg.updates
    return max(1, min(200, round(cfg.round_s / max(per_update_s, 1e-6))))


def measure_length(
    length: int, rows: list[om.Row], cfg: DTLongConfig, log: Callable[[str], None]
) -> list[dict]:
    """Every row of one corridor length, timed side by side; one record per row."""
    tag = f"TMaze{length}"
    records: dict[str, dict[str, Any]] = {}
    updates: dict[str, Callable[[], object]] = {}
    trainers = []
    warm_s: list[float] = []
    with tempfile.TemporaryDirectory(prefix="dt_long_") as tmp:
        cells = [Cell(r, length, trainer_config(r, length, cfg, Path(tmp))) for r in rows]
        try:
            for cell in cells:
                trainer = build_trainer(cell.config)
                trainers.append(trainer)
                c = cell.config
                rec: dict[str, Any] = {
                    "row": cell.name, "family": cell.row.family, "length": length, "K": c.context_len,
                    "segments": c.segments, "tokens": 3 * c.context_len * c.segments,
                    "batch_size": c.batch_size, "spec": cell.row.encoder(length).spec,
                    "n_parameters": sum(p.numel() for p in trainer.model.parameters()),
                }  # fmt: skip
                rec |= saved_bytes(trainer.update)
                start = time.perf_counter()
                for _ in range(cfg.warmup):
                    trainer.update()
                if cfg.warmup:
                    warm_s.append((time.perf_counter() - start) / cfg.warmup)
                records[cell.name], updates[cell.name] = rec, trainer.update
                log(
                    f"{tag} {cell.name}: K {c.context_len} x {c.segments} segment(s), saved "
                    f"{rec['saved_bytes'] / MIB:.1f} MiB (peak alive {rec['peak_saved_bytes'] / MIB:.1f} MiB)"
                )
            steps = auto_updates(cfg, statistics.fmean(warm_s) if warm_s else 1.0)
            log(f"{tag}: {cfg.rounds} rounds of {steps} update(s) per row, {len(updates)} rows")
            seconds = time_rounds(
                updates, torch.device("cpu"), steps, cfg.rounds, 0,
                on_round=lambda r: log(f"{tag}: round {r + 1}/{cfg.rounds} done"),
            )  # fmt: skip
        finally:
            for trainer in trainers:
                trainer.close()
        for name, rec in records.items():
            rec |= rates(seconds, name, steps)
            log(
                f"{tag} {name}: {rec['cpu_updates_per_s']} updates/s (CPU), x{rec['speed_vs_full_cpu']} of full"
            )
        if cfg.rss:
            for cell in cells:
                result = run_in_child(_rss_child, (cell.config, cfg.threads), cfg.rss_timeout_s)
                rec = records[cell.name]
                if "error" in result:
                    rec["rss_error"] = f"{result['error']}: {result.get('detail', '')}"[:300]
                    log(f"{tag} {cell.name}: peak RSS not measured ({rec['rss_error'][:80]})")
                else:
                    rec["rss_peak_bytes"], rec["rss_method"] = result["peak_bytes"], result["method"]
                    log(f"{tag} {cell.name}: peak RSS +{result['peak_bytes'] / MIB:.1f} MiB")
    return list(records.values())


def rates(seconds: dict[str, dict[str, list[float]]], name: str, steps: int) -> dict[str, Any]:
    """Updates/s (median round) by both clocks, the rounds, and the paired ratio to ``full``'s speed."""
    out: dict[str, Any] = {"updates_per_round": steps}
    for clock, values in seconds[name].items():
        out[f"{clock}_updates_per_s"] = round(statistics.median(steps / s for s in values), 3)
        out[f"{clock}_rounds_s"] = [round(s, 4) for s in values]
        paired = [ref / s for s, ref in zip(values, seconds[REFERENCE][clock], strict=True)]
        out[f"speed_vs_full_{clock}"] = round(statistics.median(paired), 3)
    return out


def plan_lines(cfg: DTLongConfig, rows: list[om.Row]) -> list[str]:
    """What a run measures, and a rough duration from the table's assumed rates (full attention, one core)."""
    lines, total = [], 0.0
    for length in cfg.lengths:
        rate = om.ASSUMED_UPDATES_PER_S.get(length, 1.0)
        per_row = 1 + cfg.warmup + (2 if cfg.rss else 0)
        timed = cfg.rounds * (cfg.updates / rate if cfg.updates else cfg.round_s)
        seconds = len(rows) * (per_row / rate + timed + (5.0 if cfg.rss else 0.0) + 2.0)
        total += seconds
        lines.append(f"TMaze{length} ({dataset_id(length, cfg.dataset_name)}): ~{seconds / 60:.0f} min")
        for r in rows:
            args = r.dt_args(length)
            lines.append(
                f"  {r.name:<18} K {args['context_len']:>4} x {args.get('segments', 1)} segment(s)  "
                f"{r.encoder(length).spec}"
            )
    lines.append(
        f"rough total: ~{total / 60:.0f} min (rates assumed for full attention; slower rows take longer)"
    )
    return lines


def run_bench(
    cfg: DTLongConfig, command: str, table: list[om.Row] | None = None, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Measure every (row, L) of ``cfg``; writes <out>/results.{json,md} when ``out`` is set."""
    if cfg.rounds < 1 or cfg.warmup < 0 or (cfg.updates is not None and cfg.updates < 1):
        raise UserError(f"--rounds {cfg.rounds} / --updates {cfg.updates} must be >= 1, --warmup >= 0")
    rows = choose_rows(cfg.rows, table if table is not None else om.rows())
    if cfg.dry_run:
        for line in plan_lines(cfg, rows):
            log(line)
        return {"dry_run": True, "rows": [r.name for r in rows]}
    check_datasets(cfg)
    torch.set_num_threads(cfg.threads)
    machine = machine_info("cpu")
    setup = {k: getattr(cfg, k) for k in ("rounds", "updates", "round_s", "warmup", "threads")}
    report: dict[str, Any] = {"command": command, "results": []}
    for length in cfg.lengths:  # written after each length: a long run that stops keeps what it measured
        report["results"] += measure_length(length, rows, cfg, log)
        report["machine"] = finish_machine_info(machine)
        report["setup"] = setup | {"lengths": list(cfg.lengths), "dataset": cfg.dataset_name}
        report["complete"] = length == cfg.lengths[-1]
        if cfg.out is not None:
            write_results(report, Path(cfg.out))
            log(
                f"wrote {cfg.out}/results.json and results.md (corridors done: {length} of {list(cfg.lengths)})"
            )
    return report


def write_results(report: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "results.json", json.dumps(report, indent=2, sort_keys=True, default=str) + "\n")
    atomic_write_text(out / "results.md", render_markdown(report))


def _mib(value: Any) -> str:
    return f"{value / MIB:.1f}" if isinstance(value, int | float) else "—"


def render_markdown(report: dict[str, Any]) -> str:
    meta, setup = report.get("machine", {}), report.get("setup", {})
    lines = [
        "# Decision Transformer at long context: updates/s and memory per (row, K)",
        "",
        f"Command: `{report.get('command', '')}`",
        "",
        f"- setup: {', '.join(f'{k} {v}' for k, v in setup.items())}",
        f"- machine: {meta.get('device_name')} · threads {meta.get('threads')} · torch {meta.get('torch_version')}"
        f" · git {meta.get('git_sha')} · {load_text(meta)}",
        "- speed vs full: median over rounds of the row's updates/s over full's in the same round (>1: faster);"
        " saved: bytes autograd saves for the backward in one update (sum, and the most alive at once); peak RSS:"
        " extra resident memory of one update in a fresh process.",
    ]
    if not report.get("complete", True):
        lines.append("- **incomplete**: the run stopped before its last corridor length")
    for length in dict.fromkeys(r["length"] for r in report["results"]):
        lines += [
            "",
            f"## Corridor {length}",
            "",
            *markdown_table(
                LENGTH_COLUMNS,
                [length_cells(r) for r in report["results"] if r["length"] == length],
                "l" + "r" * 11,
            ),
        ]
    return "\n".join(lines) + "\n"


LENGTH_COLUMNS = ["row", "K", "segments", "tokens", "parameters", "updates/s (CPU)", "updates/s (wall)",
                  "vs full (CPU)", "vs full (wall)", "saved MiB", "saved MiB (peak alive)", "peak RSS MiB"]  # fmt: skip
"""Columns of a corridor length's table."""


def length_cells(r: dict[str, Any]) -> list[Any]:
    """One (row, K)'s cells of its corridor length's table."""
    return [r["row"], r["K"], r["segments"], r["tokens"], f"{r['n_parameters']:,}", r["cpu_updates_per_s"],
            r["wall_updates_per_s"], r["speed_vs_full_cpu"], r["speed_vs_full_wall"], _mib(r["saved_bytes"]),
            _mib(r["peak_saved_bytes"]), _mib(r.get("rss_peak_bytes"))]  # fmt: skip
