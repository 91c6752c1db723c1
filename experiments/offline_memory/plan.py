"""The offline memory table's plan: its configuration, its jobs and their estimated cost (the table itself:
:mod:`rl_transformers.study.offline_memory`, which the long-context DT benchmark measures too)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from rl_transformers.study import offline_memory as om
from rl_transformers.study import records
from rl_transformers.study.encoders import Encoder, select
from rl_transformers.study.flags import Flags, StudyFlags
from rl_transformers.study.records import Job
from rl_transformers.utils.errors import UserError

FLAGS = StudyFlags(out=Path("runs/offline_memory"), timeout_s=7200.0)
"""The table's default flags (one run at once, documents in docs/results)."""


@dataclass(frozen=True)
class OfflineMemoryConfig:
    """The offline memory table: T-Maze corridors x attentions and memories x seeds."""

    lengths: tuple[int, ...] = om.LENGTHS
    """Corridor lengths to run (the documents always cover every length of the table)."""
    encoders: tuple[str, ...] = ()
    """Only these rows by name (default: every row)."""
    flags: Flags = FLAGS
    """Runs in <out>/offline_memory/dt/TMaze<L>/<row>/s<seed>/; offline_memory.{md,json} and
    plots/offline_memory*.png in --docs; seeds default: the table's."""

    @property
    def seeds(self) -> tuple[int, ...]:
        """The seeds of this invocation's jobs."""
        return self.flags.seeds if self.flags.seeds is not None else om.SEEDS


def plan(cfg: OfflineMemoryConfig, table: list[om.Row] | None = None) -> list[Job]:
    """The jobs of ``cfg`` in length-major, then seed-major order (short corridors finish first)."""
    for length in cfg.lengths:
        if length not in om.LENGTHS:
            raise UserError(
                f"corridor length {length} is not in the table {list(om.LENGTHS)}", source="--lengths"
            )
    table = table if table is not None else om.rows()
    chosen = {e.name for e in select([Encoder(r.name, r.spec, r.family) for r in table], cfg.encoders)}
    return [
        om.make_job(length, row, seed, Path(cfg.flags.out))
        for length in sorted(cfg.lengths)
        for seed in cfg.seeds
        for row in table
        if row.name in chosen
    ]


BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "dt_long_context" / "results.json"
"""The committed side-by-side measurement of every (row, L) update (scripts/bench_dt_long_context.py)."""


def bench_rates(path: Path = BENCH) -> dict[tuple[str, int], float]:
    """{(row, L): updates/s of the update alone (CPU time)} from the committed benchmark; empty without it."""
    data = records.read_json(path)
    rows = data.get("results") if isinstance(data, dict) else None
    out: dict[tuple[str, int], float] = {}
    for r in rows if isinstance(rows, list) else []:
        x = r.get("cpu_updates_per_s") if isinstance(r, dict) else None
        if (
            isinstance(x, int | float)
            and x > 0
            and isinstance(r.get("row"), str)
            and isinstance(r.get("length"), int)
        ):
            out[(r["row"], r["length"])] = float(x)
    return out


def estimates(jobs: list[Job], out: Path, bench: dict[tuple[str, int], float] | None = None) -> list[float]:
    """Seconds per job, plus 10 s of start-up: its budget over the updates/s (evaluations included) of finished
    runs of the same (length, row); else the benchmark's rate of the update alone (:func:`bench_rates`) times
    the median ratio of finished runs' rates to their benchmark rates (evaluations, start-up, load), over the
    same length's runs, else over all (0.5 while none finished); else the median of finished runs of the same length; else
    :data:`rl_transformers.study.offline_memory.ASSUMED_UPDATES_PER_S`."""
    bench = bench_rates() if bench is None else bench
    found = [records.read_json(p) for p in Path(out).rglob("result.json")]
    rates: dict[tuple[str, str], list[float]] = {}
    for r in found:
        if isinstance(r, dict) and isinstance(x := r.get("updates_per_s"), int | float) and x > 0:
            rates.setdefault((str(r.get("task")), str(r.get("encoder_name"))), []).append(float(x))
    ratios: dict[int, list[float]] = {}
    for (t, name), xs in rates.items():
        length = int(t.removeprefix("TMaze")) if t.removeprefix("TMaze").isdigit() else -1
        if (name, length) in bench:
            ratios.setdefault(length, []).extend(x / bench[(name, length)] for x in xs)
    pooled = [x for xs in ratios.values() for x in xs]
    seconds = []
    for job in jobs:
        t, name = job.spec["task"], job.spec["encoder_name"]
        length = int(t.removeprefix("TMaze"))
        if rates.get((t, name)):
            rate = statistics.median(rates[(t, name)])
        elif (name, length) in bench:
            factor = statistics.median(ratios.get(length) or pooled) if pooled else 0.5
            rate = bench[(name, length)] * factor
        else:
            same = [x for (tt, _), xs in rates.items() if tt == t for x in xs]
            rate = statistics.median(same) if same else om.ASSUMED_UPDATES_PER_S.get(length, 1.0)
        seconds.append(job.spec["budget"] / rate + 10.0)
    return seconds
