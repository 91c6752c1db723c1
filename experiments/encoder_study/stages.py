"""The encoder study's confirmation stage: one command that tunes, runs, resumes and reports it
(what runs: :mod:`~experiments.encoder_study.plan`).

- ``--stage tune``: one Optuna study per encoder (``scripts/tune.py``, TPE + median pruner, SQLite, tuning seeds
  disjoint from the test seeds; :func:`tune_command` gives each study's exact command, run as a subprocess with
  one torch thread, ``--workers`` at once). A killed study resumes from its SQLite file. Each finished study's
  ``best.json`` is copied into the committed tuning file ``<docs>/encoders_tuning.json`` (never dropping an
  entry), so a fresh checkout plans the same tuned jobs.
- ``--stage run``: the jobs of both variants (tuned ones for tuned encoders only), through the study's launcher
  (resume, locks, records); the committed ``<docs>/encoders.json`` is restored into empty run directories
  first, and the documents are never rebuilt with fewer records than were committed.
- ``--dry-run``: the run count and core-hours of both stages, per task, from measured rates (:func:`rates`);
  nothing on disk changes. ``--report-only``: only rebuild the documents.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import shlex
import signal
import sqlite3
import statistics
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from experiments.encoder_study import plan as cp
from experiments.encoder_study.headline import write_headline
from rl_transformers.study import files, launch, records
from rl_transformers.study.encoders import Encoder, select
from rl_transformers.study.flags import (
    Flags,
    StudyFlags,
    check_nothing_lost,
    rebuild_command,
    restore_committed,
)
from rl_transformers.study.progress import Progress
from rl_transformers.study.records import Job
from rl_transformers.utils.atomic import atomic_write_json
from rl_transformers.utils.errors import EXIT_INTERRUPTED, UserError

ASSUMED_STEPS_PER_S = 1000.0
"""--dry-run's rate for an encoder no run has measured (env steps/s, one core, evaluations included)."""
START_S = 10.0
"""Process start-up per run or trial."""
REPO_DOCS = Path("docs/results")
"""The documents the README's headline follows (``--readme``; both relative to the working directory, so a
checkout whose package is installed from another one still rewrites its own); other ``--docs`` leave it alone."""

FLAGS = StudyFlags(out=Path("runs/encoder_study"), timeout_s=14400.0)
"""The study's default flags (one run at once, documents in docs/results)."""


@dataclass(frozen=True)
class ConfirmConfig:
    """The confirmation stage of the encoder study."""

    stage: Literal["tune", "run"] = "run"
    """tune: the tuning studies (same trials and task for every encoder); run: the jobs of both variants."""
    encoders: tuple[str, ...] = ()
    """Only these encoders (default: every confirmation row)."""
    tasks: tuple[str, ...] = ()
    """Only these rungs (default: the whole ladder); the documents always cover everything."""
    flags: Flags = FLAGS
    """Runs in <out>/<variant>/ppo/<task>/<encoder>/s<seed>/, tuning in <out>/tune/<study>; encoders.{md,json} and
    encoders_tuning.json in --docs (encoders_screening.json there gives rates); --workers: runs or tuning studies
    at once, one torch thread each; --stop-starting-after-h: the run stage only; seeds default: the study's."""
    readme: Path | None = None
    """Also rewrite this README's encoder-study headline from the new page (the block between its marker
    comments: experiments/encoder_study/headline.py), when --docs is the repository's docs/results;
    experiments/encoder_study/run.py passes README.md."""

    @property
    def seeds(self) -> tuple[int, ...]:
        """The seeds of this invocation's jobs."""
        return self.flags.seeds if self.flags.seeds is not None else cp.SEEDS

    @property
    def docs(self) -> Path:
        """The documents' directory."""
        return Path(self.flags.docs or FLAGS.docs or ".")

    @property
    def tune_out(self) -> Path:
        return Path(self.flags.out) / "tune"

    @property
    def tuning_file(self) -> Path:
        return self.docs / files.TUNING


