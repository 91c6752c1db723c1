"""The confirmation stage's documents and decisions on hand-built records: the "did not separate" rule,
the normalized AUC, the random scores, the plateau and no-signal lines, the committed records against today's
plan, the candidate defaults and the ladder's stop rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.encoder_study import plan as cp
from experiments.encoder_study import report, stages
from rl_transformers.study.flags import configure
from rl_transformers.study.tuning_space import SearchSpace
from tests.experiments.encoder_study.test_stages import GRU, MLP, best
from tests.experiments.encoder_study.test_stages import (
    short_windows as short_windows,  # the windows of best()'s tuning results
)


def record(task: str, name: str, variant: str, seed: int, final: float, curve: list | None = None) -> dict:
    return {"task": task, "encoder_name": name, "preset": variant, "seed": seed, "final_return": final,
            "curve": curve if curve is not None else [[cp.rung(task).budget, final]]}  # fmt: skip


def test_tasks_where_every_encoder_is_at_random_or_at_the_max_do_not_separate(monkeypatch) -> None:
    monkeypatch.setattr(report, "REPS", 50)
    found = []
    for seed in (0, 1):
        found += [
            record("PositionOnlyCartPoleEasy", n, cp.UNTUNED, seed, 0.97 + 0.01 * seed) for n in ("a", "b")
        ]
        found += [
            record("RepeatPreviousMedium", n, cp.UNTUNED, seed, -0.48 - 0.02 * seed) for n in ("a", "b")
        ]
        found += [record("RepeatPreviousEasy", "a", cp.UNTUNED, seed, 1.0),
                  record("RepeatPreviousEasy", "b", cp.UNTUNED, seed, -0.5)]  # fmt: skip
    split = report.separation(found)
    assert "of the maximum 1" in str(split["PositionOnlyCartPoleEasy"])
    assert "of the random score -0.5" in str(split["RepeatPreviousMedium"])
    assert split["RepeatPreviousEasy"] is None and split["TMaze10"] is None  # separates / no record yet
    aggs = report.family_aggregates(found)
    assert aggs["RepeatPrevious"]["tasks"] == ["RepeatPreviousEasy"] and aggs["control"]["tasks"] == []
    assert aggs["RepeatPrevious"]["final"][f"a ({cp.UNTUNED})"][0] == 1.0
    assert aggs["RepeatPrevious"]["final"][f"b ({cp.UNTUNED})"][0] == 0.0
    # one cell moving away from the maximum makes the control separate
    found.append(record("PositionOnlyCartPoleEasy", "c", cp.UNTUNED, 0, 0.5))
    assert report.separation(found)["PositionOnlyCartPoleEasy"] is None
    # T-Maze: a memoryless policy scores 0.5 (on schedule, a coin-flip turn); nobody above it remembered nothing
    maze = [record("TMaze100", n, cp.UNTUNED, 0, v) for n, v in (("a", 0.5), ("b", 0.0), ("c", 0.54))]
    assert "best memoryless score 0.5" in str(report.separation(maze)["TMaze100"])
    maze.append(record("TMaze100", "d", cp.UNTUNED, 0, 0.9))
    assert report.separation(maze)["TMaze100"] is None
    assert cp.rung("RepeatPreviousHard").memoryless is None  # no better than random without memory


def test_a_rung_is_settled_once_complete_cells_separate_it_or_all_its_runs_finished() -> None:
    """Whether a rung separated is final before the study ends when cells with all their seeds already
    separate it (no other cell can pull them back into a band); a rung that looks unseparated is final only
    when every run is in. Checked against :func:`separation` of every way the missing runs could come out."""
    hard, per_rung = "RepeatPreviousHard", 6  # here: 2 cells x 3 seeds
    seeds = cp.SEEDS
    one_complete = [record(hard, "a", cp.UNTUNED, s, v) for s, v in zip(seeds, (0.0, 0.3, -0.5))]
    chance = [record(hard, "b", cp.UNTUNED, 0, -0.5)]
    assert report.settled_rungs(one_complete + chance, per_rung) == {hard}
    for rest in (-0.5, 1.0):  # however cell b's missing seeds score, the rung separated
        filled = chance + [record(hard, "b", cp.UNTUNED, s, rest) for s in seeds[1:]]
        assert report.separation(one_complete + filled)[hard] is None
    # a complete cell inside the random band settles nothing: cell b could still separate the rung or not
    at_chance = [record(hard, "a", cp.UNTUNED, s, -0.5) for s in seeds]
    assert report.settled_rungs(at_chance + chance, per_rung) == frozenset()
    assert (
        report.separation(at_chance + chance + [record(hard, "b", cp.UNTUNED, s, 1.0) for s in seeds[1:]])[
            hard
        ]
        is None
    )
    assert report.separation(
        at_chance + chance + [record(hard, "b", cp.UNTUNED, s, -0.5) for s in seeds[1:]]
    )[hard]
    # every run in: settled whichever way it went
    assert report.settled_rungs(
        at_chance + [record(hard, "b", cp.UNTUNED, s, -0.5) for s in seeds], per_rung
    ) == {hard}
    # incomplete cells alone settle nothing, however far they are from the bands
    assert report.settled_rungs([record(hard, "a", cp.UNTUNED, 0, 1.0), *chance], per_rung) == frozenset()


def test_the_documents_auc_is_the_closed_form_on_the_rungs_scale() -> None:
    """The curve starts at the random score at step 0 and holds its last value: RepeatPreviousEasy (random -0.5,
    max 1) at the max from half the budget on gives 0.5 * 1 / 2 + 0.5 * 1 = 0.75; T-Maze 10 halfway between
    random and max from a quarter of the budget on gives 0.25 * 0.5 / 2 + 0.75 * 0.5 = 0.4375."""
    easy = cp.rung("RepeatPreviousEasy")
    assert report.auc(record(easy.name, "a", cp.UNTUNED, 0, 1.0, [[easy.budget // 2, 1.0]])) == 0.75
    maze = cp.rung("TMaze10")
    half = (maze.low + maze.high) / 2
    got = report.auc(record(maze.name, "a", cp.UNTUNED, 0, half, [[maze.budget // 4, half]]))
    assert got == pytest.approx(0.4375)


@pytest.mark.parametrize(("env_id", "expected"), [
    ("rlt/popgym-RepeatPreviousEasy-v0", cp.RANDOM_REPEAT),
    ("rlt/popgym-PositionOnlyCartPoleEasy-v0", cp.RANDOM_CARTPOLE),
])  # fmt: skip
def test_the_random_scores_are_what_a_random_policy_gets(env_id: str, expected: float) -> None:
    import gymnasium as gym
    import numpy as np

    import envs  # noqa: F401

    env = gym.make(env_id)
    env.action_space.seed(123)
    returns = []
    for episode in range(150):
        env.reset(seed=10_000 + episode)
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    env.close()
    se = float(np.std(returns)) / np.sqrt(len(returns))
    assert abs(float(np.mean(returns)) - expected) < 4 * se + 0.005


def test_the_plateau_line_names_gru_and_the_best_tuned_encoder() -> None:
    """The plateau rule: the last quarter's gain of the mean evaluation, for GRU and the best tuned encoder."""
    r = cp.rung("RepeatPreviousEasy")
    b = r.budget
    found = [
        record(r.name, "gru", cp.UNTUNED, s, 0.52, [[b // 2, 0.0], [3 * b // 4, 0.5], [b, 0.52]])
        for s in (0, 1)
    ]
    found += [record(r.name, "x", cp.TUNED, 0, 0.6, [[3 * b // 4, 0.2], [b - 2048, 0.3], [b, 0.6]]),
              record(r.name, "y", cp.TUNED, 0, 0.1, [[3 * b // 4, 0.0], [b, 0.1]])]  # fmt: skip
    text = report.plateau_text(r, report.cells(found))
    assert "`gru` untuned +0.02;" in text and "`x` tuned +0.40 (still rising)" in text and "`y`" not in text
    assert report.last_quarter_gain(record(r.name, "z", cp.TUNED, 0, 0.1, [[b, 0.1]])) is None


def test_a_tuning_study_whose_best_trial_stayed_at_chance_is_marked_no_signal() -> None:
    """The tuning table flags an encoder whose best trial scored within SEPARATION of the tuning task's random
    score (nothing learned in any trial: its "tuned" parameters are a draw), and only that one."""
    low = cp.rung(cp.tuning_settings()["task"]).low
    tuned = {
        "gru": cp.tuned_config(GRU, {**best(GRU), "value": low + 0.3}, "gru.json"),
        "mlp": cp.tuned_config(
            MLP,
            {
                **best(MLP),
                "params": {"learning_rate": 1e-3, "ent_coef": 0.02, "seq_len": 4},
                "value": low + 0.04,
            },
            "mlp.json",
        ),
    }
    lines = report.tuning_lines([GRU, MLP], tuned)
    rows = {line.split("|")[1].strip(): line for line in lines if line.startswith("| `")}
    assert "no signal" in rows["`mlp`"] and "no signal" not in rows["`gru`"]
    note = [line for line in lines if line.startswith("**No signal**")]
    assert len(note) == 1 and "`mlp`" in note[0] and "`gru`" not in note[0]
    assert not report.no_tuning_signal(low + 0.06, low) and report.no_tuning_signal(low - 0.04, low)
    assert not report.no_tuning_signal(None, low)  # no score: nothing to judge
    lines = report.tuning_lines([GRU], {"gru": tuned["gru"]})
    assert not any(line.startswith("**No signal**") for line in lines)


def test_every_committed_confirmation_record_is_restored_by_the_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The committed docs/results/encoders.json against today's plan (with the committed tuning results): every
    record matches a job, so a fresh checkout resumes from all of them (a plan change that orphans a record
    fails here, not on the next machine)."""
    from rl_transformers.study import files, records

    monkeypatch.setattr(cp, "TUNING_SPACE", SearchSpace())  # the tuner's own space, as committed
    docs = Path(__file__).resolve().parents[3] / "docs" / "results"
    rows = cp.encoder_rows()
    tuned = cp.tuning_results(rows, docs / files.TUNING, tmp_path / "tune")
    assert all(isinstance(t, cp.Tuned) for t in tuned.values()), tuned
    jobs = cp.plan(cp.RUNGS, [*rows, *cp.CANDIDATES], cp.SEEDS, tuned, tmp_path / "runs")
    restored = records.restore(jobs, docs / files.RECORDS, dry_run=True)
    assert len(restored) == len(json.loads((docs / files.RECORDS).read_text())) > 0
    superseded = json.loads((docs / files.SUPERSEDED).read_text())["records"]
    assert not {r["key"] for r in superseded} & {j.spec["key"] for j in jobs}  # never the plan's


def test_candidate_defaults_run_untuned_only_and_are_reported_as_such(tmp_path: Path) -> None:
    """Candidate defaults: GTrXL with one setting changed (rope; a separate critic) on every rung, untuned only; their
    specs are what train_gtrxl.py would run with that flag."""
    from rl_transformers.study.encoders import policy_config

    names = [e.name for e in cp.CANDIDATES]
    assert names == ["gtrxl_rope", "gtrxl_critic"]
    assert policy_config(cp.CANDIDATES[0].spec).backbone.position == "rope"
    assert policy_config(cp.CANDIDATES[1].spec).critic == "separate"
    tuned = {"gru": cp.tuned_config(GRU, best(GRU), "gru.json")}
    jobs = cp.plan((cp.rung("TMaze10"),), [GRU, *cp.CANDIDATES], (0,), tuned, tmp_path)
    assert sorted((j.spec["encoder_name"], j.spec["preset"]) for j in jobs) == sorted(
        [("gru", cp.UNTUNED), ("gru", cp.TUNED)] + [(n, cp.UNTUNED) for n in names]
    )
    found = [record("TMaze10", n, cp.UNTUNED, 0, 1.0) for n in ("gru", *names)]
    page = report.markdown(found, [GRU], tuned, "cmd", report.family_aggregates(found, reps=50),
                                   candidates=cp.CANDIDATES)  # fmt: skip
    row = next(line for line in page.splitlines() if line.startswith("| `gtrxl_rope` | 1.00 (1/3) |"))
    assert row.count("untuned only") == 2  # final and AUC, tuned columns
    assert f"PARTIAL: 3 of {len(cp.RUNGS) * len(cp.SEEDS) * (2 + len(names))} runs" in page
    assert "**Candidate defaults**" in page and "`gtrxl_critic` (`critic=separate`)" in page
    assert "| `gtrxl_rope` | untuned |" in page and "| `gtrxl_rope` | tuned |" not in page  # the verdict


def test_the_ladder_stops_after_a_rung_that_did_not_separate_with_all_its_runs() -> None:
    """The probe's stop rule on the ladder: TMaze400 and RepeatPreviousHard are not run once the rung before
    them finished every planned run without separating; an unfinished rung stops nothing."""
    planned = {r.name: 2 for r in cp.RUNGS}
    walk = [record("TMaze100", n, cp.UNTUNED, 0, 0.0) for n in ("a", "b")]  # on schedule, never turns
    assert report.stopped_rungs(walk[:1], planned) == {}  # 1 of 2 runs: not yet
    stopped = report.stopped_rungs(walk, planned)
    assert list(stopped) == ["TMaze400"] and "TMaze100 (memory 100) did not separate" in stopped["TMaze400"]
    chance = [record("RepeatPreviousMedium", n, cp.UNTUNED, 0, -0.5) for n in ("a", "b")]
    assert list(report.stopped_rungs(chance, planned)) == ["RepeatPreviousHard"]
    learnt = [*walk[:1], record("TMaze100", "b", cp.UNTUNED, 0, 1.0)]
    assert report.stopped_rungs(learnt, planned) == {}
    walk = [
        record("TMaze100", "gru", v, seed, 0.0) for v in cp.VARIANTS for seed in cp.SEEDS
    ]  # all 6 planned
    page = report.markdown(walk, [GRU], {}, "cmd", report.family_aggregates(walk, reps=20))
    assert "### TMaze400 — **stopped** (TMaze100 (memory 100) did not separate with all its runs)" in page
    assert "memory 400: stopped (a shorter memory did not separate)" in page


def test_the_dry_run_says_what_the_stop_rule_would_save(tmp_path: Path) -> None:
    cfg = configure(stages.ConfirmConfig, out=tmp_path / "runs", docs=tmp_path / "docs", dry_run=True)
    tuned = {"gru": cp.tuned_config(GRU, best(GRU), "gru.json")}
    rungs = (cp.rung("RepeatPreviousMedium"), cp.rung("RepeatPreviousHard"))
    todo = cp.plan(rungs, [GRU], (0,), tuned, tmp_path / "runs")
    hard = [j for j in todo if j.spec["task"] == "RepeatPreviousHard"]
    lines: list[str] = []
    stages.dry_run_report(cfg, [GRU], tuned, todo, lines.append, frozenset({"RepeatPreviousEasy"}))
    saving = [line for line in lines if "stop rule" in line]
    want = sum(j.spec["budget"] / stages.ASSUMED_STEPS_PER_S + stages.START_S for j in hard) / 3600
    assert saving == [f"  (if RepeatPreviousMedium does not separate, the stop rule skips the longer rungs: "
                      f"-{want:.2f} core-hours)"]  # fmt: skip
    lines.clear()
    known = frozenset({"RepeatPreviousEasy", "RepeatPreviousMedium"})
    stages.dry_run_report(cfg, [GRU], tuned, todo, lines.append, known)
    assert not [line for line in lines if "stop rule" in line]  # it separates already: nothing to skip


def test_a_rung_without_runs_takes_the_rate_of_the_nearest_shorter_rung_it_ran() -> None:
    mine = {("RepeatPreviousEasy", "gru"): 3000.0, ("RepeatPreviousMedium", "gru"): 2000.0}
    measured = (mine, {"gru": 5000.0}, {"RepeatPreviousHard": 0.5, "TMaze400": 0.25})
    assert stages.rate_of("RepeatPreviousMedium", "gru", measured) == (2000.0, "measured")
    assert stages.rate_of("RepeatPreviousHard", "gru", measured) == (2000.0, "measured on a shorter rung")
    # no finished rung of that ladder (T-Maze), or of that encoder: the screening stage's rate x the task factor
    assert stages.rate_of("TMaze400", "gru", measured) == (1250.0, "screening")
    assert stages.rate_of("RepeatPreviousHard", "lstm", measured) == (stages.ASSUMED_STEPS_PER_S, "assumed")
