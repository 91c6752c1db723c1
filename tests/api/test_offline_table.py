"""``agents.offline_table`` / ``scripts/offline_table.py``: the offline results table, from run directories.

Hand-built runs with known returns are checked against numpy / ``scipy.stats.t.interval`` and hand-ranked
Spearman values; a real DT run goes through the same code end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from rl_transformers.agents.offline_runs import collect_runs
from rl_transformers.agents.offline_table import render_markdown, summarize, to_json
from rl_transformers.runs.provenance import record_invocation
from tests.api.conftest import make_offline_run

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    # DT at targets 300 / 200 / 100: seeds 0 and 1 follow the targets, seed 2 swaps the two lowest
    dt = {
        0: {300.0: [150, 170], 200.0: [100, 120], 100.0: [50, 54]},
        1: {300.0: [190, 190], 200.0: [130, 110], 100.0: [40, 60]},
        2: {300.0: [160, 180], 200.0: [60, 60], 100.0: [80, 90]},
    }
    for seed, returns in dt.items():
        make_offline_run(tmp_path, "dt", seed, returns)
    for seed, value in enumerate([70.0, 90.0, 80.0]):
        make_offline_run(tmp_path, "bc", seed, {None: [value - 5, value + 5]})
    return tmp_path


def test_rows_match_numpy_and_scipy(runs: Path) -> None:
    rows = {(r.algo, r.target): r for r in summarize(collect_runs([runs]))}
    assert set(rows) == {("dt", 300.0), ("dt", 200.0), ("dt", 100.0), ("bc", None)}
    seed_means = [160.0, 190.0, 170.0]
    row = rows[("dt", 300.0)]
    assert row.per_seed == dict(enumerate(seed_means))
    low, high = stats.t.interval(0.95, 2, loc=np.mean(seed_means), scale=stats.sem(seed_means))
    assert row.mean == pytest.approx(np.mean(seed_means)) and row.ci == pytest.approx((high - low) / 2)
    assert row.normalized == pytest.approx(100 * row.mean / 200) and row.normalized_ci == pytest.approx(
        row.ci / 2
    )
    assert rows[("bc", None)].per_seed == {0: 70.0, 1: 90.0, 2: 80.0}


def test_spearman_on_seed_means_and_per_seed(runs: Path) -> None:
    data = to_json(collect_runs([runs]))
    (rho,) = data["spearman"]
    assert rho["variant"] == ""
    # seed means 173.3 / 96.7 / 62.3 follow the targets: 1.0; seed 2 ranks 100 above 200: 1 - 6*2/24 = 0.5
    assert rho["algo"] == "dt" and rho["mean"] == pytest.approx(1.0)
    assert rho["per_seed"] == pytest.approx({"0": 1.0, "1": 1.0, "2": 0.5})
    assert [r["seed"] for r in data["runs"]] == [0, 1, 2, 0, 1, 2] and json.dumps(data, allow_nan=False)


def test_undefined_spearman_is_said_not_printed_as_nan(tmp_path: Path) -> None:
    for seed in (0, 1):
        make_offline_run(tmp_path, "dt", seed, {3.0: [5.0], 2.0: [5.0], 1.0: [5.0]})  # flat: rho undefined
    runs = collect_runs([tmp_path])
    assert "**undefined** on the seed means; per seed undefined / undefined" in render_markdown(runs)
    assert to_json(runs)["spearman"][0]["mean"] is None


def test_variants_get_rows_of_their_own(tmp_path: Path) -> None:
    for seed in (0, 1):
        make_offline_run(tmp_path, "bc", seed, {None: [10.0 + seed]}, bc_top_fraction=1.0)
        make_offline_run(
            tmp_path,
            "bc",
            seed,
            {None: [50.0 + seed]},
            bc_top_fraction=0.1,
            name=f"top-s{seed}",
            threads=4,
            run_root="elsewhere",
        )  # fmt: skip  (not experiment settings)
    rows = summarize(collect_runs([tmp_path]))
    assert [(r.variant, r.per_seed) for r in rows] == [
        ("bc_top_fraction=0.1", {0: 50.0, 1: 51.0}),
        ("bc_top_fraction=1.0", {0: 10.0, 1: 11.0}),
    ]
    assert "| BC rlt/toy/medium-v0 (bc_top_fraction=0.1) | — | 50.0 | 51.0 |" in render_markdown(
        collect_runs([tmp_path])
    )


def test_a_seed_without_checkpoint_takes_the_experiment_references(tmp_path: Path) -> None:
    make_offline_run(tmp_path, "bc", 0, {None: [100.0]})
    make_offline_run(tmp_path, "bc", 1, {None: [60.0]}, refs=None)
    (row,) = summarize(collect_runs([tmp_path]))
    assert row.normalized == pytest.approx(40.0)  # 80 on the (0, 200) scale of seed 0's checkpoint


def test_markdown_names_every_seed_target_and_the_provenance(runs: Path, monkeypatch) -> None:
    from rl_transformers.runs import provenance

    monkeypatch.setattr(provenance, "git_sha", lambda: "0123456789abcdef")
    record_invocation(runs / "dt" / "ds" / "r-s0", "cpu", step=0)
    text = render_markdown(collect_runs([runs]), "python scripts/offline_table.py x")
    assert "| DT rlt/toy/medium-v0 | 300.0 | 160.0 | 190.0 | 170.0 | 173.3 ± 37.9 | 86.7 ± 19.0 |" in text
    assert "| BC rlt/toy/medium-v0 | — | 70.0 | 90.0 | 80.0 | 80.0 ± 24.8 | 40.0 ± 12.4 |" in text
    assert "**1.00** on the seed means; per seed 1.00 / 1.00 / 0.50" in text
    assert "commit `0123456`" in text and "5 of 6 runs predate system_info.json" in text
    assert "100 episodes" not in text and "2 episodes per target" in text


def test_script_writes_what_it_prints_and_fails_cleanly(runs: Path, tmp_path: Path) -> None:
    script = [sys.executable, str(ROOT / "scripts" / "offline_table.py")]
    out_md, out_json = tmp_path / "t.md", tmp_path / "t.json"
    done = subprocess.run(
        [*script, str(runs), "--output", str(out_md), "--json", str(out_json)],
        capture_output=True, text=True, cwd=ROOT, check=True,
    )  # fmt: skip
    assert done.stdout == out_md.read_text() and "--output" in done.stdout  # the command is in the table
    assert len(json.loads(out_json.read_text())["rows"]) == 4
    bad = subprocess.run([*script, str(runs), "--step", "-1"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "step (--step)" in bad.stderr and "Traceback" not in bad.stderr


def test_a_real_dt_run_round_trips(dt_run) -> None:
    (run,) = collect_runs([dt_run.run_dir])
    episodes = json.loads((dt_run.run_dir / "eval" / f"step_{run.step}.json").read_text())["episodes"]
    rows = summarize([run])
    assert [r.target for r in rows] == [40.0, 10.0]
    assert [r.per_seed[run.seed] for r in rows] == pytest.approx([np.mean(e["returns"]) for e in episodes])
    assert run.invocations and run.invocations[0]["start_step"] == 0  # the trainer recorded its provenance
    assert "predate" not in render_markdown([run])