# -- tuning ---------------------------------------------------------------------------------------------------
def tune_command(encoder: Encoder, out: Path) -> list[str]:
    """The exact ``scripts/tune.py`` command of an encoder's tuning study (settings: :func:`~experiments.
    encoder_study.plan.tuning_settings`, and :data:`~experiments.encoder_study.plan.TUNING_SPACE`'s capacity
    range; every other flag at the tuner's default)."""
    s = cp.tuning_settings()
    args = ["python", "scripts/tune.py", "--encoder", encoder.spec, "--env-id", s["env_id"]]
    if s["env_kwargs"]:
        args += ["--env-kwargs", json.dumps(s["env_kwargs"])]
    args += ["--total-timesteps", str(s["budget"]), "--eval-every", str(s["eval_every"]),
             "--n-trials", str(s["trials"]), "--objective", s["objective"], "--study-name", cp.study_name(encoder),
             "--pruner-warmup-steps", str(s["pruner_warmup_steps"]),
             "--out", str(out), "--ppo.anneal-horizon", str(cp.ANNEAL_HORIZON), "--threads", "1", "--device",
             "cpu", "--space.param-tolerance", str(cp.TUNING_SPACE.param_tolerance)]  # fmt: skip
    return args


def finished_trials(tune_out: Path, study: str) -> int:
    """Finished (complete or pruned) trials of ``study`` in ``<tune_out>/<study>.db``, read only; 0 without it."""
    db = tune_out / f"{study}.db"
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True) as con:
            row = con.execute(
                "SELECT COUNT(*) FROM trials JOIN studies ON trials.study_id = studies.study_id "
                "WHERE studies.study_name = ? AND trials.state IN ('COMPLETE', 'PRUNED')",
                (study,),
            ).fetchone()
    except sqlite3.Error:
        return 0
    return int(row[0])


def run_tune_command(args: list[str], log_path: Path) -> int:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(launch.ROOT), env.get("PYTHONPATH", "")) if p)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a") as out:
        return subprocess.call([sys.executable, *args[1:]], cwd=launch.ROOT, env=env, stdout=out, stderr=out)


def tune_outcome(code: int) -> str:
    """How a tuning subprocess ended, by its exit code (Ctrl-C: ``scripts/tune.py`` exits 130, a signal's
    default action gives minus its number): an interrupted study resumes from its SQLite file."""
    if code == 0:
        return "tuned"
    if code in (EXIT_INTERRUPTED, -signal.SIGINT, -signal.SIGTERM):
        return "interrupted (its finished trials are kept; run the stage again to resume)"
    return f"FAILED ({code})"


def tune_stage(
    cfg: ConfirmConfig, encoders: list[Encoder], tuned: dict[str, Any], log=print, runner=None
) -> None:
    """Run the missing tuning studies (``runner(args, log_path) -> exit code``), then collect their results."""
    runner = runner or run_tune_command
    todo = [e for e in encoders if not isinstance(tuned[e.name], cp.Tuned)]
    log(f"tuning: {len(encoders) - len(todo)} of {len(encoders)} encoders tuned, {len(todo)} to tune")

    def one(e: Encoder) -> str:
        args = tune_command(e, cfg.tune_out)
        code = runner(args, cfg.tune_out / f"{cp.study_name(e)}.log")
        return f"  {tune_outcome(code)} {e.name}: {shlex.join(args)}"

    with cf.ThreadPoolExecutor(max_workers=max(1, cfg.flags.workers)) as pool:
        lines = list(pool.map(one, todo))
    for line in lines:
        log(line)
    collect_tuning(cfg, encoders, log)
    failed = [line.split(":")[0].split()[-1] for line in lines if line.lstrip().startswith("FAILED")]
    if failed:  # the stage did not do its work: say so by the exit status too, not only in the log
        raise UserError(
            f"{len(failed)} tuning studies failed ({', '.join(failed)}); their logs are in {cfg.tune_out} "
            "(<study>.log); the finished results were collected"
        )


def collect_tuning(cfg: ConfirmConfig, encoders: list[Encoder], log=print) -> None:
    """Copy each finished local tuning result into the committed tuning file (entries are added, never
    dropped; a committed entry is kept over a local one). When the tuning settings changed, the file's entries
    move to its ``previous`` list (kept, never read as results) and the new settings start empty."""
    path = cfg.tuning_file
    settings = json.loads(json.dumps(cp.tuning_settings()))  # as stored: tuples become lists
    saved = records.read_json(path) if path.exists() else {"settings": settings, "encoders": {}}
    if not isinstance(saved, dict) or not isinstance(saved.get("encoders"), dict):
        raise UserError("expected a JSON object with an 'encoders' object", source=str(path))
    if saved.get("settings") != settings:
        previous = [
            *saved.get("previous", []),
            {"settings": saved.get("settings"), "encoders": saved["encoders"]},
        ]
        saved = {"settings": settings, "encoders": {}, "previous": previous}
        atomic_write_json(path, saved, indent=1)
        log(
            f"{path}: the tuning settings changed; its {len(previous[-1]['encoders'])} results moved to 'previous'"
        )
    found = cp.tuning_results(encoders, None, cfg.tune_out)
    added = [n for n, t in found.items() if isinstance(t, cp.Tuned) and n not in saved["encoders"]]
    if added:
        entries = {**saved["encoders"], **{n: found[n].entry for n in added}}  # type: ignore[union-attr]
        atomic_write_json(path, {**saved, "encoders": dict(sorted(entries.items()))}, indent=1)
        log(f"wrote {len(added)} tuning results to {path}: {added}")


