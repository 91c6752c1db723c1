"""The screening documents: encoders_screening.json / its aggregate fields, Markdown tables, plots, partial label."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("rliable")

from rl_transformers.study import report

TASKS = {"ppo": ["t1", "t2"], "dt": ["d1"]}


def records() -> list[dict]:
    rng = np.random.default_rng(1)
    out = []
    for name, spec in (("gru", "policy=gru"), ("full", "attention=full;memory=None"), ("gtrxl", "")):
        for seed in (0, 1, 2):
            for task in TASKS["ppo"]:
                s = float(rng.uniform(-1, 1))
                out.append({"algo": "ppo", "task": task, "encoder": spec, "encoder_name": name, "seed": seed,
                            "score": s, "final_return": s - 0.1, "env_steps": 4096, "steps_per_s": 1000.0 + seed,
                            "wall_s": 4.0, "parameters": 211525, "curve": [[2048, s - 0.2], [4096, s]],
                            "preset": "quick", "key": "k"})  # fmt: skip
    for name in ("full", "linear"):
        for seed in (0, 1, 2):
            out.append({"algo": "dt", "task": "d1", "encoder": f"attention={name}", "encoder_name": name,
                        "seed": seed, "score": 50.0 + seed, "final_return": 100.0, "env_steps": None,
                        "steps_per_s": None, "updates_per_s": 9.0, "wall_s": 3.0, "parameters": 132930,
                        "curve": [[10, 40.0], [20, 50.0 + seed]], "preset": "quick", "key": "k"})  # fmt: skip
    return out


def context() -> dict:
    return {
        "tasks": TASKS,
        "task_notes": {t: ("tag", "4,096 env steps", "MMER") for t in ("t1", "t2", "d1")},
        "encoders": {"ppo": [("gru", "policy=gru", "baseline", ""), ("full", "attention=full;memory=None",
                             "attention", ""), ("gtrxl", "", "default", "")],
                     "dt": [("full", "attention=full", "attention", ""), ("linear", "attention=linear", "attention", "")]},
        "excluded": {"ppo": [("linformer", "no causal mode")], "dt": []},
        "expected": {"ppo": 18, "dt": 6},
        "preset": "quick",
        "command": "python scripts/encoder_study.py --report-only",
        "method": "METHOD TEXT",
        "reps": 100,
    }  # fmt: skip


def test_documents_have_the_documented_fields(tmp_path: Path) -> None:
    recs = records()
    report.write_report(recs, tmp_path, context())
    runs = json.loads((tmp_path / "encoders_screening.json").read_text())
    assert len(runs) == len(recs)
    for r in runs:
        for key in ("algo", "task", "encoder", "seed", "score", "final_return", "env_steps", "steps_per_s",
                    "parameters"):  # fmt: skip
            assert key in r
    aggs = json.loads((tmp_path / "encoders_screening_aggregate.json").read_text())
    assert set(aggs) == {"online", "offline"} and aggs["online"]["reference"] == "gru"
    for row in aggs["online"]["encoders"].values():
        for key in ("iqm", "ci_low", "ci_high", "prob_improvement"):
            assert key in row
        assert row["ci_low"] <= row["iqm"] <= row["ci_high"]
    assert aggs["online"]["encoders"]["gru"]["prob_improvement"] is None
    assert 0 <= aggs["online"]["encoders"]["full"]["prob_improvement"] <= 1
    # offline scores are divided by 100: IQM of 50, 51, 52 -> 0.51
    assert aggs["offline"]["encoders"]["full"]["iqm"] == pytest.approx(0.51)
    md = (tmp_path / "encoders_screening.md").read_text()
    assert "PARTIAL" not in md and "Complete" in md
    assert "| encoder | t1 | t2 | steps/s | parameters |" in md
    assert "| linformer | – | excluded | no causal mode |" in md
    assert "python scripts/encoder_study.py --report-only" in md and "METHOD TEXT" in md
    for name in ("iqm_online.png", "profile_online.png", "score_vs_speed_online.png", "curves_t1.png",
                 "iqm_offline.png"):  # fmt: skip
        assert (tmp_path / "plots" / name).stat().st_size > 0
        assert f"plots/{name}" in md


def test_code_line_counts_the_commits_and_the_records_without_one() -> None:
    recs = [{"git_sha": "a" * 40}, {"git_sha": "a" * 40}, {"git_sha": "b" * 40 + "-dirty"}, {}]
    text = report.code_text(recs)
    assert "`aaaaaaa` (2), `bbbbbbb-dirty` (1); 1 older records predate the field" in text
    assert report.code_text([{}, {"git_sha": None}]) == (
        "Code: none of the 2 records carries its commit (the field came later)."
    )


def test_cost_line_sums_the_wall_clock_per_suite() -> None:
    recs = [{"algo": "ppo", "wall_s": 5400.0}, {"algo": "ppo", "wall_s": 1800.0}, {"algo": "dt", "wall_s": 3600.0},
            {"algo": "dt", "wall_s": None}]  # fmt: skip
    assert report.cost_text(recs).startswith(
        "Cost: the 4 finished runs took 3.0 core-hours (the sum of their wall-clock times; online 2 runs, 2.0 h; "
        "offline 2 runs, 1.0 h)."
    )


def test_partial_results_are_labelled(tmp_path: Path) -> None:
    recs = [r for r in records() if not (r["encoder_name"] == "gtrxl" and r["task"] == "t2")]
    report.write_report(recs, tmp_path, context())
    md = (tmp_path / "encoders_screening.md").read_text()
    assert "PARTIAL RESULTS" in md and "online 15 / 18" in md
    assert "| gtrxl | – | – | – | – | incomplete: no finished run on ['t2'] |" in md
    # per-task cell: mean ± std over seeds
    vals = [r["score"] for r in recs if r["encoder_name"] == "gru" and r["task"] == "t1"]
    assert f"{np.mean(vals):.2f} ± {np.std(vals, ddof=1):.2f}" in md
    report.write_report(recs, tmp_path, {**context(), "planned": {"t1": 9, "t2": 9, "d1": 6}})
    md = (tmp_path / "encoders_screening.md").read_text()
    assert "Finished runs per task: t1 9 / 9, t2 6 / 9, d1 6 / 6." in md


def test_aggregate_covers_only_complete_tasks(tmp_path: Path) -> None:
    """A partial study aggregates the tasks whose every planned run finished (no mix of seeds and tasks)."""
    recs = [r for r in records() if not (r["task"] == "t2" and r["seed"] == 2)]
    ctx = {**context(), "planned": {"t1": 9, "t2": 9, "d1": 6}}
    assert report.aggregate_tasks(recs, ctx) == {"ppo": ["t1"], "dt": ["d1"]}
    aggs = report.write_report(recs, tmp_path, ctx)
    t1_only = report.build_aggregates([r for r in recs if r["task"] == "t1" or r["algo"] == "dt"],
                                      {"ppo": ["t1"], "dt": ["d1"]}, 100)  # fmt: skip
    assert aggs["online"]["encoders"]["gru"]["iqm"] == pytest.approx(
        t1_only["online"]["encoders"]["gru"]["iqm"]
    )
    md = (tmp_path / "encoders_screening.md").read_text()
    assert "Over 1 of 2 tasks (those with every planned run finished): t1." in md
    offline = md.split("## Offline")[1]  # the DT aggregate says its scale; the online one needs no note
    assert (
        "Over 1 of 1 tasks (those with every planned run finished): d1. Scores are the normalized" in offline
    )
    assert "normalized scores / 100" not in md.split("## Offline")[0]


def test_budget_check_reports_the_reference_gain_beside_the_mlp(tmp_path: Path) -> None:
    """Per task: the reference's mean first evaluation, mean score and gain, and the MLP's mean score."""

    def rec(name: str, seed: int, task: str, curve: list[list[float]]) -> dict:
        return {"algo": "ppo", "task": task, "encoder": name, "encoder_name": name, "seed": seed,
                "score": max(v for _, v in curve), "curve": curve}  # fmt: skip

    recs = [rec("gru", 0, "t1", [[1, -0.5], [2, 0.5]]), rec("gru", 1, "t1", [[1, -0.3], [2, 0.1]]),
            rec("mlp", 0, "t1", [[1, -0.4], [2, -0.2]]), rec("gru", 0, "t2", [[1, 0.2], [2, 0.1]])]  # fmt: skip
    table = report.budget_table(recs, "ppo", ["t1", "t2", "t3"])
    assert "| t1 | -0.40 | 0.30 | +0.70 | -0.20 | 2 |" in table
    assert "| t2 | 0.20 | 0.20 | +0.00 | – | 1 |" in table
    assert "t3" not in table  # no reference run: no row
    report.write_report(records(), tmp_path, context())
    md = (tmp_path / "encoders_screening.md").read_text()
    assert "### Budget check: does gru learn each task in its budget?" in md
    assert "Budget check" not in md.split("## Offline")[1]
