"""The study driver: plan the jobs of a preset, run the unfinished ones, rebuild the documents.

The general tool for comparing encoders (``scripts/encoder_study.py``, :func:`main`): encoders x tasks x seeds
x budget. An experiment built on it adds its own text to the page and its own part beside the jobs with a
:class:`Page` (e.g. ``experiments/encoder_screening/``).

``run_study(StudyConfig(...))`` expands the encoders (registry read now), makes one job per (task, encoder,
seed), moves aside the results of ``rerun_encoders`` (a dry run only counts them), and - unless ``dry_run`` /
``report_only`` - runs the pending and failed jobs (local pool or Ray), seed-major so partial results cover
every encoder evenly. Then it collects every finished run of the preset and writes the documents into ``docs``.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from rl_transformers.study import encoders as enc
from rl_transformers.study import launch, records, report, suite
from rl_transformers.study.aggregate import REPS
from rl_transformers.study.flags import Flags, StudyFlags, check_nothing_lost, restore_committed
from rl_transformers.study.flags import rebuild_command as flag_command
from rl_transformers.study.progress import Progress
from rl_transformers.study.records import Job
from rl_transformers.utils.errors import UserError

FLAGS = StudyFlags(docs=None, workers=2)
"""The study's default flags (two runs at once; documents in <out>/<preset>/docs)."""


@dataclass(frozen=True)
class StudyConfig:
    """A comparison of encoders: the suite's tasks x the registry's encoders x seeds, at a preset's budgets."""

    preset: Literal["quick", "full"] = "quick"
    """Budgets and seeds: quick (1 seed, 4 updates; a smoke run) or full (3 seeds, 64-96 updates)."""
    parts: tuple[Literal["online", "offline"], ...] = ("online", "offline")
    """Which suites to run: online (PPO) and/or offline (DT)."""
    tasks: tuple[str, ...] = ()
    """Only these tasks (default: the whole suite of the chosen parts)."""
    encoders: tuple[str, ...] = ()
    """Only these encoders by name (default: every row)."""
    rerun_encoders: tuple[str, ...] = ()
    """Move aside the finished results of these encoders (e.g. after an attention got faster) so they run again."""
    launcher: Literal["local", "ray"] = "local"
    """local process pool, or ray (tasks with 1 CPU each)."""
    ray_address: str | None = None
    """ray.init(address=...) of an existing cluster (default: start a local instance)."""
    flags: Flags = FLAGS
    """Runs in <out>/<preset>/<algo>/<task>/<encoder>/s<seed>/; documents (encoders_screening.{md,json},
    encoders_screening_aggregate.json, plots/) in --docs, default <out>/<preset>/docs; seeds default: the
    preset's."""


def plan(cfg: StudyConfig, planned: Mapping[str, tuple[str, ...]] | None = None) -> tuple[list[Job], dict]:
    """The jobs of ``cfg`` (seed-major order) and the report context; ``planned`` {algo: encoder names}: the
    encoders of the study (default: every row of the registry), which ``cfg.encoders`` narrows."""
    preset = suite.check_preset(cfg.preset)
    seeds = cfg.flags.seeds if cfg.flags.seeds is not None else suite.SEEDS[preset]
    ctx: dict = {
        "tasks": {},
        "task_notes": {},
        "encoders": {},
        "excluded": {},
        "expected": {},
        "preset": preset,
    }
    jobs: list[Job] = []
    parts: tuple[tuple[str, suite.Algo], ...] = (("online", "ppo"), ("offline", "dt"))
    for part, algo in parts:
        if part not in cfg.parts:
            continue
        tasks = suite.tasks(algo, cfg.tasks) if cfg.tasks else suite.tasks(algo)
        if not tasks:
            continue
        rows, excluded = enc.ppo_encoders() if algo == "ppo" else enc.dt_encoders()
        if planned is not None:  # the study's own set (an unknown name is refused: the registry lost it)
            names = planned.get(algo, ())
            rows = enc.select(rows, names, "the study's planned encoders") if names else []
        rows = enc.select(rows, cfg.encoders)
        ctx["tasks"][algo] = [t.name for t in tasks]
        ctx["encoders"][algo] = [(e.name, e.spec, e.family, e.note) for e in rows]
        ctx["excluded"][algo] = [(x.name, x.reason) for x in excluded]
        ctx["expected"][algo] = len(tasks) * len(rows) * len(seeds)
        unit = "env steps" if algo == "ppo" else "updates"
        for t in tasks:
            budget = f"{t.budget[preset]:,} {unit}, eval every {t.eval_every[preset]:,}, seeds {list(seeds)}"
            ctx["task_notes"][t.name] = (t.tag, budget, t.score_note)
        for seed in seeds:
            for t in tasks:
                for e in rows:
                    jobs.append(launch.make_job(t, e, seed, preset, Path(cfg.flags.out)))
    return jobs, ctx


