"""docs/results/memory_tasks.md is rebuilt byte for byte from the committed records of experiments/memory_tasks/,
at another path too, and the records are what the page claims: ten seeds per arm, the transformer on its task's
shipped recipe, the recurrent arms parameter-matched to it, every run from a committed tree."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gymnasium as gym
import pytest

import envs  # noqa: F401  (registers the rlt/ ids)
from experiments.memory_tasks import report
from rl_transformers.algos import recipes

pytest.importorskip("rliable")

RECORDS = report.HERE / "records"


def records(task: str) -> list[dict]:
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted((RECORDS / task).glob("*/s*.json"))]


def task_entry(source: str) -> str:
    """The task's own entry that a recipe source names, without file and line ("rlt/X-v0/transformer"): the
    last of the entries joined by " + " (a default entry comes first)."""
    return source.split(" + ")[-1].split(" ", 1)[-1]


def shipped_recipe_problem(run: dict) -> str | None:
    """None when ``run`` trained on its task's entry and with every value of the recipe the shipped file now
    gives its task and policy (the default's values included, which runs made before the file had a default
    gave as flags), or on no recipe when the file has none; else what differs."""
    config = run["config"]
    recipe = recipes.find(run["env_id"], config["policy"]["kind"])
    if recipe is None:
        return None if config["recipe"] == "none" else f"recipe {config['recipe']}, but the file has none"
    if task_entry(config["recipe"]) != task_entry(recipe.source):
        return f"recipe {config['recipe']}, the file's is {recipe.source}"
    for key, value in recipe.values.items():
        node = config
        for part in recipes.config_path(key):
            node = node[part]
        if node != json.loads(json.dumps(value)):
            return f"{key} = {node!r}, the shipped recipe's is {value!r}"
    return None


def preamble() -> str:
    return (report.HERE / "preamble.md").read_text(encoding="utf-8")


def test_page_is_rebuilt_from_the_records_at_another_path(tmp_path: Path) -> None:
    assert report.render(RECORDS, preamble()) == report.PAGE.read_text(encoding="utf-8")
    shutil.copytree(RECORDS, tmp_path / "records")
    shutil.copytree(report.HERE / "tuning", tmp_path / "tuning")  # the Optuna studies' section
    assert report.render(tmp_path / "records", preamble()) == report.PAGE.read_text(encoding="utf-8")
    shutil.rmtree(tmp_path / "tuning")
    page = report.render(tmp_path / "records", preamble())
    assert "## Optuna tuning" not in page and "## Probe" not in page


def test_a_probe_is_a_table_of_its_seeds(tmp_path: Path) -> None:
    """Each long-corridor probe's records give its section: its budget, every seed's final score and the
    solved count."""
    sections = list(report.probe_sections(report.HERE / "tuning"))
    assert len(sections) == len(report.PROBES)
    for (name, title), section in zip(report.PROBES.items(), sections):
        runs = [
            json.loads(p.read_text()) for p in sorted((report.HERE / "tuning" / name).glob("gtrxl/s*.json"))
        ]
        assert len(runs) == 2  # tuning seeds 100 and 101, or the corridor-1,000 probe's 46 and 47
        for r in runs:  # the recoverable T-Maze at a corridor of 200 or more
            spec = gym.spec(r["env_id"])
            assert spec.kwargs["penalty_on"] == "action"
            assert {**spec.kwargs, **r["config"]["env_kwargs"]}["corridor_length"] >= 200
        (budget,) = {r["config"]["total_timesteps"] for r in runs}
        scores = " / ".join(f"{sum(r['returns']) / len(r['returns']):.2f}" for r in runs)
        solved = sum(sum(r["returns"]) / len(r["returns"]) >= report.SOLVED for r in runs)
        assert section.startswith(f"## {title}, {budget:,} env steps")
        assert f"| {scores} | {solved} of 2 |" in section and f"`tuning/{name}/`" in section
        staged = (report.HERE / "tuning" / name / "stage1").is_dir()  # a curriculum probe: its seeds' stages
        for r in runs:
            corridor = {**gym.spec(r["env_id"]).kwargs, **r["config"]["env_kwargs"]}["corridor_length"]
            row = f"| {r['total_timesteps']:,} | {round(r['total_timesteps'] / (corridor + 1)):,} |"
            assert (row in section) == staged
    assert not list(report.probe_sections(tmp_path))


def test_a_changed_score_changes_the_page(tmp_path: Path) -> None:
    shutil.copytree(RECORDS, tmp_path / "records")
    path = sorted((tmp_path / "records").glob("*/gtrxl/s*.json"))[0]
    record = json.loads(path.read_text(encoding="utf-8"))
    record["returns"] = [-0.5 for _ in record["returns"]]
    path.write_text(json.dumps(record), encoding="utf-8")
    assert report.render(tmp_path / "records", preamble()) != report.PAGE.read_text(encoding="utf-8")


@pytest.mark.parametrize("task", sorted(report.TASKS))
def test_records_are_what_the_page_claims(task: str) -> None:
    runs = records(task)
    if not runs:
        pytest.skip(f"no records for {task} yet")
    by_arm: dict[str, list[dict]] = {}
    for run in runs:
        by_arm.setdefault(run["arm"], []).append(run)
        assert not run["git_sha"].endswith("-dirty"), f"{task} {run['arm']} s{run['seed']}: uncommitted code"
        assert len(run["returns"]) == 50, "the final policy's 50 greedy episodes"
    gtrxl = by_arm["gtrxl"]
    assert all(run["config"]["recipe"].endswith(f"{run['env_id']}/transformer") for run in gtrxl)
    for run in runs:
        assert shipped_recipe_problem(run) is None, (
            f"{task} {run['arm']} s{run['seed']}: {shipped_recipe_problem(run)}"
        )
    page = report.render(RECORDS, preamble())
    for arm, runs_ in by_arm.items():
        if len({run["seed"] for run in runs_}) < report.SEEDS:  # a claim needs 10 seeds: the page says so
            assert f"`{arm}` {len(runs_)}" in page.split(report.TASKS[task], 1)[1].split("\n## ", 1)[0]
        assert {run["total_timesteps"] for run in runs_} == {gtrxl[0]["total_timesteps"]}, "equal budgets"
        assert {run["config"]["num_envs"] for run in runs_} == {gtrxl[0]["config"]["num_envs"]}, "equal envs"
        ratio = runs_[0]["parameters"] / gtrxl[0]["parameters"]
        assert 0.9 <= ratio <= 1.1, f"{task} {arm}: {ratio:.2f}x the transformer's parameters"


def test_readme_line_is_rebuilt_from_the_records() -> None:
    readme = (report.HERE.parents[1] / "README.md").read_text(encoding="utf-8")
    assert report.replace_block(readme, report.README_BLOCK, report.readme_line(RECORDS)) == readme


def test_a_curriculum_section_shows_each_seed_s_stages(tmp_path: Path) -> None:
    """A curriculum's records give its table and, per seed, the stage-1 policy's scores beside the final one."""
    folder = next(iter(report.CURRICULA))
    final = tmp_path / "records" / folder / "gtrxl"
    final.mkdir(parents=True)
    (final.parent / "stage1").mkdir()
    source = json.loads((RECORDS / "tmaze_alt_100" / "gtrxl" / "s30.json").read_text(encoding="utf-8"))
    for seed, score, zero_shot in ((7, 1.0, 0.4), (8, -0.25, 0.55)):
        record = source | {"seed": seed, "returns": [score] * 50}
        (final / f"s{seed}.json").write_text(json.dumps(record), encoding="utf-8")
        rows = {"100": {"trained_corridor": 100.0, "mean_return": 1.0, "p_cue": 0.99},
                "400": {"trained_corridor": 100.0, "mean_return": zero_shot, "p_cue": 0.5}}  # fmt: skip
        (final.parent / "stage1" / f"transfer_{seed}.json").write_text(json.dumps({"run/last.pt": rows}))
    page = report.render(tmp_path / "records", preamble())
    section = page.split(
        f"## {report.CURRICULA[folder]}, stage 2 {source['config']['total_timesteps']:,} env"
    )[1]
    assert "| 1.00 / -0.25 | 1 of 2 |" in section
    steps = f"{source['total_timesteps']:,}"
    decisions = f"{round(source['total_timesteps'] / 101):,}"  # corridor 100: an episode of 101 steps
    assert f"| 7 | 1.00 | 0.40 (0.50) | 1.00 | {steps} | {decisions} |" in section
    assert f"| 8 | 1.00 | 0.55 (0.50) | -0.25 | {steps} | {decisions} |" in section
    assert f"**Partial**: seeds finished of {report.SEEDS}: `gtrxl` 2." in section
    assert "TMaze400 by curriculum: gtrxl 1 of 2" in report.readme_line(tmp_path / "records")


@pytest.mark.parametrize("folder", sorted(report.CURRICULA))
def test_curriculum_records_are_what_the_page_claims(folder: str) -> None:
    """Ten seeds, each a committed run at corridor 400 from the final weights of its own seed's stage 1, which
    ran TMazeAltLong's shipped recipe (its config and its policy's scores kept beside the records)."""
    runs = records(folder)
    if not runs:
        pytest.skip(f"no records for {folder} yet")
    seeds = len({run["seed"] for run in runs})
    if seeds < report.SEEDS:  # a claim needs 10 seeds: the page says so
        page = report.render(RECORDS, preamble())
        assert f"`gtrxl` {seeds}" in page.split(report.CURRICULA[folder], 1)[1].split("\n## ", 1)[0]
    for run in runs:
        seed, config = run["seed"], run["config"]
        assert not run["git_sha"].endswith("-dirty") and len(run["returns"]) == 50
        spec_kwargs = {**gym.spec(run["env_id"]).kwargs, **config["env_kwargs"]}
        assert spec_kwargs["corridor_length"] == 400 and spec_kwargs["penalty_on"] == "action"
        assert f"/s{seed}/" in config["init_from"] and config["init_from"].endswith("/last.pt")
        stage1 = json.loads((RECORDS / folder / "stage1" / f"config_{seed}.json").read_text(encoding="utf-8"))
        assert (
            stage1["seed"] == seed
            and shipped_recipe_problem({"env_id": stage1["env_id"], "config": stage1}) is None
        )
        (rows,) = json.loads((RECORDS / folder / "stage1" / f"transfer_{seed}.json").read_text()).values()
        assert (
            rows["100"]["trained_corridor"] == 100
            and rows["100"]["step"] >= stage1["total_timesteps"] - 2**17
        )


def test_a_curriculum_stopped_at_a_target_says_its_budget_is_a_cap(tmp_path: Path) -> None:
    """Where ``--stop-at`` may end the last stage, its heading gives the budget as "at most" (the stage table
    gives each seed's steps)."""
    folder = "tmaze_alt_400_curriculum_stop"
    final = tmp_path / "records" / folder / "gtrxl"
    final.mkdir(parents=True)
    source = json.loads((RECORDS / "tmaze_alt_100" / "gtrxl" / "s30.json").read_text(encoding="utf-8"))
    budget = source["config"]["total_timesteps"]
    for stop_at in (None, 0.9):
        record = source | {"config": source["config"] | {"stop_at": stop_at}}
        (final / "s30.json").write_text(json.dumps(record), encoding="utf-8")
        page = report.render(tmp_path / "records", preamble())
        cap = "at most " if stop_at else ""
        assert f"## {report.CURRICULA[folder]}, stage 2 {cap}{budget:,} env steps\n" in page
    # beside the first curriculum, the README's line names only what this one adds to it
    (tmp_path / "records" / next(iter(report.CURRICULA)) / "gtrxl").mkdir(parents=True)
    shutil.copy(final / "s30.json", tmp_path / "records" / next(iter(report.CURRICULA)) / "gtrxl")
    line = report.readme_line(tmp_path / "records")
    assert line.endswith(" TMaze400 by curriculum: gtrxl 1 of 1; stopped at 0.9: gtrxl 1 of 1."), line