# -- cost -----------------------------------------------------------------------------------------------------
def rates(
    out: Path, screening_records: Path
) -> tuple[dict[tuple[str, str], float], dict[str, float], dict[str, float]]:
    """Measured env steps/s: {(task, encoder): median} of this stage's finished runs; {encoder: median} of the
    screening stage's committed records; {task: speed factor} (the median over the screening stage's runs of a
    task of rate / its encoder's median; a rung the screening stage lacks takes its family's first rung)."""
    mine: dict[tuple[str, str], list[float]] = defaultdict(list)
    for p in Path(out).rglob("result.json"):
        r = records.read_json(p)
        if isinstance(r, dict) and isinstance(x := r.get("steps_per_s"), int | float) and x > 0:
            mine[(str(r.get("task")), str(r.get("encoder_name")))].append(float(x))
    screened = records.read_committed(screening_records) if screening_records.exists() else []
    runs = [(r["task"], r["encoder_name"], float(r["steps_per_s"])) for r in screened
            if r.get("algo") == "ppo" and isinstance(r.get("steps_per_s"), int | float) and r["steps_per_s"] > 0]  # fmt: skip
    by_encoder: dict[str, list[float]] = defaultdict(list)
    for _, name, x in runs:
        by_encoder[name].append(x)
    enc = {k: statistics.median(v) for k, v in by_encoder.items()}
    ratios: dict[str, list[float]] = defaultdict(list)
    for task, name, x in runs:
        ratios[task].append(x / enc[name])
    factor = {t: statistics.median(v) for t, v in ratios.items()}
    for r in cp.RUNGS:
        if r.name not in factor:
            first = next(f.name for f in cp.RUNGS if f.family == r.family)
            factor[r.name] = factor.get(first, 1.0)
    return {k: statistics.median(v) for k, v in mine.items()}, enc, factor


def rate_of(task: str, name: str, measured: tuple[dict, dict, dict]) -> tuple[float, str]:
    """(steps/s, source) of one (task, encoder): a finished run of it, else of it on the nearest shorter rung of
    the task's ladder (a step costs about the same on every rung: the same observation, the same cache bound),
    else the screening stage's encoder rate x the task factor, else :data:`ASSUMED_STEPS_PER_S`."""
    mine, enc, factor = measured
    if (task, name) in mine:
        return mine[(task, name)], "measured"
    rung = next((r for r in cp.RUNGS if r.name == task), None)
    if rung is not None and rung.memory:
        for shorter in reversed([r for r in cp.memory_rungs(rung.family) if r.memory < rung.memory]):
            if (shorter.name, name) in mine:
                return mine[(shorter.name, name)], "measured on a shorter rung"
    if name in cp.CANDIDATE_RATE:  # a candidate default before it has run: its base row's rate x its factor
        base, times = cp.CANDIDATE_RATE[name]
        rate, source = rate_of(task, base, measured)
        return rate * times, source
    if name in enc:
        return enc[name] * factor.get(task, 1.0), "screening"
    return ASSUMED_STEPS_PER_S, "assumed"