def estimate(jobs: list[Job], out: Path) -> tuple[float, int]:
    """Estimated seconds of one worker for ``jobs`` and how many had no measured rate (see :func:`estimates`)."""
    seconds, unknown = estimates(jobs, out)
    return sum(seconds), unknown


def estimates(jobs: list[Job], out: Path) -> tuple[list[float], int]:
    """Estimated seconds of each of ``jobs`` from measured rates of finished runs, and how many had none.

    Rate per job (steps/s online, updates/s for DT), from the finished runs of any preset: the median of the same
    (task, encoder); else the encoder's median over its runs of the same algorithm times the task's speed factor
    (the median, over the task's finished runs, of their rate / their encoder's median: how much the task's
    environment slows every encoder; 1 while the task has none); else the median of every finished run of the
    algorithm. Plus 10 s of process start-up per job.
    """
    finished = [records.read_json(p) for p in Path(out).rglob("result.json")]
    runs = [(r["algo"], r["task"], r["encoder_name"], float(x)) for r in finished
            if isinstance(r, dict) and all(isinstance(r.get(k), str) for k in ("algo", "task", "encoder_name"))
            and isinstance(x := r.get("steps_per_s") or r.get("updates_per_s"), int | float) and x > 0]  # fmt: skip
    by_pair: dict[tuple[str, str], list[float]] = defaultdict(list)
    by_encoder: dict[tuple[str, str], list[float]] = defaultdict(list)
    by_algo: dict[str, list[float]] = defaultdict(list)
    for algo, task, name, x in runs:
        by_pair[(task, name)].append(x)
        by_encoder[(algo, name)].append(x)
        by_algo[algo].append(x)
    encoder_rate = {k: statistics.median(v) for k, v in by_encoder.items()}
    ratios: dict[str, list[float]] = defaultdict(list)
    for algo, task, name, x in runs:
        ratios[task].append(x / encoder_rate[(algo, name)])
    task_factor = {t: statistics.median(v) for t, v in ratios.items()}

    seconds, unknown = [], 0
    for job in jobs:
        algo, task, name = job.spec["algo"], job.spec["task"], job.spec["encoder_name"]
        if by_pair.get((task, name)):
            rate = statistics.median(by_pair[(task, name)])
        elif (algo, name) in encoder_rate:
            rate = encoder_rate[(algo, name)] * task_factor.get(task, 1.0)
        elif by_algo.get(algo):
            rate = statistics.median(by_algo[algo])
        else:
            unknown += 1
            rate = 1000.0 if algo == "ppo" else 20.0
        seconds.append(job.spec["budget"] / rate + 10.0)
    return seconds, unknown


@dataclass(frozen=True)
class Page:
    """What an experiment adds to the study: the command that rebuilds its page, the page's method, notes and
    caveat (:func:`rl_transformers.study.report.write_report`'s ``ctx``), and a part run beside the jobs
    (``beside(cfg, docs, log, start_by)``: run, dry-run or rebuild with this invocation's settings) whose
    section joins the offline part (``dt_section(docs)``: Markdown lines)."""

    command: str = "python scripts/encoder_study.py"
    method: Callable[[str], str] | None = None
    """The preset's method text."""
    notes: Callable[..., str] | None = None
    """``notes(records, aggregates, ctx)``: the notes in words."""
    caveat: Callable[..., str] | None = None
    """``caveat(records)``: a line under the status."""
    beside: Callable[..., None] | None = None
    dt_section: Callable[[Path], list[str]] | None = None
    encoders: Mapping[str, tuple[str, ...]] | None = None
    """{algo: encoder names} the experiment planned (its spec, frozen: an encoder registered after it ran does not
    turn its finished page into a partial one); default: every row of the registry."""


def main(config: StudyConfig) -> None:
    """``scripts/encoder_study.py``: compare the chosen encoders on the chosen tasks (no experiment's text)."""
    run_study(config)


