"""rl_transformers/study/attempts.py: an interrupted study run resumes from its checkpoint and logs what the
uninterrupted run logs, with its wall time summed over attempts; any doubt (other or uncommitted code,
another machine or job, a checkpoint this user did not sign) starts it over."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rl_transformers.study import attempts, launch, suite, worker
from rl_transformers.study.encoders import Encoder

CODE = "0123456789abcdef0123456789abcdef01234567"
"""The code identity the tests' worker reports (a development checkout may have uncommitted changes)."""
TMAZE = suite.tasks("ppo", ("TMaze10",))[0]
GRU = Encoder("gru", "policy=gru;hidden_size=16", "baseline")
SMALL = {"budget": 512, "eval_every": 128, "num_envs": 4, "eval_episodes": 2,
         "ppo": {"num_steps": 32, "seq_len": 16, "num_minibatches": 2, "update_epochs": 1}}  # fmt: skip
"""4 updates of 128 env steps, an evaluation after each."""
VOLATILE = ("time/fps",)


def write_job(out: Path) -> Path:
    job = launch.make_job(TMAZE, GRU, 0, "quick", out, **SMALL)
    job.dir.mkdir(parents=True)
    (job.dir / "job.json").write_text(json.dumps(job.spec))
    return job.dir / "job.json"


def logged(job_json: Path) -> list[dict]:
    rows = [
        json.loads(line) for line in (job_json.parent / "run" / "progress.jsonl").read_text().splitlines()
    ]
    return [{k: v for k, v in row.items() if k not in VOLATILE} for row in rows]


@pytest.fixture
def interrupted(tmp_path: Path, monkeypatch) -> Path:
    """A job whose first attempt stopped after its second update (the trainer saved a checkpoint there)."""
    from rl_transformers.algos import ppo

    monkeypatch.setattr(worker, "code_identity", lambda: CODE)
    job_json = write_job(tmp_path / "interrupted")
    train = ppo.train
    with monkeypatch.context() as patch:
        patch.setattr(ppo, "train", lambda cfg, run_dir: train(cfg, run_dir, lambda tr: tr.update < 2))
        assert worker.main([str(job_json)]) == worker.EXIT_INTERRUPTED
    assert not (job_json.parent / "result.json").exists()
    return job_json


def test_an_interrupted_run_resumes_and_logs_what_the_whole_run_logs(
    tmp_path: Path, interrupted: Path, monkeypatch
) -> None:
    whole = write_job(tmp_path / "whole")
    assert worker.main([str(whole)]) == 0
    first = json.loads((interrupted.parent / attempts.ATTEMPT_FILE).read_text())
    checkpoint = interrupted.parent / "run" / "checkpoints" / "last.pt"
    credit = checkpoint.stat().st_mtime - first["started_at"]
    assert credit > 0
    job = json.loads(interrupted.read_text())
    plan = attempts.plan_attempt(job, interrupted.parent / "run", CODE, first["machine"])
    assert (plan.checkpoint, plan.resumed_from) == (checkpoint, (256,))
    assert plan.credit_s == pytest.approx(credit)

    assert worker.main([str(interrupted)]) == 0
    resumed = json.loads((interrupted.parent / "result.json").read_text())
    record = json.loads((whole.parent / "result.json").read_text())
    assert resumed["resumed_from"] == [256] and "resumed_from" not in record
    assert resumed["curve"] == record["curve"] and len(record["curve"]) == 4
    assert logged(interrupted) == logged(whole)  # every training statistic, bit for bit
    assert resumed["env_steps"] == record["env_steps"] == 512
    assert resumed["wall_s"] > credit  # the first attempt's time up to its checkpoint is counted
    # finished: run again (--rerun-encoders moves the result aside), it starts over
    assert not (interrupted.parent / attempts.ATTEMPT_FILE).exists()
    assert (
        attempts.plan_attempt(job, interrupted.parent / "run", CODE, first["machine"]) == attempts.Attempt()
    )


def test_a_checkpoint_at_the_whole_budget_is_not_resumed(interrupted: Path) -> None:
    """A record written but its attempt file left (killed between the two writes): running the job again
    must not resume a run that has nothing left to do (the trainer would refuse it)."""
    job = json.loads(interrupted.read_text())
    machine = json.loads((interrupted.parent / attempts.ATTEMPT_FILE).read_text())["machine"]
    run = interrupted.parent / "run"
    assert attempts.plan_attempt(job, run, CODE, machine).checkpoint is not None
    assert attempts.plan_attempt({**job, "budget": 256}, run, CODE, machine) == attempts.Attempt()


@pytest.mark.parametrize(
    "change",
    [
        {"code": "fedcba9876543210fedcba9876543210fedcba98"},  # other code
        {"machine": "another CPU"},
        {"key": "0000000000000000"},  # another job in the same directory
    ],
)
def test_a_run_starts_over_when_the_previous_attempt_differs(interrupted: Path, change: dict) -> None:
    job = json.loads(interrupted.read_text())
    run = interrupted.parent / "run"
    attempt_file = interrupted.parent / attempts.ATTEMPT_FILE
    before = json.loads(attempt_file.read_text())
    assert attempts.plan_attempt(job, run, CODE, before["machine"]).checkpoint is not None
    attempt_file.write_text(json.dumps({**before, **change}))
    assert attempts.plan_attempt(job, run, CODE, before["machine"]) == attempts.Attempt()


def test_uncommitted_code_or_a_foreign_checkpoint_starts_over(
    interrupted: Path, monkeypatch, tmp_path: Path
) -> None:
    job = json.loads(interrupted.read_text())
    run = interrupted.parent / "run"
    machine = json.loads((interrupted.parent / attempts.ATTEMPT_FILE).read_text())["machine"]
    attempts.start_attempt(job, run, attempts.Attempt(), None, machine)  # code_identity: uncommitted changes
    assert attempts.plan_attempt(job, run, None, machine) == attempts.Attempt()
    attempts.start_attempt(job, run, attempts.Attempt(), CODE, machine)
    assert attempts.plan_attempt(job, run, CODE, machine).checkpoint is not None
    monkeypatch.setenv("RLT_HOME", str(tmp_path / "another_user"))  # another signing key
    assert attempts.plan_attempt(job, run, CODE, machine) == attempts.Attempt()
    # the worker then runs it from step 0: a complete record, not marked as resumed
    assert worker.main([str(interrupted)]) == 0
    assert "resumed_from" not in json.loads((interrupted.parent / "result.json").read_text())


def test_code_identity_names_the_committed_code_and_refuses_uncommitted_changes(tmp_path: Path) -> None:
    import subprocess

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    for path in attempts.CODE_PATHS:
        target = tmp_path / path / "a.py" if "." not in path else tmp_path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("x = 1\n")
    (tmp_path / "docs.md").write_text("results\n")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "code")
    first = attempts.code_identity(tmp_path)
    assert first is not None and len(first.split(",")) == len(attempts.CODE_PATHS)
    (tmp_path / "docs.md").write_text("more results\n")  # a commit of records only
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "records")
    assert attempts.code_identity(tmp_path) == first
    (tmp_path / "rl_transformers" / "b.py").write_text("y = 2\n")  # untracked code is code too
    assert attempts.code_identity(tmp_path) is None
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "more code")
    second = attempts.code_identity(tmp_path)
    assert second is not None and second != first
    (tmp_path / "envs" / "a.py").write_text("x = 3\n")  # an edit, uncommitted
    assert attempts.code_identity(tmp_path) is None
    assert attempts.code_identity(tmp_path / "not_a_checkout") is None