def dry_run_report(
    cfg: ConfirmConfig,
    encoders: list[Encoder],
    tuned: dict,
    todo: list[Job],
    log,
    separated: frozenset[str] = frozenset(),
) -> float:
    """Print both stages' cost, and what the ladder's stop rule would save after each rung not yet known to
    separate (``separated``: rungs whose records already separate); returns the core-hours."""
    measured = rates(Path(cfg.flags.out), cfg.docs / files.SCREENING_RECORDS)
    sources: dict[str, int] = defaultdict(int)
    tuning = 0.0
    for e in encoders:
        if e.name in cp.CANDIDATE_NAMES or isinstance(tuned[e.name], cp.Tuned):
            continue
        trials = cp.TRIALS - min(cp.TRIALS, finished_trials(cfg.tune_out, cp.study_name(e)))
        rate, source = rate_of(cp.TUNING_TASK, e.name, measured)
        sources[source] += trials
        tuning += trials * (cp.tuning_settings()["budget"] / rate + START_S)
    per_task: dict[str, float] = defaultdict(float)
    left = [
        e.name
        for e in encoders
        if e.name not in cp.CANDIDATE_NAMES and not isinstance(tuned[e.name], cp.Tuned)
    ]
    pending_tuned = 0
    for job in todo:
        rate, source = rate_of(job.spec["task"], job.spec["encoder_name"], measured)
        # an encoder not tuned yet will have a tuned run of the same budget: counted now, at the same rate
        twice = job.spec["preset"] == cp.UNTUNED and job.spec["encoder_name"] in left
        pending_tuned += twice
        sources[source] += 1 + twice
        per_task[job.spec["task"]] += (1 + twice) * (job.spec["budget"] / rate + START_S)
    total = (tuning + sum(per_task.values())) / 3600
    log(f"tune stage: {len(left)} encoders x {cp.TRIALS} trials on {cp.TUNING_TASK} "
        f"({cp.tuning_settings()['budget']:,} env steps each, no pruning assumed): {tuning / 3600:.1f} core-hours")  # fmt: skip
    log(f"run stage: {len(todo) + pending_tuned} runs ({pending_tuned} of them the tuned runs of encoders not "
        f"tuned yet): {sum(per_task.values()) / 3600:.1f} core-hours")  # fmt: skip
    for task, seconds in per_task.items():
        log(f"  {task}: {seconds / 3600:.2f} core-hours")
    for family in cp.ladder_families():
        ladder = cp.memory_rungs(family)
        for i, r in enumerate(ladder[:-1]):
            saved = sum(per_task.get(x.name, 0.0) for x in ladder[i + 1 :]) / 3600
            if saved and r.name not in separated:
                log(f"  (if {r.name} does not separate, the stop rule skips the longer rungs: "
                    f"-{saved:.2f} core-hours)")  # fmt: skip
    log(f"in all {total:.1f} core-hours: {total / max(1, cfg.flags.workers):.1f} h on {cfg.flags.workers} worker(s); rates of "
        "the runs and trials: " + ", ".join(f"{s} {n}" for s, n in sorted(sources.items()))
        + f" (measured: finished runs here, of the same rung or the nearest shorter one; screening: {cfg.docs}/{files.SCREENING_RECORDS} per encoder x task factor; "
        f"assumed: {ASSUMED_STEPS_PER_S:g} steps/s)")  # fmt: skip
    return total


