"""docs/results/offline_hopper.md is rebuilt byte for byte from the committed records of
experiments/offline_hopper/ (report.py), and the records are what the page claims: runs of the shipped recipe
from a committed tree, at least 5 seeds per arm. Until the records are committed those checks skip; the pure parts
(flags, the dirty-tree refusal, the verdict, the tables, the dataset statistics) are tested on made-up records."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from experiments import _driver
from experiments.offline_hopper import report, run

EXPERIMENT = Path(__file__).resolve().parents[2] / "experiments" / "offline_hopper"
PAGE = EXPERIMENT.parents[1] / "docs" / "results" / "offline_hopper.md"
RECORDS = sorted((EXPERIMENT / "records").glob("*/s*.json"))
needs_records = pytest.mark.skipif(
    not RECORDS, reason="no committed records yet: experiments/offline_hopper runs are being produced"
)


# -- the committed records and page ----------------------------------------------------------------------------
@needs_records
def test_page_is_rebuilt_from_the_records() -> None:
    assert report.render() == PAGE.read_text()


@needs_records
def test_records_are_runs_of_the_shipped_recipe_from_committed_code() -> None:
    recipe = json.loads((EXPERIMENT / "recipe.json").read_text())
    seeds: dict[str, set[int]] = {}
    for path in RECORDS:
        r = json.loads(path.read_text())
        assert path.parent.name == r["arm"] and path.name == f"s{r['seed']}.json"
        assert not r["dirty"] and len(r["commit"]) == 40
        assert r["settings"] == run.settings_of(r["arm"], r["seed"])
        assert r["settings"]["dataset"] == recipe["dataset"]
        assert r["step"] == recipe["common"]["total_steps"]
        assert r["episodes"] == recipe["common"]["eval_episodes"]
        seeds.setdefault(r["arm"], set()).add(r["seed"])
    assert set(seeds) == set(recipe["arms"])
    assert all(len(s) >= report.MIN_SEEDS for s in seeds.values()), seeds


@needs_records
def test_dataset_record_is_committed() -> None:
    dataset = json.loads((EXPERIMENT / "records" / "dataset.json").read_text())
    assert dataset["dataset"] == run.DATASET and dataset["build_command"] == run.DATASET_COMMAND


# -- run.py -------------------------------------------------------------------------------------------------------
def test_settings_give_the_reduced_scale_flags() -> None:
    dt = _driver.flags(run.settings_of("dt", 3))
    text = " ".join(dt)
    for part in (
        "--algo dt",
        "--dataset rlt/hopper/medium-replay-v0",
        "--backbone.d-model 64",
        "--backbone.n-layers 3",
        "--context-len 20",
        "--batch-size 64",
        "--learning-rate 0.0006",
        "--warmup-steps 500",
        "--total-steps 6000",
        "--eval-every 0",
        "--eval-episodes 100",
        "--eval-envs 50",
        "--log-every 250",
        "--target-returns 1400",
        "--seed 3",
    ):
        assert part in text, part
    bc = " ".join(_driver.flags(run.settings_of("bc", 0)))
    assert "--algo bc" in bc and "--target-returns" not in bc
    with pytest.raises(ValueError, match="unknown arm"):
        run.settings_of("cql", 0)


def args_for(tmp_path: Path, **extra: Any) -> argparse.Namespace:
    base = {"records": str(tmp_path / "records"), "runs": str(tmp_path / "runs"), "dataset_root": "x"}
    return argparse.Namespace(**(base | {"allow_dirty": False} | extra))


def test_a_dirty_tree_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_driver, "commit_state", lambda records: ("a" * 40, True))

    def no_training(*args: Any) -> None:
        raise AssertionError("trained from a dirty tree")

    monkeypatch.setattr(run, "train_dt", no_training)
    with pytest.raises(SystemExit, match="uncommitted changes"):
        run.run_one("dt", 0, args_for(tmp_path))
    assert not (tmp_path / "records" / "dt" / "s0.json").exists()


def test_a_run_writes_its_record_with_provenance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_driver, "commit_state", lambda records: ("c" * 40, False))
    monkeypatch.setattr(run, "train_dt", lambda *args: (tmp_path / "run", 12.34, []))
    final = {"step": 6000, "target": None, "episodes": 100, "mean_return": 444.1, "normalized_score": 14.3}
    monkeypatch.setattr(run, "final_evaluation", lambda run_dir: final)
    record = json.loads(run.run_one("bc", 3, args_for(tmp_path)).read_text())
    assert record["arm"] == "bc" and record["seed"] == 3 and record["settings"] == run.settings_of("bc", 3)
    assert {k: record[k] for k in final} == final
    assert (record["wall_s"], record["commit"], record["dirty"]) == (12.3, "c" * 40, False)
    assert record["command"].startswith("python scripts/train_dt.py --algo bc ") and record["machine"]
    assert not list((tmp_path / "records" / "bc").glob(".*.tmp")), "no temp file left beside the record"


def test_an_existing_record_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "records" / "bc" / "s1.json"
    path.parent.mkdir(parents=True)
    path.write_text("{}")
    monkeypatch.setattr(_driver, "commit_state", lambda records: pytest.fail("checked the tree"))
    assert run.run_one("bc", 1, args_for(tmp_path)) == path


def test_dataset_statistics() -> None:
    stats = run.describe([10.0, 30.0, -20.272305, 3234.3], 400, -20.272305, 3234.3)
    assert stats["episodes"] == 4 and stats["steps"] == 400
    assert stats["min_return"] == -20.2723 and stats["max_return"] == 3234.3
    assert stats["median_return"] == 20.0
    assert stats["normalized_mean"] == pytest.approx(25.6187, abs=1e-4)  # mean 813.5069


# -- report.py on made-up records -----------------------------------------------------------------------------------
def fake(records: Path, arm: str, scores: list[float], dirty: bool = False) -> None:
    for seed, score in enumerate(scores):
        path = records / arm / f"s{seed}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "arm": arm,
            "seed": seed,
            "normalized_score": score,
            "mean_return": score * 32.54572305 - 20.272305,
            "wall_s": 600.0,
            "commit": f"{arm[0]}" * 40,
            "dirty": dirty,
            "machine": "test cpu",
            "command": f"python scripts/train_dt.py --algo {arm}",
        }
        path.write_text(json.dumps(record))


def page(tmp_path: Path, dt: list[float], bc: list[float]) -> str:
    records = tmp_path / "records"
    fake(records, "dt", dt)
    fake(records, "bc", bc)
    preamble = tmp_path / "preamble.md"
    preamble.write_text("# made up\n")
    return report.render(records=records, preamble=preamble)


def test_cis_apart_is_met(tmp_path: Path) -> None:
    text = page(tmp_path, [40.0, 41.0, 42.0, 43.0, 44.0], [10.0, 11.0, 12.0, 13.0, 14.0])
    assert "**met**" in text and "not met" not in text
    assert "| DT (target 1,400) | 5 (0, 1, 2, 3, 4) | 40.0 / 41.0 / 42.0 / 43.0 / 44.0 |" in text
    assert "p = 0.00397" in text  # 1 / C(10, 5), the observed split is the most extreme
    assert report.render(records=tmp_path / "records", preamble=tmp_path / "preamble.md") == text


def test_overlapping_cis_are_not_met(tmp_path: Path) -> None:
    text = page(tmp_path, [5.0, 60.0, 10.0, 55.0, 12.0], [10.0, 11.0, 12.0, 13.0, 14.0])
    assert "**not met**" in text


def test_bc_ahead_is_not_met(tmp_path: Path) -> None:
    text = page(tmp_path, [10.0, 11.0, 12.0, 13.0, 14.0], [40.0, 41.0, 42.0, 43.0, 44.0])
    assert "**not met**" in text and "not above BC's" in text and "p ≥ 0.5" in text


def test_too_few_seeds_is_not_decided(tmp_path: Path) -> None:
    text = page(tmp_path, [40.0, 41.0, 42.0], [10.0, 11.0, 12.0])
    assert "**not decided**" in text and "DT 3, BC 3" in text


def test_the_verdict_reads_the_intervals() -> None:
    runs: dict[str, list[dict[str, Any]]] = {arm: [{}] * 5 for arm in report.ARMS}
    apart = {"dt": (30.0, 20.1, 40.0), "bc": (15.0, 10.0, 20.0)}
    touching = {"dt": (30.0, 20.0, 40.0), "bc": (15.0, 10.0, 20.0)}
    assert report.verdict(runs, apart).startswith("**met**")
    assert report.verdict(runs, touching).startswith("**not met**")


def test_the_one_sided_p_is_half_the_two_sided_for_equal_groups() -> None:
    p, relation = report.one_sided_p([3.0, 4.0, 5.0], [1.0, 2.0, 0.0])
    assert relation == "=" and p == pytest.approx(1 / 20)
    assert report.one_sided_p([3.0, 4.0, 5.0, 6.0], [1.0, 2.0])[1] == "≤"


def test_the_dataset_table(tmp_path: Path) -> None:
    records = tmp_path / "records"
    fake(records, "dt", [1.0])
    stats = run.describe([3.5, 283.6, 1342.1], 159821, -20.272305, 3234.3)
    (records / "dataset.json").write_text(
        json.dumps({"dataset": run.DATASET, **stats, "build_command": "make"})
    )
    preamble = tmp_path / "preamble.md"
    preamble.write_text("# made up\n")
    text = report.render(records=records, preamble=preamble)
    assert "| `rlt/hopper/medium-replay-v0` | 3 | 159,821 | 543.1 | 3.5 | 283.6 | 1,342.1 | 17.3 |" in text
    assert "OMP_NUM_THREADS=1 make" in text
    assert "| BC | 0 | – | – | – |" in text
