"""The driver: a subset invocation keeps the whole preset's documents; committed records restore on a fresh checkout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rl_transformers.study import encoders as enc
from rl_transformers.study import report, run
from rl_transformers.study.flags import changed, configure
from rl_transformers.study.records import Job
from rl_transformers.utils.errors import UserError

ROWS = [enc.Encoder("gru", "policy=gru", "baseline"), enc.Encoder("mlp", "policy=mlp", "baseline")]
DT_ROWS = [enc.Encoder("full", "attention=full", "attention")]


@pytest.fixture()
def captured(monkeypatch: pytest.MonkeyPatch) -> dict:
    monkeypatch.setattr(enc, "ppo_encoders", lambda match=True: (list(ROWS), []))
    monkeypatch.setattr(enc, "dt_encoders", lambda match=True: (list(DT_ROWS), []))
    seen: dict = {}

    def write_report(records, docs, ctx):  # the documents' inputs, without rliable's bootstrap
        seen.update(records=list(records), ctx=ctx, docs=docs)
        return {}

    monkeypatch.setattr(report, "write_report", write_report)
    return seen


def test_subset_report_keeps_every_committed_task(tmp_path: Path, captured: dict) -> None:
    every, _ = run.plan(run.StudyConfig(preset="full"))
    tmaze = next(j for j in every if j.spec["task"] == "TMaze10" and j.spec["encoder_name"] == "gru")
    repeat = next(
        j for j in every if j.spec["task"] == "RepeatPreviousEasy" and j.spec["encoder_name"] == "mlp"
    )
    offline = next(j for j in every if j.spec["algo"] == "dt")
    docs = tmp_path / "docs"
    docs.mkdir()
    committed = [  # each ran its whole budget
        {
            **j.spec,
            "score": 0.25,
            "curve": [[1.0, 0.25]],
            "env_steps": j.spec["budget"],
            "updates": j.spec["budget"],
        }
        for j in (tmaze, repeat, offline)
    ]
    (docs / "encoders_screening.json").write_text(json.dumps(committed))
    cfg = configure(run.StudyConfig, preset="full", parts=("online",), tasks=("TMaze10",), out=tmp_path / "runs",
                          docs=docs, report_only=True)  # fmt: skip
    run.run_study(cfg, log=lambda _msg: None)
    assert sorted(r["key"] for r in captured["records"]) == sorted(
        j.spec["key"] for j in (tmaze, repeat, offline)
    )
    assert (
        captured["ctx"]["planned"]["TMaze10"] == 2 * 3 and captured["ctx"]["planned"]["Pendulum-medium"] == 3
    )
    assert "--tasks" not in captured["ctx"]["command"] and "--report-only" in captured["ctx"]["command"]
    assert (tmp_path / "runs" / "full" / "ppo" / "RepeatPreviousEasy").exists()  # restored into run dirs

    captured.clear()  # --no-restore: the committed file is not restored, and a rebuild that drops it is refused
    with pytest.raises(UserError, match="3 of the 3 committed ones would be lost"):
        run.run_study(changed(cfg, out=tmp_path / "fresh", restore=False), log=lambda _msg: None)
    assert captured == {} and not (tmp_path / "fresh").exists()


def test_estimate_scales_an_encoder_rate_by_the_task_speed_factor(tmp_path: Path) -> None:

    finished = [("ppo", "A", "x", 1000.0), ("ppo", "A", "y", 2000.0), ("ppo", "B", "x", 500.0)]
    for i, (algo, task, name, rate) in enumerate(finished):
        d = tmp_path / "runs" / str(i)
        d.mkdir(parents=True)
        (d / "result.json").write_text(json.dumps({"algo": algo, "task": task, "encoder_name": name,
                                                   "steps_per_s": rate}))  # fmt: skip

    def job(algo: str, task: str, name: str, budget: int) -> Job:
        return Job({"algo": algo, "task": task, "encoder_name": name, "budget": budget}, tmp_path / "j")

    # x's median rate: 750; task factors (median of rate / encoder median): A 7/6, B 2/3
    cases = [
        (job("ppo", "A", "x", 1000), 1000 / 1000),  # measured pair
        (job("ppo", "B", "y", 1000), 1000 / (2000 * 2 / 3)),  # y's rate x B's factor
        (job("ppo", "C", "y", 1000), 1000 / 2000),  # a task without runs: factor 1
        (job("ppo", "A", "z", 1000), 1000 / 1000),  # an encoder without runs: every ppo run's median
        (job("dt", "D", "full", 100), 100 / 20),  # nothing measured: the assumed 20 updates/s
    ]
    for j, expected in cases:
        seconds, unknown = run.estimate([j], tmp_path / "runs")
        assert seconds == pytest.approx(expected + 10.0), j.spec
        assert unknown == (1 if j.spec["algo"] == "dt" else 0)
    total, unknown = run.estimate([j for j, _ in cases], tmp_path / "runs")
    assert total == pytest.approx(sum(e + 10.0 for _, e in cases)) and unknown == 1


def test_a_dry_run_changes_nothing_on_disk(tmp_path: Path, captured: dict) -> None:
    """It counts what it would restore as finished and what it would move aside as to run, and writes nothing."""
    docs = tmp_path / "docs"
    cfg = configure(run.StudyConfig, preset="full", parts=("online",), tasks=("TMaze10",), out=tmp_path / "runs",
                          docs=docs, dry_run=True)  # fmt: skip
    jobs, _ = run.plan(cfg)

    def record(j) -> dict:  # a run of its whole budget
        return {**j.spec, "score": 0.5, "curve": [[1.0, 0.5]], "env_steps": j.spec["budget"]}

    for j in jobs:  # gru finished here; mlp only in the committed records (a fresh checkout)
        if j.spec["encoder_name"] == "gru":
            j.dir.mkdir(parents=True)
            (j.dir / "result.json").write_text(json.dumps(record(j)))
    docs.mkdir()
    (docs / "encoders_screening.json").write_text(
        json.dumps([record(j) for j in jobs if j.spec["encoder_name"] == "mlp"])
    )
    before = sorted((p.relative_to(tmp_path), p.stat().st_mtime_ns) for p in tmp_path.rglob("*"))
    said: list[str] = []
    assert run.run_study(cfg, log=said.append)["todo"] == 0  # the 3 mlp seeds count as restored
    assert f"would restore 3 finished runs from {docs / 'encoders_screening.json'}" in said
    for name in ("mlp", "gru"):  # moved aside: restored ones too
        dry = run.run_study(changed(cfg, rerun_encoders=(name,)), log=said.append)
        assert dry["todo"] == 3 and f"would move aside 3 results of ['{name}']" in said
    assert sorted((p.relative_to(tmp_path), p.stat().st_mtime_ns) for p in tmp_path.rglob("*")) == before

    with pytest.raises(UserError, match="--rerun-encoders mlp with --report-only would drop their results"):
        run.run_study(changed(cfg, dry_run=False, report_only=True, rerun_encoders=("mlp",)), log=said.append)
    assert sorted((p.relative_to(tmp_path), p.stat().st_mtime_ns) for p in tmp_path.rglob("*")) == before
    run.run_study(changed(cfg, dry_run=False, report_only=True), log=said.append)
    assert f"restored 3 finished runs from {docs / 'encoders_screening.json'}" in said
    assert any(line.startswith("building the documents from 6 runs: rliable") for line in said)


def test_report_only_never_writes_fewer_records_than_it_read(tmp_path: Path, captured: dict) -> None:
    """Reproduces the lost committed records: a rebuild that would drop committed records writes nothing."""
    docs = tmp_path / "docs"
    cfg = configure(run.StudyConfig, preset="full", out=tmp_path / "runs", docs=docs, report_only=True)
    jobs, _ = run.plan(cfg)
    ours = [j for j in jobs if j.spec["task"] == "TMaze10"][:2]
    docs.mkdir()
    committed = [{**j.spec, "score": 0.5, "curve": [[1.0, 0.5]], "env_steps": j.spec["budget"]} for j in ours]
    (docs / "encoders_screening.json").write_text(json.dumps(committed))
    before = (docs / "encoders_screening.json").read_bytes()
    with pytest.raises(UserError, match=r"would hold 0 records, and 2 of the 2 committed ones would be lost"):
        run.run_study(changed(cfg, restore=False), log=lambda _msg: None)  # a fresh checkout, not restored
    assert captured == {} and (docs / "encoders_screening.json").read_bytes() == before
    run.run_study(cfg, log=lambda _msg: None)
    assert len(captured["records"]) == 2
    said: list[str] = []
    (ours[1].dir / "result.json").write_text("{garbage")  # a damaged local copy is restored again, no crash
    run.run_study(cfg, log=said.append)
    assert (
        len(captured["records"]) == 2
        and f"restored 1 finished runs from {docs / 'encoders_screening.json'}" in said
    )
