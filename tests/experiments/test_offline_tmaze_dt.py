"""docs/results/offline_tmaze_dt.md is rebuilt byte for byte from the committed records of
experiments/offline_tmaze_dt/ (report.py), and the records are what the page claims: runs of the shipped recipe
from a committed tree, each final value the last point of its curve."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from types import ModuleType

EXPERIMENT = Path(__file__).resolve().parents[2] / "experiments" / "offline_tmaze_dt"
PAGE = EXPERIMENT.parents[1] / "docs" / "results" / "offline_tmaze_dt.md"


def report() -> ModuleType:
    spec = importlib.util.spec_from_file_location("offline_tmaze_dt_report", EXPERIMENT / "report.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def records() -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((EXPERIMENT / "records").glob("L*/s*.json"))]


def test_page_is_rebuilt_from_the_records() -> None:
    assert report().render() == PAGE.read_text()


def test_a_changed_record_changes_the_page(tmp_path: Path) -> None:
    copy = tmp_path / "records"
    shutil.copytree(EXPERIMENT / "records", copy)
    path = sorted(copy.glob("L*/s*.json"))[0]
    record = json.loads(path.read_text())
    record["final_success"] = 0.44 if record["final_success"] >= 0.9 else 1.0
    path.write_text(json.dumps(record))
    assert report().render(records=copy) != PAGE.read_text()


def test_records_are_runs_of_the_shipped_recipe_from_committed_code() -> None:
    recipe = json.loads((EXPERIMENT / "recipe.json").read_text())
    found = records()
    assert found
    for r in found:
        settings = r["settings"]
        assert not r["dirty"] and len(r["commit"]) == 40
        assert r["seed"] in recipe["test_seeds"][str(r["corridor"])], "a test seed of its corridor"
        assert settings["context_len"] == r["corridor"] + 1  # the whole episode in context
        assert settings["total_steps"] == recipe["budget"][str(r["corridor"])]
        assert {k: settings[k] for k in recipe["dt"]} == recipe["dt"]
        backbone = {
            **recipe["backbone"],
            **recipe.get("backbone_by_corridor", {}).get(str(r["corridor"]), {}),
        }
        assert {k: settings[f"backbone.{k}"] for k in backbone} == backbone
        assert r["curve"][-1]["step"] == settings["total_steps"]
        assert r["final_success"] == r["curve"][-1]["success"]
        assert r["final_return"] == r["curve"][-1]["return"]


def test_a_corridor_backbone_field_names_a_corridor_and_a_backbone_field() -> None:
    recipe = json.loads((EXPERIMENT / "recipe.json").read_text())
    for corridor, fields in recipe.get("backbone_by_corridor", {}).items():
        assert corridor in recipe["budget"], corridor
        assert set(fields) <= set(recipe["backbone"]), fields


def test_solved_counts_on_the_page_match_the_records() -> None:
    text = PAGE.read_text()
    by_corridor: dict[int, list[float]] = {}
    for r in records():
        by_corridor.setdefault(r["corridor"], []).append(r["final_success"])
    for length, finals in by_corridor.items():
        solved = sum(x >= 0.9 for x in finals)
        assert f"| {length} | {length + 1} ({3 * (length + 1)}) |" in text
        row = next(line for line in text.splitlines() if line.startswith(f"| {length} | {length + 1} ("))
        assert f"**{solved} / {len(finals)}**" in row


def test_a_resumed_record_is_named_on_the_page(tmp_path: Path) -> None:
    copy = tmp_path / "records"
    shutil.copytree(EXPERIMENT / "records", copy)
    path = sorted(copy.glob("L*/s*.json"))[0]
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "resumed_at": [400]}))
    page = report().render(records=copy)
    assert (
        f"- resumed from a checkpoint after a stop: L{record['corridor']} seed {record['seed']} at [400]"
        in page
    )


def test_the_median_wall_time_leaves_out_resumed_runs(tmp_path: Path) -> None:
    """A resumed run's wall time is its last stretch's: the Result table's median is of the others alone."""
    copy = tmp_path / "records"
    (copy / "L10").mkdir(parents=True)
    record = {**records()[0], "corridor": 10}
    for seed, wall, resumed in ((0, 10.0, None), (1, 30.0, None), (2, 1.0, [400]), (3, 2.0, [200])):
        extra = {"resumed_at": resumed} if resumed else {}
        (copy / "L10" / f"s{seed}.json").write_text(
            json.dumps({**record, "seed": seed, "wall_s": wall, **extra})
        )
    row = next(line for line in report().render(records=copy).splitlines() if line.startswith("| 10 | 11 ("))
    assert row.endswith("| 20 |")  # the median of 10 and 30; with the resumed 1 and 2 it would be 6
    for path in (copy / "L10").glob("s*.json"):
        if json.loads(path.read_text()).get("resumed_at"):
            continue
        path.unlink()
    row = next(line for line in report().render(records=copy).splitlines() if line.startswith("| 10 | 11 ("))
    assert row.endswith("| – |")


def test_the_failure_rates_are_compared_by_fisher_exact(tmp_path: Path) -> None:
    """3 of 10 runs ending at chance against 0 of 10: the one-sided p is the hypergeometric chance that all 3 misses fall in the second
    group, C(17, 10) / C(20, 10), computed here by hand."""
    from math import comb

    module = report()
    name, against, length = module.COMPARISONS[0]
    record = {**records()[0], "corridor": length}
    at_chance = [{**p, "success": 0.56} for p in record["curve"]]
    solved = [{**p, "success": 1.0} for p in record["curve"]]
    for folder, misses in ((name, 0), (against, 3)):
        (tmp_path / folder / f"L{length}").mkdir(parents=True)
        for seed in range(10):
            curve = at_chance if seed < misses else solved
            fields = {"seed": seed, "curve": curve, "final_success": curve[-1]["success"]}
            (tmp_path / folder / f"L{length}" / f"s{seed}.json").write_text(json.dumps({**record, **fields}))
    (line,) = module.comparison_lines(module.load_folders(tmp_path))
    assert f"ends below 0.9 in 0 of 10 runs, `{against}` in 3 of 10" in line
    assert f"p = {comb(17, 10) / comb(20, 10):.3f}" in line
    counts = "\n".join(module.count_rows(module.load_folders(tmp_path)))
    assert f"| `{against}` | {length} | 10 | 0-9 | 7 | 7 | 3 (0-2) |" in counts


def test_seed_ranges_are_written_as_spans() -> None:
    assert report().seed_ranges([105, 100, 101, 102, 200]) == "100-102, 105, 200"