def run_study(cfg: StudyConfig, log=print, page: Page | None = None) -> dict:
    """Plan, restore, run and report ``cfg``; ``page``: what an experiment adds (default: nothing)."""
    page = page if page is not None else Page()
    if cfg.rerun_encoders and cfg.flags.report_only and not cfg.flags.dry_run:
        raise UserError(
            f"--rerun-encoders {' '.join(cfg.rerun_encoders)} with --report-only would drop their results from "
            "the documents without running them again; leave out one of the two",
            source="--report-only",
        )
    start_by = launch.start_limit(cfg.flags.stop_starting_after_h)
    jobs, _ = plan(cfg, page.encoders)
    # The documents always describe the whole preset (both parts, every task and encoder), whatever subset
    # this invocation runs, so running one task never drops another task's results from the records.
    every_job, ctx = plan(replace(cfg, parts=("online", "offline"), tasks=(), encoders=()), page.encoders)
    out = Path(cfg.flags.out)
    docs = cfg.flags.docs if cfg.flags.docs is not None else out / cfg.preset / "docs"
    # A dry run changes nothing on disk: it counts the results it would restore as finished and those it would
    # move aside as to run.
    committed = docs / report.RECORDS
    restored = restore_committed(every_job, committed, cfg.flags, log)
    rerun: set[Path] = set()
    if cfg.rerun_encoders:
        enc.select([enc.Encoder(n, "", "") for n in {j.spec["encoder_name"] for j in jobs}], cfg.rerun_encoders,
                   "--rerun-encoders")  # fmt: skip
        rerun = {j.dir for j in launch.invalidate(jobs, cfg.rerun_encoders, dry_run=cfg.flags.dry_run)}
        if cfg.flags.dry_run:
            rerun |= {
                j.dir for j in jobs if j.dir in restored and j.spec["encoder_name"] in cfg.rerun_encoders
            }
        verb = "would move" if cfg.flags.dry_run else "moved"
        log(f"{verb} aside {len(rerun)} results of {list(cfg.rerun_encoders)}")
    states = {
        j.dir: "pending" if j.dir in rerun else "done" if j.dir in restored else launch.status(j)
        for j in jobs
    }
    todo = [j for j in jobs if states[j.dir] != "done"]
    n_failed = sum(1 for j in todo if states[j.dir] == "failed")
    n_short = sum(1 for j in todo if states[j.dir] == "incomplete")
    log(f"study {cfg.preset}: {len(jobs)} runs, {len(jobs) - len(todo)} finished, {len(todo)} to run "
        f"({n_failed} failed before, {n_short} stopped before their budget)")  # fmt: skip
    if cfg.flags.dry_run:
        if page.beside is not None:
            page.beside(cfg, docs, log, start_by)
        seconds, unknown = estimate(todo, out)
        workers = f"{cfg.flags.workers} worker" + ("s" if cfg.flags.workers != 1 else "")
        unmeasured = f" ({unknown} runs without a measured rate: assumed 1,000 steps/s, 20 updates/s)"
        log(f"estimated {seconds / 3600:.2f} h on 1 worker, {seconds / 3600 / max(1, cfg.flags.workers):.2f} h on "
            f"{workers}" + (unmeasured if unknown else ""))  # fmt: skip
        return {"jobs": len(jobs), "todo": len(todo), "seconds": seconds}
    if todo and not cfg.flags.report_only:
        each, _ = estimates(todo, out)
        bar = Progress({j.name: s for j, s in zip(todo, each, strict=True)}, cfg.flags.workers, log)
        try:
            if cfg.launcher == "ray":
                launch.run_ray(
                    todo, cfg.ray_address, cfg.flags.workers, cfg.flags.timeout_s, log, bar, start_by
                )
            else:
                launch.run_local(todo, cfg.flags.workers, cfg.flags.timeout_s, log, bar, start_by)
        finally:
            bar.close()
    if page.beside is not None:
        page.beside(cfg, docs, log, start_by)
    ctx.update(page_context(page, cfg, docs))
    ctx["planned"] = dict(Counter(j.spec["task"] for j in every_job))
    found = records.results(every_job, log)
    moved = set() if cfg.flags.report_only else {j.spec["key"] for j in jobs if j.dir in rerun}
    check_nothing_lost(found, committed, moved, cfg.flags.report_only or cfg.flags.restore)
    log(f"building the documents from {len(found)} runs: rliable's bootstrap ({REPS:,} resamples per CI) "
        "takes minutes (about 6 on one core for the full preset)")  # fmt: skip
    aggs = report.write_report(found, docs, ctx)
    log(f"wrote {docs}/{report.PAGE}, {report.RECORDS} ({len(found)} runs), {report.AGGREGATE}, plots/")
    return {"jobs": len(jobs), "records": len(found), "aggregates": aggs}


def page_context(page: Page, cfg: StudyConfig, docs: Path) -> dict:
    """The report's context entries that ``page`` gives (the rebuild command always)."""
    ctx: dict = {} if page.dt_section is None else {"offline_memory": page.dt_section(docs)}
    ctx["command"] = rebuild_command(cfg, docs, page.command)
    if page.method is not None:
        ctx["method"] = page.method(cfg.preset)
    ctx.update({k: v for k, v in (("notes", page.notes), ("caveat", page.caveat)) if v is not None})
    return ctx


def rebuild_command(cfg: StudyConfig, docs: Path, command: str = "python scripts/encoder_study.py") -> str:
    """The command that rebuilds ``cfg``'s documents into ``docs``: the preset, the seeds when given, the run
    directory and the documents' directory always."""
    flags = replace(cfg.flags, docs=docs)
    return flag_command(command, flags, FLAGS, ["--preset", cfg.preset], always=("out", "docs"))
