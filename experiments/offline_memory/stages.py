"""Running the offline memory table (:mod:`rl_transformers.study.offline_memory`) and writing its documents
(:mod:`experiments.offline_memory.report`): ``python -m experiments.offline_memory.run`` and the encoder study's
offline part call :func:`run_offline_memory`.
"""

from __future__ import annotations

import shlex
from dataclasses import replace
from pathlib import Path
from typing import Any

from experiments.offline_memory import plan as omp
from experiments.offline_memory.report import write_report
from rl_transformers.study import launch, records
from rl_transformers.study import offline_memory as om
from rl_transformers.study.progress import Progress
from rl_transformers.utils.errors import UserError


def run_offline_memory(
    cfg: omp.OfflineMemoryConfig, log=print, start_by: float | None = None
) -> dict[str, Any]:
    """Run, dry-run or rebuild the table; ``start_by`` (a ``time.time()``; default from
    ``--stop-starting-after-h``): no run starts after it."""
    if start_by is None:
        start_by = launch.start_limit(cfg.stop_starting_after_h)
    table = om.rows()
    jobs = omp.plan(cfg, table)
    every = omp.plan(replace(cfg, lengths=om.LENGTHS, encoders=(), seeds=om.SEEDS), table)
    docs = Path(cfg.docs)
    committed = docs / "offline_memory.json"
    restored: set[Path] = set()
    if cfg.restore and committed.exists():
        restored = {j.dir for j in records.restore(every, committed, dry_run=cfg.dry_run)}
        if restored:
            log(
                f"{'would restore' if cfg.dry_run else 'restored'} {len(restored)} finished runs from {committed}"
            )
    todo = [j for j in jobs if j.dir not in restored and launch.status(j) != "done"]
    log(f"offline memory table: {len(jobs)} runs, {len(jobs) - len(todo)} finished, {len(todo)} to run")
    if cfg.dry_run:
        each = omp.estimates(todo, Path(cfg.out))
        total = sum(each) / 3600
        log(
            f"estimated {total:.1f} core-hours: {total / max(1, cfg.workers):.1f} h on {cfg.workers} worker(s)"
        )
        for length in sorted(cfg.lengths):
            part = sum(s for j, s in zip(todo, each, strict=True) if j.spec["task"] == f"TMaze{length}")
            log(f"  TMaze{length}: {part / 3600:.2f} core-hours")
        return {"jobs": len(jobs), "todo": len(todo), "seconds": sum(each)}
    if todo and not cfg.report_only:
        bar = Progress(dict(zip((j.name for j in todo), omp.estimates(todo, Path(cfg.out)), strict=True)),
                       cfg.workers, log)  # fmt: skip
        try:
            launch.run_local(todo, cfg.workers, cfg.timeout_s, log, bar, start_by)
        finally:
            bar.close()
    found = records.results(every, log)
    before = records.read_committed(committed) if committed.exists() and cfg.restore else []
    lost = {r["key"] for r in before} - {r["key"] for r in found}
    if lost:
        raise UserError(
            f"the rebuilt table would lose {len(lost)} committed records; nothing written (restore them: "
            "leave out --no-restore)",
            source=str(committed),
        )
    write_report(found, table, docs, command_line(cfg))
    log(f"wrote {docs}/offline_memory.md, offline_memory.json ({len(found)} runs), plots/offline_memory*.png")
    return {"jobs": len(jobs), "records": len(found)}


def command_line(cfg: omp.OfflineMemoryConfig) -> str:
    """The command that rebuilds the documents: --docs when not the default, then --report-only (the run
    directory does not matter: the committed records are restored into it first)."""
    docs = [] if cfg.docs == omp.OfflineMemoryConfig().docs else [f"--docs {shlex.quote(str(cfg.docs))}"]
    return " ".join(["python -m experiments.offline_memory.run", *docs, "--report-only"])
