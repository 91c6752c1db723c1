"""The generated findings: best IQM, CI overlap, better / worse than the reference, per-task leaders."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_transformers.study import summary


def row(iqm: float, low: float, high: float, p: float | None = None, p_low: float | None = None,
        p_high: float | None = None) -> dict:  # fmt: skip
    return {"iqm": iqm, "ci_low": low, "ci_high": high, "prob_improvement": p, "prob_ci_low": p_low,
            "prob_ci_high": p_high, "n_seeds": 3, "n_tasks": 2}  # fmt: skip


def test_aggregate_summary_names_the_best_its_overlaps_and_the_verdicts_against_the_reference() -> None:
    agg = {"reference": "gru", "encoders": {
        "gru": row(0.70, 0.60, 0.80),
        "a": row(0.90, 0.85, 0.95, 0.80, 0.60, 0.95),  # best; beats gru (CI above 0.5)
        "b": row(0.82, 0.75, 0.86, 0.55, 0.40, 0.70),  # overlaps a's CI (0.86 >= 0.85); not separated from gru
        "c": row(0.20, 0.10, 0.30, 0.10, 0.00, 0.30),  # worse than gru
        "d": row(0.84, 0.80, 0.849, 0.50, 0.45, 0.55),  # just misses a's CI (0.849 < 0.85)
    }}  # fmt: skip
    text = summary.aggregate_summary(agg)
    assert "Highest IQM: `a` 0.900 [0.850, 0.950] of 5 encoders" in text
    assert "CI overlapping it (1): `b`." in text
    assert "better 1 (`a`)" in text
    assert "worse 1;" in text
    assert "not separated 2 (`d`, `b`)" in text  # in IQM order


def test_aggregate_summary_without_the_reference_or_any_encoder() -> None:
    text = summary.aggregate_summary({"reference": "gru", "encoders": {"a": row(0.5, 0.4, 0.6)}})
    assert text.startswith("Highest IQM: `a`") and "gru" not in text
    assert summary.aggregate_summary({"reference": "gru", "encoders": {}}).startswith("No encoder")


def test_long_name_lists_are_cut() -> None:
    names = [f"e{i}" for i in range(summary.MAX_NAMES + 3)]
    assert summary._names(names).endswith("`e5` + 3 more")
    assert summary._names([]) == "none"


def test_task_leaders_lists_ties_at_two_decimals_and_skips_other_algos() -> None:
    recs = []
    for name, scores in (("gru", [1.0, 0.998]), ("lsh", [0.999, 1.0]), ("mlp", [0.5, 0.6])):
        recs += [{"algo": "ppo", "task": "t1", "encoder_name": name, "score": s} for s in scores]
    recs += [{"algo": "ppo", "task": "t2", "encoder_name": "mlp", "score": -0.2},
             {"algo": "ppo", "task": "t2", "encoder_name": "gru", "score": None},
             {"algo": "dt", "task": "t1", "encoder_name": "full", "score": 99.0}]  # fmt: skip
    text = summary.task_leaders(recs, "ppo", ["t1", "t2", "absent"])
    assert text == "Highest mean score per task: t1 1.00 (`gru`, `lsh`); t2 -0.20 (`mlp`)."
    assert summary.task_leaders(recs, "ppo", ["absent"]) == ""


def test_summary_agrees_with_rliable_in_the_report(tmp_path: Path) -> None:
    pytest.importorskip("rliable")
    from rl_transformers.study import report

    ctx = {"tasks": {"ppo": ["t1", "t2"]}, "task_notes": {t: ("tag", "b", "s") for t in ("t1", "t2")},
           "encoders": {"ppo": [("gru", "policy=gru", "baseline", ""), ("a", "attention=a", "attention", "")]},
           "excluded": {}, "expected": {"ppo": 12}, "preset": "quick", "command": "cmd", "reps": 200}  # fmt: skip
    recs = [{"algo": "ppo", "task": t, "encoder": "", "encoder_name": name, "seed": seed, "score": score + 0.01 * seed,
             "final_return": 0.0, "env_steps": 1, "steps_per_s": 1.0, "wall_s": 1.0, "parameters": 1,
             "curve": [[1, 0.0]], "preset": "quick"}
            for t in ("t1", "t2") for seed in range(3) for name, score in (("gru", 0.1), ("a", 0.8))]  # fmt: skip
    report.write_report(recs, tmp_path, ctx)
    md = (tmp_path / "encoders_screening.md").read_text()
    section = md.split("## Summary", 1)[1].split("## Method", 1)[0]
    # every run of `a` beats every run of gru: rliable's P(improvement) is 1 with its CI at 1
    assert "**Online (PPO)**, over 2 of 2 tasks: Highest IQM: `a`" in section
    assert "better 1 (`a`)" in section
    assert "t1 0.81 (`a`); t2 0.81 (`a`)" in section


def test_identical_runs_groups_encoders_equal_on_every_run_and_nothing_else() -> None:
    def rec(name: str, task: str, seed: int, score: float, curve: list, algo: str = "ppo") -> dict:
        return {"algo": algo, "task": task, "seed": seed, "encoder_name": name, "score": score,
                "final_return": score, "curve": curve}  # fmt: skip

    recs = []
    for name in ("full", "local", "bigbird", "short"):
        for task in ("t1", "t2"):
            for seed in (0, 1):
                curve = [[10, 0.1 * seed], [20, 0.5]]
                if name == "bigbird" and task == "t2" and seed == 1:
                    curve = [[10, 0.2], [20, 0.5]]  # same score, one evaluation differs: not identical
                if name == "short" and task == "t2" and seed == 1:
                    continue  # equal on every run it has, but one run fewer: not identical
                recs.append(rec(name, task, seed, 0.5, curve))
    recs.append(rec("gru", "t1", 0, 0.5, [[10, 0.0], [20, 0.5]], algo="dt"))  # other algo: ignored
    recs += [rec(name, "t3", 0, 0.5, []) for name in ("x", "y")]  # no curve: no evidence, left out
    text = summary.identical_runs(recs, "ppo", ["t1", "t2", "t3"])
    assert text.startswith("Equal runs (the same evaluation curve, bit for bit, on every task and seed")
    assert text.endswith("): `full` = `local` (4 runs).")
    # on t1 alone bigbird and short equal full too: the verdict is over the tasks asked for
    assert summary.identical_runs(recs, "ppo", ["t1"]).endswith(
        "): `bigbird` = `full` = `local` = `short` (2 runs)."
    )
    assert summary.identical_runs(recs, "dt", ["t1"]) == ""
    assert summary.identical_runs([], "ppo", ["t1"]) == ""
