"""Planning and running the study's jobs: a local process pool (default) or Ray.

A job is one (algo, task, encoder, seed) of a preset; it owns ``<out>/<preset>/<algo>/<task>/<encoder>/s<seed>/``
holding ``job.json`` (everything the worker needs), ``stdout.log`` / ``stderr.log``, the trainer's run
directory ``run/`` and, at the end, ``result.json`` (done) or ``failed.json`` (failed). Resume: a job whose
``result.json`` is a finished record of it (same job key - a hash of the job -, the whole budget run, valid
fields: :mod:`~rl_transformers.study.records`) is skipped; failed, unfinished, stopped-early and changed jobs run
again. ``invalidate`` moves the results of named encoders aside
(``result.stale.json``) so they run again, e.g. after an attention was made faster. A running job holds
``running.lock`` (:mod:`rl_transformers.study.joblock`): a second invocation over the same directories skips it
instead of running it twice, and takes over a lock whose holder is dead.

Each job is a subprocess ``python -m rl_transformers.study.worker job.json`` with one torch thread
(``OMP_NUM_THREADS=1``). The local launcher runs ``workers`` of them at once from a thread pool; the Ray
launcher (``ray.init(address=...)``, or a local instance) runs the same function as a Ray task with
``num_cpus=1`` each. Both return the records, which the driver writes to ``result.json`` / ``failed.json``,
so the results are the same files whichever launcher ran them (and a cluster without a shared file system
still gathers them on the driver). Ctrl-C stops the local launcher: no queued job starts, the running workers
save and exit (:func:`stop_all`), and the next invocation runs them again. A start limit (``start_by``, the
CLIs' ``--stop-starting-after-h``, for a time-limited allocation) ends an invocation gently: no job starts after
it, the running ones finish and keep their results.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from rl_transformers.study import joblock
from rl_transformers.study.encoders import Encoder, label
from rl_transformers.study.progress import Progress
from rl_transformers.study.records import Job, complete, job_key, own_result
from rl_transformers.study.suite import DATASET_ROOT, DT_ARGS, Task
from rl_transformers.utils.atomic import atomic_write_json
from rl_transformers.utils.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
STOP_QUIET_S = 10.0
"""After Ctrl-C, how long the launcher waits for its workers to stop by themselves before it signals them: a
Ctrl-C in a terminal reaches every worker too (same process group), and a second SIGINT would abort its save."""
STOP_GRACE_S = 60.0
"""Then how long a signalled worker may take to save its checkpoint and exit before it is killed."""
STUDY_INTERRUPTED = "finished runs keep their records; the running ones were stopped and run again when the same command is rerun"
"""What the study scripts print after Ctrl-C (:func:`rl_transformers.utils.errors.run_cli`'s ``on_interrupt``)."""
NOT_STARTED = "not started"
"""The status of a job past the invocation's start limit (``start_by``): no record; the next invocation runs it."""
_LIVE: set[subprocess.Popen[bytes]] = set()
_LIVE_LOCK = threading.Lock()


def make_job(task: Task, encoder: Encoder, seed: int, preset: str, out: Path, **overrides: Any) -> Job:
    """The job of one (task, encoder, seed); ``overrides`` replace budget fields (tests use tiny ones)."""
    spec: dict[str, Any] = {
        "algo": task.algo,
        "task": task.name,
        "encoder": encoder.spec,
        "encoder_name": encoder.name,
        "seed": seed,
        "preset": preset,
        "budget": task.budget[preset],
        "eval_every": task.eval_every[preset],
    }
    if task.algo == "ppo":
        spec.update(env_id=task.env_id, env_kwargs=dict(task.env_kwargs))
    else:
        # relative to the checkout (the worker resolves it): a job, and so its key, is the same at any path
        spec.update(dataset=task.dataset, dataset_root=DATASET_ROOT, target=task.target, dt=DT_ARGS)
    spec.update(overrides)
    spec["key"] = job_key(spec)
    directory = out / preset / task.algo / task.name / label(encoder.name) / f"s{seed}"
    return Job(spec, directory)


def status(job: Job) -> str:
    """done (result.json of this job that ran its whole budget), incomplete (one that stopped early or is not a
    valid record of it: it runs again), failed, or pending."""
    record = own_result(job.dir, job.spec)
    if record is not None:
        return "done" if complete(record, job.spec) else "incomplete"
    return "failed" if (job.dir / "failed.json").exists() else "pending"


def pending(jobs: Iterable[Job]) -> list[Job]:
    """The jobs that are not done (pending or failed): what an invocation runs."""
    return [job for job in jobs if status(job) != "done"]


def invalidate(jobs: Iterable[Job], encoder_names: Iterable[str], dry_run: bool = False) -> list[Job]:
    """Move aside the results of these encoders' jobs so they run again; returns those jobs.

    With ``dry_run`` nothing is moved: the jobs whose results would be are returned."""
    names = set(encoder_names)
    moved = []
    for job in jobs:
        result = job.dir / "result.json"
        if job.spec["encoder_name"] in names and result.exists():
            if not dry_run:
                os.replace(result, job.dir / "result.stale.json")
            moved.append(job)
    return moved


def execute(
    spec: dict[str, Any], directory: str, timeout_s: float | None = None, start_by: float | None = None
) -> dict[str, Any]:
    """Run one job in a worker subprocess; returns its record or a failure dict (``"status"`` says which:
    done, failed, busy - another invocation holds the job's lock and is running it -, or not started - the
    clock (``time.time()``, so the same on every Ray node) is past ``start_by``). A job another invocation
    finished since this one planned it is not run again: its record is returned.

    Module-level and argument-only, so Ray can ship it to another process or node.
    """
    if past(start_by):
        return {"status": NOT_STARTED, "key": spec["key"]}
    run_dir = Path(directory)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        lock = joblock.acquire(run_dir, timeout_s)
    except OSError as exc:
        tail = f"cannot take {run_dir / joblock.LOCK}: {exc}"
        return {"status": "failed", "returncode": "lock", "stderr_tail": tail, "key": spec["key"]}
    if isinstance(lock, str):
        return {"status": "busy", "holder": lock, "key": spec["key"]}
    try:
        finished = own_result(run_dir, spec)  # by another invocation since this one planned the job?
        if finished is not None and complete(finished, spec):
            return {**finished, "status": "done"}
        return _run(spec, run_dir, timeout_s, lock)
    except Exception as exc:  # disk full, no more processes, ...: this job failed, the invocation goes on
        tail = f"{type(exc).__name__}: {exc}"
        return {"status": "failed", "returncode": "launch", "stderr_tail": tail, "key": spec["key"]}
    finally:
        with contextlib.suppress(OSError):
            lock.release()


def _run(
    spec: dict[str, Any], run_dir: Path, timeout_s: float | None, lock: joblock.JobLock
) -> dict[str, Any]:
    (run_dir / "result.json").unlink(missing_ok=True)
    atomic_write_json(run_dir / "job.json", spec, indent=1)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, "-m", "rl_transformers.study.worker", str(run_dir / "job.json")]
    if timeout_s is not None:  # the worker ends itself then, even if this launcher is gone
        cmd += ["--deadline-s", repr(float(timeout_s))]
    start = time.perf_counter()
    with open(run_dir / "stdout.log", "w") as out, open(run_dir / "stderr.log", "w") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=err)
        try:
            with contextlib.suppress(OSError):
                lock.add_pid(proc.pid)
            with tracked(proc):
                code: int | str = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code = "timeout"
        except BaseException:  # Ctrl-C: never leave the worker behind
            proc.kill()
            proc.wait()
            raise
    wall = time.perf_counter() - start
    result = run_dir / "result.json"
    if code == 0 and result.exists():
        return {**json.loads(result.read_text()), "status": "done"}
    tail = (run_dir / "stderr.log").read_text(errors="replace")[-3000:]
    return {"status": "failed", "returncode": code, "wall_s": wall, "stderr_tail": tail, "key": spec["key"]}


