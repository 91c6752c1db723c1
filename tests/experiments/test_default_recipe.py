"""docs/results/default_recipe.md is rebuilt byte for byte from the committed records it names, at another path
too; the records are what the page claims (two arms of a task differ in the settings the page names alone, on
the reference arm's seeds, budget and envs, from committed code); an arm that ran a seed its reference never ran
is refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from experiments.default_recipe import report

pytest.importorskip("rliable")

BOOKKEEPING = {"seed", "run_root", "recipe"}
"""Config keys that two runs of one comparison may differ in besides the task's change."""


def preamble() -> str:
    return (report.HERE / "preamble.md").read_text(encoding="utf-8")


def copy_records(to: Path) -> Path:
    """The arm folders the page reads, copied under ``to`` as they sit under experiments/."""
    for task in report.TASKS.values():
        for folder in task.arms.values():
            if (report.EXPERIMENTS / folder).exists():
                shutil.copytree(report.EXPERIMENTS / folder, to / folder, dirs_exist_ok=True)
    return to


def flat(config: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in config.items():
        out |= flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value}
    return out


def test_page_is_rebuilt_from_the_records_at_another_path(tmp_path: Path) -> None:
    page = report.PAGE.read_text(encoding="utf-8")
    assert report.render(report.EXPERIMENTS, preamble()) == page
    assert report.render(copy_records(tmp_path / "experiments"), preamble()) == page


def test_a_changed_score_changes_the_page(tmp_path: Path) -> None:
    experiments = copy_records(tmp_path / "experiments")
    path = sorted((experiments / report.TASKS["rp_hard"].arms["union"]).glob("s*.json"))[0]
    record = json.loads(path.read_text(encoding="utf-8"))
    record["returns"] = [0.0 for _ in record["returns"]]
    path.write_text(json.dumps(record), encoding="utf-8")
    assert report.render(experiments, preamble()) != report.PAGE.read_text(encoding="utf-8")


def test_a_seed_the_reference_never_ran_is_refused(tmp_path: Path) -> None:
    experiments = copy_records(tmp_path / "experiments")
    folder = experiments / report.TASKS["cartpole_novel"].arms["default"]
    record = json.loads(sorted(folder.glob("s*.json"))[0].read_text(encoding="utf-8"))
    record["seed"] = 999
    (folder / "s999.json").write_text(json.dumps(record), encoding="utf-8")
    with pytest.raises(ValueError, match=r"seeds \[999\] are not the entry arm's seeds"):
        report.render(experiments, preamble())


def test_every_compared_task_has_ten_seeds_per_arm() -> None:
    for part in report.SECTIONS[:-1]:  # the screen excepted: tuning seeds, as time allowed
        for key, task in part.tasks.items():
            runs = report.task_runs(report.EXPERIMENTS, task)
            assert set(runs) == set(task.arms), f"{key}: an arm has no records"
            assert all(len(rs) == report.SEEDS for rs in runs.values()), key


@pytest.mark.parametrize("key", sorted(k for k, t in report.TASKS.items() if len(t.arms) > 1))
def test_two_arms_differ_in_the_named_change_alone(key: str) -> None:
    task = report.TASKS[key]
    runs = report.task_runs(report.EXPERIMENTS, task)
    first, second = list(task.arms)[:2]
    reference = {int(r["seed"]): r for r in runs[first]}
    for run in runs[second]:
        other, where = reference.get(int(run["seed"])), f"{key} {second} s{run['seed']}"
        assert not run["git_sha"].endswith("-dirty") and run["git_sha"] != "?", f"{where}: uncommitted code"
        assert len(run["returns"]) == 50, f"{where}: 50 greedy episodes"
        if other is None:  # a screen arm that ran more seeds than its reference
            continue
        assert run["env_id"] == other["env_id"] and run["total_timesteps"] == other["total_timesteps"], where
        mine, theirs = flat(run["config"]), flat(other["config"])
        assert {k: mine[k] for k in task.change} == task.change, where
        assert any(theirs.get(k) != v for k, v in task.change.items()), (
            f"{where}: the reference has the change"
        )
        differ = {k for k in mine.keys() & theirs.keys() if mine[k] != theirs[k]}
        allowed = (
            BOOKKEEPING | set(task.change) | {k for k in differ if k.startswith("policy.backbone.position_")}
        )
        assert differ <= allowed, f"{where}: {sorted(differ - allowed)} differ from the {first} run"
