"""study.joblock: who holds a job's running.lock, stale-lock takeover, and that only the holder releases it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from rl_transformers.study import joblock

HOST = socket.gethostname()


def dead_pid() -> int:
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    return int(proc.stdout)


def write(lock: Path, **fields) -> None:
    lock.write_text(json.dumps({"host": HOST, "pids": [os.getpid()], "started": time.time(), "timeout_s": 60.0,
                                "token": "theirs", **fields}))  # fmt: skip


def test_who_holds_a_lock(tmp_path: Path) -> None:
    lock = tmp_path / joblock.LOCK
    assert joblock.holder(lock) is None  # no lock
    write(lock, started=time.time() - 10 * 3600)  # a live process on this host, however old: held
    assert joblock.holder(lock) == f"{HOST} pids [{os.getpid()}]"
    write(lock, pids=[dead_pid(), os.getpid()])  # the launcher died, its worker runs: held
    assert joblock.holder(lock) is not None
    write(lock, pids=[dead_pid()])
    assert joblock.holder(lock) is None
    for pids in ([0], [-1], [2**80]):  # process groups / out of range: no live process, no exception
        write(lock, pids=pids)
        assert joblock.holder(lock) is None
    # another host's pids cannot be checked: held until its own run timeout + 10 minutes
    write(lock, host="elsewhere", pids=[1], started=time.time() - 60 - joblock.GRACE_S + 30)
    assert joblock.holder(lock) == "elsewhere pids [1]"
    write(lock, host="elsewhere", pids=[1], started=time.time() - 60 - joblock.GRACE_S - 30)
    assert joblock.holder(lock) is None
    write(lock, host="elsewhere", pids=[1], started=0.0, timeout_s=None)  # no run timeout: held
    assert joblock.holder(lock) is not None
    for text in ('{"host": ', "[]", '{"host": "h", "pids": "x", "started": 0}'):
        lock.write_text(text)
        assert joblock.holder(lock) is None


def test_a_holder_releases_only_its_own_lock(tmp_path: Path) -> None:
    first = joblock.acquire(tmp_path, timeout_s=60.0)
    assert isinstance(first, joblock.JobLock)
    assert joblock.acquire(tmp_path) == f"{HOST} pids [{os.getpid()}]"  # held by this (live) process
    first.add_pid(4242)
    assert json.loads(first.path.read_text())["pids"] == [os.getpid(), 4242]
    write(first.path, pids=[dead_pid()])  # ... taken over by another invocation after a presumed death
    first.add_pid(4343)
    first.release()
    assert json.loads(first.path.read_text())["token"] == "theirs"  # neither rewritten nor deleted
    write(first.path, pids=[dead_pid()])
    second = joblock.acquire(tmp_path, timeout_s=None)
    assert isinstance(second, joblock.JobLock) and second.content["timeout_s"] is None
    second.release()
    assert not first.path.exists()


def test_concurrent_takeovers_of_a_stale_lock_have_one_winner(tmp_path: Path) -> None:
    for round_ in range(10):
        run_dir = tmp_path / str(round_)
        run_dir.mkdir()
        write(run_dir / joblock.LOCK, pids=[dead_pid()])
        barrier = threading.Barrier(6)
        got: list = []

        def take(run_dir: Path = run_dir, barrier: threading.Barrier = barrier, got: list = got) -> None:
            barrier.wait()
            got.append(joblock.acquire(run_dir))

        threads = [threading.Thread(target=take) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [g for g in got if isinstance(g, joblock.JobLock)]
        assert len(got) == 6 and len(winners) == 1
        assert json.loads((run_dir / joblock.LOCK).read_text())["token"] == winners[0].content["token"]