# -- the driver -----------------------------------------------------------------------------------------------
def run_confirm(
    cfg: ConfirmConfig, log=print, rows: list[Encoder] | None = None, candidates: list[Encoder] | None = None
) -> dict[str, Any]:
    """Both stages (``rows``: the encoder rows, default :func:`~experiments.encoder_study.plan.encoder_rows`; ``candidates``: the
    untuned-only candidate defaults, default :data:`~experiments.encoder_study.plan.CANDIDATES` with the default rows, none with
    given rows)."""
    from experiments.encoder_study.report import (
        protocol_runs_per_rung,
        separation,
        stopped_rungs,
        write_report,
    )

    _check_flags(cfg)
    start_by = launch.start_limit(cfg.flags.stop_starting_after_h)
    table = rows if rows is not None else cp.encoder_rows()
    settings = candidates if candidates is not None else ([] if rows is not None else list(cp.CANDIDATES))
    chosen = select([*table, *settings], cfg.encoders)
    tasks = cp.rungs(cfg.tasks)
    docs = cfg.docs
    if (
        not cfg.flags.dry_run
    ):  # local tuning results join the committed file first: its runs' records need them
        collect_tuning(cfg, table, log)
    tuned = cp.tuning_results(table, cfg.tuning_file, cfg.tune_out)
    if cfg.stage == "tune" and not (cfg.flags.dry_run or cfg.flags.report_only):
        tune_stage(cfg, [e for e in chosen if e.name not in cp.CANDIDATE_NAMES], tuned, log)
        tuned = cp.tuning_results(table, cfg.tuning_file, cfg.tune_out)
    untuned = [f"{n} ({why})" for n, why in tuned.items() if not isinstance(why, cp.Tuned)]  # rows only
    if untuned:
        log(f"no tuned runs for {len(untuned)} encoders: {', '.join(untuned)}")
    jobs = cp.plan(tasks, chosen, cfg.seeds, tuned, Path(cfg.flags.out))
    every = cp.plan(cp.RUNGS, [*table, *settings], cp.SEEDS, tuned, Path(cfg.flags.out))
    committed = docs / files.RECORDS
    restored = restore_committed(every, committed, cfg.flags, log)
    finished = records.results(every)
    per_rung = protocol_runs_per_rung(len(table), len(settings))
    stopped = stopped_rungs(finished, {r.name: per_rung for r in cp.RUNGS})
    if stopped:
        log(
            "stopped by the ladder's stop rule (not run): "
            + "; ".join(f"{t}: {w}" for t, w in stopped.items())
        )
        jobs = [j for j in jobs if j.spec["task"] not in stopped]
    todo = [j for j in jobs if j.dir not in restored and launch.status(j) != "done"]
    later = " (the run stage runs them; this tune stage runs none)" if cfg.stage == "tune" else ""
    log(f"confirmation: {len(jobs)} runs, {len(jobs) - len(todo)} finished, {len(todo)} to run{later}")
    if cfg.stage == "tune":
        todo = []
    if cfg.flags.dry_run:
        chosen_todo = [j for j in jobs if j.dir not in restored and launch.status(j) != "done"]
        with_records = {r["task"] for r in finished}
        separated = frozenset(
            t for t, why in separation(finished).items() if why is None and t in with_records
        )
        hours = dry_run_report(cfg, chosen, tuned, chosen_todo, log, separated)
        return {"jobs": len(jobs), "todo": len(chosen_todo), "core_hours": hours}
    if todo and not cfg.flags.report_only:
        measured = rates(Path(cfg.flags.out), docs / files.SCREENING_RECORDS)
        each = {
            j.name: j.spec["budget"] / rate_of(j.spec["task"], j.spec["encoder_name"], measured)[0] + START_S
            for j in todo
        }
        bar = Progress(each, cfg.flags.workers, log)
        try:
            launch.run_local(todo, cfg.flags.workers, cfg.flags.timeout_s, log, bar, start_by)
        finally:
            bar.close()
    found = records.results(every, log)
    check_nothing_lost(found, committed, guard=cfg.flags.restore)
    write_report(found, table, tuned, docs, command_line(cfg), settings)
    log(f"wrote {docs}/{files.PAGE}, {files.RECORDS} ({len(found)} runs)")
    _write_headline(cfg, log)
    return {"jobs": len(jobs), "records": len(found)}


def _check_flags(cfg: ConfirmConfig) -> None:
    """Refuse flags the confirmation stage cannot honour, before anything runs."""
    if cfg.flags.workers < 1:
        raise UserError(f"must be >= 1, got {cfg.flags.workers}", source="--workers")
    if cfg.stage == "tune" and cfg.flags.stop_starting_after_h is not None:
        raise UserError("limits the run stage only (tuning studies resume trial by trial: stop them with Ctrl-C)",
                        source="--stop-starting-after-h")  # fmt: skip
    extra = sorted(set(cfg.seeds) - set(cp.SEEDS))
    if extra:  # the documents cover the protocol's seeds only; others would run and never be reported
        raise UserError(
            f"seeds {extra} are not test seeds of the confirmation stage {list(cp.SEEDS)}", source="--seeds"
        )


def _write_headline(cfg: ConfirmConfig, log) -> None:
    """Rewrite the README's headline from the page just written, when that page is the repository's own."""
    if cfg.readme is None:
        return
    if cfg.docs.resolve() != REPO_DOCS.resolve():
        log(
            f"{cfg.readme} left alone: its headline follows the repository's docs/results, not --docs {cfg.docs}"
        )
    elif write_headline(Path(cfg.readme), cfg.docs / files.PAGE):
        log(f"rewrote the encoder-study headline of {cfg.readme}")


def command_line(cfg: ConfirmConfig) -> str:
    """The command that rebuilds the documents (--seeds, --out and --docs where they differ from the defaults,
    then --report-only)."""
    return rebuild_command("python -m experiments.encoder_study.run", cfg.flags, FLAGS)
