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

from rl_transformers.agents.offline_table import collect_runs, render_markdown, summarize, to_json
from rl_transformers.utils.atomic import atomic_write_json
from rl_transformers.utils.checkpoint import atomic_save
from rl_transformers.utils.errors import UserError
from rl_transformers.utils.provenance import record_invocation

ROOT = Path(__file__).resolve().parents[2]


def make_run(root: Path, algo: str, seed: int, returns: dict, *, refs=(0.0, 200.0), step=100) -> Path:
    """A run directory as the trainer writes it: config.json, eval/step_<n>.json, a checkpoint with refs."""
    run = root / algo / "ds" / f"r-s{seed}"
    atomic_write_json(run / "config.json", {"algo": algo, "dataset": "rlt/toy/medium-v0", "seed": seed})
    episodes = [{"target": t, "returns": list(r), "lengths": [10] * len(r)} for t, r in returns.items()]
    atomic_write_json(run / "eval" / f"step_{step}.json", {"step": step, "episodes": episodes})
    dataset = {"source": "toy", "env_id": None, "ref_min_score": refs[0], "ref_max_score": refs[1]}
    (run / "checkpoints").mkdir(parents=True)
    atomic_save({"dataset": dataset}, run / "checkpoints" / "last.pt")
    return run


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    # DT at targets 300 / 200 / 100: seeds 0 and 1 follow the targets, seed 2 swaps the two lowest
    dt = {
        0: {300.0: [150, 170], 200.0: [100, 120], 100.0: [50, 54]},
        1: {300.0: [190, 190], 200.0: [130, 110], 100.0: [40, 60]},
        2: {300.0: [160, 180], 200.0: [60, 60], 100.0: [80, 90]},
    }
    for seed, returns in dt.items():
        make_run(tmp_path, "dt", seed, returns)
    for seed, value in enumerate([70.0, 90.0, 80.0]):
        make_run(tmp_path, "bc", seed, {None: [value - 5, value + 5]})
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
    # seed means 173.3 / 96.7 / 62.3 follow the targets: 1.0; seed 2 ranks 100 above 200: 1 - 6*2/24 = 0.5
    assert rho["algo"] == "dt" and rho["mean"] == pytest.approx(1.0)
    assert rho["per_seed"] == pytest.approx({"0": 1.0, "1": 1.0, "2": 0.5})
    assert [r["seed"] for r in data["runs"]] == [0, 1, 2, 0, 1, 2] and json.dumps(data)


def test_markdown_names_every_seed_target_and_the_provenance(runs: Path, monkeypatch) -> None:
    from rl_transformers.utils import provenance

    monkeypatch.setattr(provenance, "git_sha", lambda: "0123456789abcdef")
    record_invocation(runs / "dt" / "ds" / "r-s0", "cpu", step=0)
    text = render_markdown(collect_runs([runs]), "python scripts/offline_table.py x")
    assert "| DT rlt/toy/medium-v0 | 300.0 | 160.0 | 190.0 | 170.0 | 173.3 ± 37.9 | 86.7 ± 19.0 |" in text
    assert "| BC rlt/toy/medium-v0 | — | 70.0 | 90.0 | 80.0 | 80.0 ± 24.8 | 40.0 ± 12.4 |" in text
    assert "**1.00** on the seed means; per seed 1.00 / 1.00 / 0.50" in text
    assert "commit `0123456`" in text and "5 of 6 runs predate system_info.json" in text
    assert "100 episodes" not in text and "2 episodes per target" in text


def test_user_errors_name_the_problem(runs: Path, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no evaluation at step 7; it has steps \\[100\\]"):
        collect_runs([runs], step=7)
    with pytest.raises(UserError, match="no such run directory"):
        collect_runs([tmp_path / "missing"])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UserError, match="no DT / BC run"):
        collect_runs([empty])
    twin = make_run(tmp_path / "again", "bc", 1, {None: [1.0]})  # under ``runs`` too (same tmp_path)
    with pytest.raises(UserError, match="two bc runs of rlt/toy/medium-v0 with seed 1") as err:
        collect_runs([runs])
    assert str(twin) in str(err.value) and str(runs / "bc" / "ds" / "r-s1") in str(err.value)


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