def record_outcome(job: Job, outcome: dict[str, Any]) -> None:
    """Write result.json (done) or failed.json (with the attempt count) for a job's outcome (busy or not
    started: nothing)."""
    if outcome["status"] in ("busy", NOT_STARTED):
        return
    outcome = {k: v for k, v in outcome.items() if k != "status"}
    if "score" in outcome:
        atomic_write_json(job.dir / "result.json", outcome, indent=1)
        (job.dir / "failed.json").unlink(missing_ok=True)
        return
    previous = job.dir / "failed.json"
    attempts = 1
    if previous.exists():
        with contextlib.suppress(OSError, ValueError):
            attempts += int(json.loads(previous.read_text()).get("attempts", 1))
    atomic_write_json(previous, {**outcome, "job": job.name, "attempts": attempts}, indent=1)


def run_local(
    jobs: list[Job],
    workers: int,
    timeout_s: float | None = None,
    log: Callable[[str], None] = print,
    progress: Progress | None = None,
    start_by: float | None = None,
) -> list[dict[str, Any]]:
    """Run the jobs on a pool of ``workers`` subprocesses; records in completion order. ``progress`` (optional)
    is told when each job starts and ends, and prints the outcome lines (else ``log`` does). ``start_by``: a
    ``time.time()`` after which no job starts (the running ones finish; :func:`start_limit`)."""

    def start(job: Job) -> dict[str, Any]:
        if past(start_by):  # before the progress bar counts the job as started
            return {"status": NOT_STARTED, "key": job.spec["key"]}
        if progress is not None:
            progress.start(job.name)
        return execute(job.spec, str(job.dir), timeout_s, start_by)

    outcomes = []
    pool = cf.ThreadPoolExecutor(max_workers=max(1, workers))
    futures: dict[cf.Future[dict[str, Any]], Job] = {}
    try:
        futures = {pool.submit(start, job): job for job in jobs}
        for fut in cf.as_completed(futures):
            job, outcome = futures[fut], fut.result()
            record_outcome(job, outcome)
            _report(log, progress, job, outcome)
            outcomes.append(outcome)
    except BaseException:  # Ctrl-C: start no queued job, stop the running ones (they save), then stop
        stop_all(list(futures))
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    _log_not_started(log, outcomes)
    return outcomes


