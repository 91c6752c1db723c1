"""Running the offline memory table (:mod:`rl_transformers.study.offline_memory`) and writing its documents
(:mod:`experiments.offline_memory.report`): ``python -m experiments.offline_memory.run`` and the encoder study's
offline part call :func:`run_offline_memory`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from experiments.offline_memory import plan as omp
from experiments.offline_memory.report import write_report
from rl_transformers.study import launch, records
from rl_transformers.study import offline_memory as om
from rl_transformers.study.flags import changed, check_nothing_lost, rebuild_command, restore_committed
from rl_transformers.study.progress import Progress


def run_offline_memory(
    cfg: omp.OfflineMemoryConfig, log=print, start_by: float | None = None
) -> dict[str, Any]:
    """Run, dry-run or rebuild the table; ``start_by`` (a ``time.time()``; default from
    ``--stop-starting-after-h``): no run starts after it."""
    if start_by is None:
        start_by = launch.start_limit(cfg.flags.stop_starting_after_h)
    table = om.rows()
    jobs = omp.plan(cfg, table)
    every = omp.plan(changed(cfg, lengths=om.LENGTHS, encoders=(), seeds=om.SEEDS), table)
    docs = Path(cfg.flags.docs or omp.FLAGS.docs or ".")
    committed = docs / "offline_memory.json"
    restored = restore_committed(every, committed, cfg.flags, log)
    todo = [j for j in jobs if j.dir not in restored and launch.status(j) != "done"]
    log(f"offline memory table: {len(jobs)} runs, {len(jobs) - len(todo)} finished, {len(todo)} to run")
    if cfg.flags.dry_run:
        each = omp.estimates(todo, Path(cfg.flags.out))
        total = sum(each) / 3600
        log(
            f"estimated {total:.1f} core-hours: {total / max(1, cfg.flags.workers):.1f} h on {cfg.flags.workers} worker(s)"
        )
        for length in sorted(cfg.lengths):
            part = sum(s for j, s in zip(todo, each, strict=True) if j.spec["task"] == f"TMaze{length}")
            log(f"  TMaze{length}: {part / 3600:.2f} core-hours")
        return {"jobs": len(jobs), "todo": len(todo), "seconds": sum(each)}
    if todo and not cfg.flags.report_only:
        bar = Progress(dict(zip((j.name for j in todo), omp.estimates(todo, Path(cfg.flags.out)), strict=True)),
                       cfg.flags.workers, log)  # fmt: skip
        try:
            launch.run_local(todo, cfg.flags.workers, cfg.flags.timeout_s, log, bar, start_by)
        finally:
            bar.close()
    found = records.results(every, log)
    check_nothing_lost(found, committed, guard=cfg.flags.restore)
    write_report(found, table, docs, command_line(cfg))
    log(f"wrote {docs}/offline_memory.md, offline_memory.json ({len(found)} runs), plots/offline_memory*.png")
    return {"jobs": len(jobs), "records": len(found)}


def command_line(cfg: omp.OfflineMemoryConfig) -> str:
    """The command that rebuilds the documents: --seeds, --out and --docs when not the defaults, then
    --report-only."""
    return rebuild_command("python -m experiments.offline_memory.run", cfg.flags, omp.FLAGS)
