"""Jobs on real (tiny) PPO runs: records, resume (skip finished, retry failed), invalidation, Ray == local."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rl_transformers.runs.provenance import git_sha
from rl_transformers.study import launch, suite
from rl_transformers.study.encoders import Encoder
from rl_transformers.study.records import Job, expected_steps, machine_text, restore
from rl_transformers.utils.errors import UserError

TINY = {"budget": 256, "eval_every": 128, "num_envs": 4, "eval_episodes": 2,
        "ppo": {"num_steps": 32, "seq_len": 16, "num_minibatches": 2, "update_epochs": 1}}  # fmt: skip
TMAZE = suite.tasks("ppo", ("TMaze10",))[0]
GRU = Encoder("gru", "policy=gru;hidden_size=16", "baseline")
MLP = Encoder("mlp", "policy=mlp;hidden_size=16", "baseline")
VOLATILE = ("wall_s", "steps_per_s", "status")


def jobs(out: Path, broken: bool = False) -> list[Job]:
    made = [
        launch.make_job(TMAZE, GRU, 0, "quick", out, **TINY),
        launch.make_job(TMAZE, MLP, 1, "quick", out, **TINY),
    ]
    if broken:  # corridor_length 0 is refused by the env: the run fails
        made.append(
            launch.make_job(TMAZE, GRU, 5, "quick", out, **{**TINY, "env_kwargs": {"corridor_length": 0}})
        )
    return made


def stable(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in VOLATILE}


def test_job_names_tell_presets_apart(tmp_path: Path) -> None:
    """A job's name keys the progress bar's counts and ETA: the same cell under two presets (the confirmation's
    untuned and tuned variants) must be two jobs there, not one."""
    from rl_transformers.study.progress import Progress

    pair = [launch.make_job(TMAZE, GRU, 0, preset, tmp_path, **TINY) for preset in ("quick", "full")]
    assert pair[0].name == "quick/ppo/TMaze10/gru/s0" and pair[0].name != pair[1].name
    bar = Progress({j.name: 10.0 for j in pair}, 1, lambda _: None, bar=False)
    assert bar.counts() == (0, 0, 2)


def test_resume_skips_finished_and_retries_failed(tmp_path: Path) -> None:
    planned = jobs(tmp_path, broken=True)
    head = git_sha()
    launch.run_local(launch.pending(planned), workers=2, log=lambda _: None)
    assert [launch.status(j) for j in planned] == ["done", "done", "failed"]
    rec = json.loads((planned[0].dir / "result.json").read_text())
    assert (
        rec["algo"] == "ppo" and rec["task"] == "TMaze10" and rec["encoder"] == GRU.spec and rec["seed"] == 0
    )
    assert (
        rec["env_steps"] == 256 and len(rec["curve"]) == 2 and rec["score"] == max(v for _, v in rec["curve"])
    )
    assert rec["final_return"] == rec["curve"][-1][1] and rec["parameters"] > 0 and rec["steps_per_s"] > 0
    # the code that ran it (the worker shares this checkout; a commit landing meanwhile moves HEAD)
    assert rec["git_sha"] in (head, git_sha())
    assert rec["machine"] == machine_text()  # and the machine
    failed = json.loads((planned[2].dir / "failed.json").read_text())
    assert failed["attempts"] == 1 and "corridor_length" in failed["stderr_tail"]
    mtimes = [(j.dir / "result.json").stat().st_mtime_ns for j in planned[:2]]

    todo = launch.pending(planned)  # second invocation: only the failed run
    assert [j.dir for j in todo] == [planned[2].dir]
    launch.run_local(todo, workers=1, log=lambda _: None)
    assert json.loads((planned[2].dir / "failed.json").read_text())["attempts"] == 2
    assert [(j.dir / "result.json").stat().st_mtime_ns for j in planned[:2]] == mtimes

    assert launch.invalidate(planned, ["mlp"], dry_run=True) == [planned[1]]  # --dry-run moves nothing
    assert [launch.status(j) for j in planned[:2]] == ["done", "done"]
    assert launch.invalidate(planned, ["mlp"]) == [planned[1]]  # --rerun-encoders mlp
    assert [launch.status(j) for j in planned[:2]] == ["done", "pending"]
    assert (planned[1].dir / "result.stale.json").exists()
    changed = launch.make_job(TMAZE, GRU, 0, "quick", tmp_path, **{**TINY, "budget": 512})
    assert changed.dir == planned[0].dir and launch.status(changed) == "pending"  # a changed job runs again


def test_ray_launcher_gives_the_local_records(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    local = jobs(tmp_path / "local")
    remote = jobs(tmp_path / "ray")
    launch.run_local(local, workers=2, log=lambda _: None)
    outcomes = launch.run_ray(remote, workers=2, log=lambda _: None)
    assert [o["status"] for o in outcomes] == ["done", "done"]
    for a, b in zip(local, remote):
        ra = json.loads((a.dir / "result.json").read_text())
        rb = json.loads((b.dir / "result.json").read_text())
        assert stable(ra) == stable(rb)


def test_restore_from_committed_records_writes_only_missing_results(tmp_path: Path) -> None:
    """A fresh checkout (empty runs/) resumes from a committed encoders.json (refusals: tests/study/test_records)."""
    planned = jobs(tmp_path / "runs")
    records = [{**planned[0].spec, "score": 0.5, "env_steps": 256, "curve": [[128.0, 0.5]]},
               {**planned[1].spec, "score": 0.25, "env_steps": 256, "curve": [[128.0, 0.25]]}]  # fmt: skip
    committed = tmp_path / "encoders.json"
    committed.write_text(json.dumps(records))
    planned[1].dir.mkdir(parents=True)  # finished here already (same results): not overwritten
    (planned[1].dir / "result.json").write_text(json.dumps({**records[1], "machine": "here"}))
    assert restore(planned, committed, dry_run=True) == [planned[0]]  # --dry-run: counted, not written
    assert [launch.status(j) for j in planned] == ["pending", "done"]
    assert restore(planned, committed) == [planned[0]]
    assert [launch.status(j) for j in planned] == ["done", "done"]
    assert json.loads((planned[0].dir / "result.json").read_text())["score"] == 0.5
    assert json.loads((planned[1].dir / "result.json").read_text())["machine"] == "here"
    # (a local result whose results differ from the committed record: an error, tests/safety/test_study_records)
    assert restore(planned, committed) == []  # already there: nothing overwritten
    # a result moved aside by --rerun-encoders is not brought back from the committed (stale) record
    assert launch.invalidate(planned, [planned[0].spec["encoder_name"]]) == [planned[0]]
    assert restore(planned, committed) == [] and launch.status(planned[0]) == "pending"


def test_a_run_stopped_early_is_no_result_and_runs_again(tmp_path: Path) -> None:
    """SIGTERM makes the trainer save and return early; the worker must not score that shortened run.

    The signal goes to a real worker subprocess (as the study's pool runs it), never to the test process: a
    signal that reached a pytest-xdist worker outside the trainer's handler would kill it, and xdist's
    loadfile scheduler can hang after a crashed worker."""
    from rl_transformers.study import worker

    job = launch.make_job(TMAZE, GRU, 0, "quick", tmp_path, **{**TINY, "budget": 128 * 10_000})  # never ends
    job.dir.mkdir(parents=True)
    (job.dir / "job.json").write_text(json.dumps(job.spec))
    progress = job.dir / "run" / "progress.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    cmd = [sys.executable, "-m", "rl_transformers.study.worker", str(job.dir / "job.json")]
    log = tmp_path / "worker.err"  # a file, not a pipe: a full pipe would block the worker while we poll
    with log.open("w") as stderr:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        deadline = time.monotonic() + 240
        while not (progress.is_file() and progress.read_text().strip()):  # the first update is logged
            assert proc.poll() is None, f"worker exited early ({proc.returncode})"
            assert time.monotonic() < deadline, "no update logged within 240 s"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)  # one SIGTERM, as `kill` sends (a second one aborts the save)
        proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = log.read_text()
    assert proc.returncode == worker.EXIT_INTERRUPTED, err
    assert "no result" in err and not (job.dir / "result.json").exists()
    assert (job.dir / "run" / "checkpoints" / "last.pt").is_file()  # the trainer saved before it returned
    assert launch.status(job) == "pending" and launch.pending([job]) == [job]

    # a result.json left by such a run (the worker before this rule wrote one) is "incomplete" and runs again
    short = {**job.spec, "score": 0.5, "env_steps": 128, "curve": [[128.0, 0.5]]}
    (job.dir / "result.json").write_text(json.dumps(short))
    assert launch.status(job) == "incomplete" and launch.pending([job]) == [job]
    whole = 128 * 10_000
    assert expected_steps(job.spec) == whole and launch.complete({**short, "env_steps": whole}, job.spec)


def test_a_job_running_in_another_invocation_is_skipped_and_a_dead_lock_taken_over(tmp_path: Path) -> None:
    """Two invocations over the same run directories never run a job twice; a killed one does not block it."""
    gru, mlp = jobs(tmp_path)
    host = socket.gethostname()
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    for job, pids in ((gru, [os.getpid()]), (mlp, [int(dead.stdout)])):  # a live holder; a dead one
        job.dir.mkdir(parents=True)
        lock = {"host": host, "pids": pids, "started": time.time(), "timeout_s": None, "token": "t"}
        (job.dir / "running.lock").write_text(json.dumps(lock))
    said: list[str] = []
    outcomes = launch.run_local([gru, mlp], workers=2, log=said.append)
    assert sorted(o["status"] for o in outcomes) == ["busy", "done"]
    assert [launch.status(j) for j in (gru, mlp)] == ["pending", "done"]
    assert not (gru.dir / "failed.json").exists() and not (gru.dir / "job.json").exists()  # left alone
    skipped = f"skipped {gru.name}: another invocation is running it ({host} pids [{os.getpid()}]; if none is"
    assert any(skipped in line for line in said)
    assert (gru.dir / "running.lock").exists() and not (mlp.dir / "running.lock").exists()


def test_the_lock_names_the_worker_while_it_runs(tmp_path: Path) -> None:
    """A launcher killed alone leaves its worker running; the lock lists the worker, so the job stays held."""
    import threading

    job = jobs(tmp_path)[0]
    outcome: dict = {}
    thread = threading.Thread(target=lambda: outcome.update(launch.execute(job.spec, str(job.dir))))
    thread.start()
    lock = job.dir / "running.lock"
    pids: list[int] = []
    deadline = time.monotonic() + 120  # a hang guard, not a speed assertion
    while thread.is_alive() and len(pids) < 2 and time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError, KeyError):
            pids = json.loads(lock.read_text())["pids"]
        time.sleep(0.05)
    thread.join(timeout=240)
    assert not thread.is_alive(), "the tiny run did not end within 240 s"
    assert len(pids) == 2 and pids[0] == os.getpid() and pids[1] != os.getpid()
    assert outcome["status"] == "done" and not lock.exists()


def test_a_job_finished_meanwhile_is_not_run_again_and_launch_errors_are_outcomes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = jobs(tmp_path)[0]
    job.dir.mkdir(parents=True)
    done = {**job.spec, "score": 0.5, "curve": [[256.0, 0.5]], "env_steps": 256}  # by another invocation
    (job.dir / "result.json").write_text(json.dumps(done))
    outcome = launch.execute(job.spec, str(job.dir))
    assert outcome == {**done, "status": "done"} and not (job.dir / "stdout.log").exists()  # not run again

    (job.dir / "result.json").unlink()

    def no_more_processes(*args, **kwargs):
        raise OSError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(launch.subprocess, "Popen", no_more_processes)
    said: list[str] = []
    [outcome] = launch.run_local([job], workers=1, log=said.append)  # recorded, not raised
    assert outcome["status"] == "failed" and outcome["returncode"] == "launch"
    assert (
        "Resource temporarily unavailable" in json.loads((job.dir / "failed.json").read_text())["stderr_tail"]
    )
    assert any(line.startswith(f"  FAILED {job.name}: launch") for line in said)
    assert not (job.dir / "running.lock").exists()


def test_a_worker_stops_itself_at_its_deadline_even_without_a_launcher(tmp_path: Path) -> None:
    """The launcher passes its timeout to the worker, which then stops (SIGTERM to itself: no result); one that
    ignores the SIGTERM exits anyway after the grace time."""
    from rl_transformers.study import worker

    job = launch.make_job(TMAZE, GRU, 0, "quick", tmp_path, **{**TINY, "budget": 128 * 10_000})  # never ends
    job.dir.mkdir(parents=True)
    (job.dir / "job.json").write_text(json.dumps(job.spec))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    cmd = [
        sys.executable,
        "-m",
        "rl_transformers.study.worker",
        str(job.dir / "job.json"),
        "--deadline-s",
        "5",
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)  # nobody kills it
    assert "deadline of 5 s reached: stopping (no result)" in done.stderr, done.stderr[-2000:]
    # stopped by the trainer's handler (it saves and returns) or, if it came before the trainer started, by
    # SIGTERM's default action; either way no result
    assert done.returncode in (worker.EXIT_INTERRUPTED, -signal.SIGTERM), done.stderr[-2000:]
    assert not (job.dir / "result.json").exists()

    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    stubborn += "from rl_transformers.study.worker import arm_deadline; arm_deadline(0.2, grace_s=0.2); time.sleep(120)"
    done = subprocess.run(
        [sys.executable, "-c", stubborn], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == worker.EXIT_DEADLINE, done.stderr
    assert "still running 0.2 s after the deadline: exiting" in done.stderr

    # stuck in one C call, the Python handlers never run: faulthandler's watchdog thread ends it
    stuck = "from rl_transformers.study.worker import arm_deadline; arm_deadline(0.2, grace_s=0.2, watchdog_s=0.2); "
    stuck += "sum(range(10**13))"
    done = subprocess.run([sys.executable, "-c", stuck], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "Timeout" in done.stderr, done.stderr

    # disarmed (the trainer returned): nothing fires
    calm = "import time; from rl_transformers.study.worker import arm_deadline, disarm_deadline; "
    calm += (
        "arm_deadline(0.2, grace_s=0.2, watchdog_s=0.2); disarm_deadline(); time.sleep(1.5); print('alive')"
    )
    done = subprocess.run([sys.executable, "-c", calm], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip().endswith("alive"), done.stderr

    bad = subprocess.run([*cmd[:-1], "soon"], env=env, capture_output=True, text=True, timeout=60)
    assert (
        bad.returncode == 2 and "--deadline-s must be a positive number of seconds, got 'soon'" in bad.stderr
    )


def test_deadline_values() -> None:
    from rl_transformers.study.worker import MAX_DEADLINE_S, parse_deadline

    assert parse_deadline("600.0") == 600.0 and parse_deadline("1e-3") == 1e-3
    assert parse_deadline("inf") is None and parse_deadline(repr(MAX_DEADLINE_S)) is None  # no deadline
    for text in ("0", "-5", "nan", "soon", ""):
        with pytest.raises(ValueError, match="positive number of seconds"):
            parse_deadline(text)


def test_the_launcher_gives_its_timeout_to_the_worker(tmp_path: Path) -> None:
    with_timeout, without = jobs(tmp_path)
    assert launch.execute(with_timeout.spec, str(with_timeout.dir), timeout_s=600.0)["status"] == "done"
    assert "deadline: this worker stops itself after 600 s" in (with_timeout.dir / "stdout.log").read_text()
    assert launch.execute(without.spec, str(without.dir), timeout_s=float("inf"))["status"] == "done"
    assert "deadline" not in (without.dir / "stdout.log").read_text()  # an infinite timeout: no deadline


def test_a_killed_launcher_leaves_a_lock_that_the_next_invocation_takes_over(tmp_path: Path) -> None:
    """Reproduces a stale running.lock: a launcher and its worker killed by SIGKILL mid-run leave
    the lock behind; the next invocation takes it over, runs the job and removes it."""
    job = jobs(tmp_path)[0]
    script = (
        "import json, sys\n"
        "from rl_transformers.study import launch\n"
        "launch.execute(json.loads(sys.argv[1]), sys.argv[2])\n"
    )
    launcher = subprocess.Popen([sys.executable, "-c", script, json.dumps(job.spec), str(job.dir)],
                                start_new_session=True)  # fmt: skip
    lock = job.dir / "running.lock"
    pids: list[int] = []
    deadline = time.monotonic() + 120  # a hang guard, not a speed assertion
    while len(pids) < 2 and launcher.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError, KeyError):
            pids = json.loads(lock.read_text())["pids"]
        time.sleep(0.02)
    os.killpg(launcher.pid, signal.SIGKILL)  # the launcher and its worker (same session)
    launcher.wait()
    assert len(pids) == 2 and lock.exists() and launch.status(job) == "pending"
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{p}").exists() for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)  # the worker's zombie is reaped by init
    said: list[str] = []
    [outcome] = launch.run_local([job], workers=1, log=said.append)
    assert outcome["status"] == "done" and launch.status(job) == "done" and not lock.exists()


def test_ctrl_c_starts_no_queued_job_and_stops_the_running_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Leaving a thread pool waits for every queued job: after Ctrl-C the launcher used to run the whole queue.
    Now it cancels the queue, gives the running workers one SIGINT (those a terminal's Ctrl-C reached stop by
    themselves) and kills the ones that ignore it."""
    started: list[int] = []
    monkeypatch.setattr(launch, "STOP_QUIET_S", 0.3)
    monkeypatch.setattr(launch, "STOP_GRACE_S", 1.0)

    def fake_execute(spec: dict, directory: str, timeout_s: float | None = None, start_by=None) -> dict:
        started.append(spec["seed"])
        if spec["seed"] == 0:  # ends at once: its outcome line is where the "Ctrl-C" lands
            return {"status": "busy", "holder": "test", "key": spec["key"]}
        ignore = "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); " if spec["seed"] == 2 else ""
        proc = subprocess.Popen([sys.executable, "-c", ignore + "import time; time.sleep(60)"])
        with launch.tracked(proc):
            code = proc.wait()
        return {"status": "failed", "returncode": code, "key": spec["key"]}

    monkeypatch.setattr(launch, "execute", fake_execute)
    queue = [launch.make_job(TMAZE, GRU, seed, "quick", tmp_path, **TINY) for seed in range(5)]

    def log(line: str) -> None:
        time.sleep(0.5)  # the freed thread takes the next job and starts its worker
        raise KeyboardInterrupt

    begin = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        launch.run_local(queue, workers=2, log=log)
    assert time.monotonic() - begin < 20  # not the 60 s sleeps, nor the queue
    assert sorted(started) == [0, 1, 2]  # seeds 3 and 4 never started
    assert not launch._LIVE  # seed 1 stopped by SIGINT, seed 2 (ignores it) killed


def test_a_start_limit_starts_no_job_after_it_and_lets_the_running_ones_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--stop-starting-after-h (a time-limited allocation): jobs started before the limit finish and keep their
    results; none starts after it, nothing is written for those, and one line says how many the next
    invocation runs. The clock is the test's: each job takes one tick."""
    from rl_transformers.study.progress import Progress

    clock = [0.0]
    monkeypatch.setattr(launch.time, "time", lambda: clock[0])
    ran: list[int] = []

    def fake_execute(spec: dict, directory: str, timeout_s=None, start_by=None) -> dict:
        assert start_by == 2.0  # passed on, for a Ray task that starts late
        ran.append(spec["seed"])
        clock[0] += 1.0
        return {"status": "failed", "returncode": 1, "key": spec["key"]}

    monkeypatch.setattr(launch, "execute", fake_execute)
    queue = [launch.make_job(TMAZE, GRU, seed, "quick", tmp_path, **TINY) for seed in range(5)]
    lines: list[str] = []
    bar = Progress({j.name: 10.0 for j in queue}, 1, lines.append, bar=False)
    outcomes = launch.run_local(queue, workers=1, log=lines.append, progress=bar, start_by=2.0)
    assert ran == [0, 1]
    assert [o["status"] for o in outcomes].count(launch.NOT_STARTED) == 3
    assert [(j.dir / "failed.json").exists() for j in queue] == [True, True, False, False, False]
    assert bar.counts() == (2, 0, 0)  # the jobs not started leave the counts (and the ETA)
    assert lines[-1].startswith("3 job(s) not started") and "next invocation" in lines[-1]
    assert sum("not started" in line for line in lines) == 1


def test_execute_past_its_start_limit_returns_at_once_and_the_limit_must_be_positive(tmp_path: Path) -> None:
    """A Ray task that starts after the limit takes no lock and runs nothing."""
    job = launch.make_job(TMAZE, GRU, 0, "quick", tmp_path, **TINY)
    out = launch.execute(job.spec, str(job.dir), None, start_by=time.time() - 1.0)
    assert out == {"status": launch.NOT_STARTED, "key": job.spec["key"]} and not job.dir.exists()
    assert launch.start_limit(None) is None
    assert 0 < launch.start_limit(0.5) - time.time() <= 1800.0
    for bad in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(UserError, match=r"must be a positive number of hours") as err:
            launch.start_limit(bad)
        assert err.value.source == "--stop-starting-after-h"