def run_ray(
    jobs: list[Job],
    address: str | None = None,
    workers: int | None = None,
    timeout_s: float | None = None,
    log: Callable[[str], None] = print,
    progress: Progress | None = None,
    start_by: float | None = None,
) -> list[dict[str, Any]]:
    """Run the jobs as Ray tasks with 1 CPU each (``address`` None: a local instance of ``workers`` CPUs).
    ``progress`` counts the jobs as they end (Ray does not say when a task starts: none shows as running);
    ``start_by`` as in :func:`run_local` (a task that starts later returns at once)."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError("--launcher ray needs Ray: pip install 'rl-transformers[study]'") from exc
    started = False
    if not ray.is_initialized():
        if address:
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        else:
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
        started = True
    remote = ray.remote(num_cpus=1, max_retries=0)(execute)
    try:
        refs = {remote.remote(job.spec, str(job.dir), timeout_s, start_by): job for job in jobs}
        outcomes = []
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                job = refs[ref]
                try:
                    outcome = ray.get(ref)
                except Exception as exc:  # a worker node died: record it as a failure, retried next time
                    outcome = {"status": "failed", "returncode": "ray", "stderr_tail": str(exc)[-3000:]}
                record_outcome(job, outcome)
                _report(log, progress, job, outcome)
                outcomes.append(outcome)
        _log_not_started(log, outcomes)
        return outcomes
    finally:
        if started:
            ray.shutdown()


def start_limit(hours: float | None, flag: str = "--stop-starting-after-h") -> float | None:
    """The ``start_by`` of an invocation that starts jobs for ``hours`` from now (None: no limit); a limit that
    is not a positive number is a :class:`UserError` naming ``flag``."""
    if hours is None:
        return None
    if not (isinstance(hours, (int, float)) and math.isfinite(hours) and hours > 0):
        raise UserError(f"must be a positive number of hours, got {hours!r}", source=flag)
    return time.time() + 3600.0 * hours


def past(start_by: float | None) -> bool:
    """Whether the clock (``time.time()``, the same on every Ray node) is past a start limit."""
    return start_by is not None and time.time() >= start_by


def _log_not_started(log: Callable[[str], None], outcomes: list[dict[str, Any]]) -> None:
    n = sum(o["status"] == NOT_STARTED for o in outcomes)
    if n:
        log(
            f"{n} job(s) not started: the start limit (--stop-starting-after-h) passed; the next invocation runs them"
        )


def _report(log: Callable[[str], None], progress: Progress | None, job: Job, outcome: dict[str, Any]) -> None:
    if outcome["status"] == NOT_STARTED:  # one line for all of them at the end (_log_not_started)
        if progress is not None:
            progress.drop(job.name)
        return
    line = outcome_line(job, outcome)
    if progress is not None:
        progress.finish(job.name, line)
    else:
        log(line)


def outcome_line(job: Job, outcome: dict[str, Any]) -> str:
    """One line on how a job ended."""
    if outcome["status"] == "done":
        rate = outcome.get("steps_per_s") or outcome.get("updates_per_s") or 0.0
        return f"  done {job.name}: score {outcome['score']}, {outcome['wall_s']:.0f} s, {rate:.0f}/s"
    if outcome["status"] == "busy":
        return (
            f"  skipped {job.name}: another invocation is running it ({outcome['holder']}; if none is, delete "
            f"{job.dir / joblock.LOCK})"
        )
    return f"  FAILED {job.name}: {outcome.get('returncode')} (see {job.dir}/stderr.log)"


@contextlib.contextmanager
def tracked(proc: subprocess.Popen[bytes]) -> Iterator[subprocess.Popen[bytes]]:
    """Register a running worker subprocess, so that :func:`stop_all` can stop it."""
    with _LIVE_LOCK:
        _LIVE.add(proc)
    try:
        yield proc
    finally:
        with _LIVE_LOCK:
            _LIVE.discard(proc)


def stop_all(futures: list[cf.Future[dict[str, Any]]]) -> None:
    """Cancel the queued jobs and stop the running ones; returns once every job's thread has ended. Workers
    that a terminal's Ctrl-C reached stop by themselves (the trainer finishes its update, saves and exits);
    one still running after :data:`STOP_QUIET_S` gets one SIGINT (the same), and one still running
    :data:`STOP_GRACE_S` later is killed. Without this, leaving the pool would run every queued job
    (``ThreadPoolExecutor.shutdown`` waits for them all)."""
    for fut in futures:
        fut.cancel()
    start = time.monotonic()
    told: set[int] = set()
    while not all(fut.done() for fut in futures):
        waited = time.monotonic() - start
        if waited > STOP_QUIET_S:
            with _LIVE_LOCK:
                live = list(_LIVE)
            for proc in live:
                late = waited > STOP_QUIET_S + STOP_GRACE_S
                if late or proc.pid not in told:
                    with contextlib.suppress(OSError):
                        proc.send_signal(signal.SIGKILL if late else signal.SIGINT)
                    told.add(proc.pid)
        cf.wait(futures, timeout=0.2)
