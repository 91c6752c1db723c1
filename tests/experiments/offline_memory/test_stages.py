"""The offline memory table: its rows and jobs, and a tiny table run end to end through the
study's worker (real DT runs on a corridor-3 T-Maze), its documents, resume and restore."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from experiments.offline_memory import plan as omp
from experiments.offline_memory import report as offline_memory_report
from experiments.offline_memory import stages as offline_memory_run
from rl_transformers.study import offline_memory as om
from rl_transformers.study import records
from rl_transformers.study.encoders import parse_spec
from rl_transformers.study.flags import changed, configure
from rl_transformers.utils.errors import UserError

FULL = om.Row("full", "attention", "attention=full", "K = L + 1")
TINY_ROWS = [FULL, om.Row("xl", "memory", "attention=full"), om.Row("floor", "floor", "attention=full")]


@pytest.mark.parametrize("length", [1, 3, 10, 50, 200])
def test_segments_cover_the_episode_and_xl_memory_covers_the_window(length: int) -> None:
    """N segments of K_s steps hold the L + 1 steps, and one fewer do not (K_s is the smallest); the xl memory
    holds the N - 1 earlier segments' tokens, the window the one-pass exactness test needs."""
    k = om.segment_len(length)
    assert om.SEGMENTS * k >= length + 1 > om.SEGMENTS * (k - 1)
    assert om.memory_options("xl", length)["mem_len"] == 3 * k * (om.SEGMENTS - 1)
    with pytest.raises(ValueError, match="no options"):
        om.memory_options("lru", length)


def test_rows_give_each_family_its_context_and_memory() -> None:
    """Attention rows see the whole episode (K = L + 1, aligned windows, no memory); memory rows get K_s,
    3 segments and their memory; the floor gets K_s without memory; every row has backbone dropout 0."""
    length = 50
    attention = FULL.dt_args(length)
    assert attention["context_len"] == 51 and attention["window_starts"] == "aligned"
    assert "segments" not in attention and "memory" not in parse_spec(FULL.encoder(length).spec)
    for name in om.MEMORIES:
        row = om.Row(name, "memory", "attention=full")
        fields = parse_spec(row.encoder(length).spec)
        assert fields["memory"] == name and fields["memory_options"] == om.memory_options(name, length)
        assert row.dt_args(length)["segments"] == om.SEGMENTS
        assert row.dt_args(length)["context_len"] == om.segment_len(length) == 17
    floor = om.Row("floor", "floor", "attention=full")
    assert floor.dt_args(length)["segments"] == 1 and "memory" not in parse_spec(floor.encoder(length).spec)
    assert floor.dt_args(length)["context_len"] < length + 1
    for row in (FULL, floor):
        assert parse_spec(row.encoder(length).spec)["dropout"] == 0.0


def test_jobs_are_checkout_independent_and_bad_lengths_are_refused(tmp_path: Path) -> None:
    a = om.make_job(10, FULL, 0, tmp_path / "a")
    b = om.make_job(10, FULL, 0, tmp_path / "b")
    assert a.spec["key"] == b.spec["key"] and not Path(a.spec["dataset_root"]).is_absolute()
    assert a.spec["dataset"] == f"rlt/tmaze-10/{om.DATASET_NAME}" and a.spec["dt"]["context_len"] == 11
    assert a.dir == tmp_path / "a" / om.PRESET / "dt" / "TMaze10" / "full" / "s0"
    with pytest.raises(UserError, match="corridor length 7"):
        omp.plan(omp.OfflineMemoryConfig(lengths=(7,)), TINY_ROWS)
    with pytest.raises(UserError, match="unknown encoder 'fulll'"):
        omp.plan(omp.OfflineMemoryConfig(encoders=("fulll",)), TINY_ROWS)


@pytest.fixture
def tiny_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from offline_data.memory_build import MemoryBuildConfig, build_memory_datasets

    root = tmp_path / "minari"
    build_memory_datasets(
        MemoryBuildConfig(task="tmaze", memory_lengths=(3,), num_episodes=40, num_ref_episodes=2,
                          random_share=0.2, root=root, progress=False)
    )  # fmt: skip
    monkeypatch.setattr(om, "LENGTHS", (3,))
    monkeypatch.setattr(om, "SEEDS", (0,))
    monkeypatch.setattr(om, "BUDGET", {3: 8})
    monkeypatch.setattr(om, "RECIPE", {**om.RECIPE, "eval_episodes": 4, "eval_envs": 2, "batch_size": 4})
    monkeypatch.setattr(om, "DATASETS", str(root))
    monkeypatch.setattr(om, "rows", lambda match=True: list(TINY_ROWS))
    return tmp_path


def test_a_tiny_table_runs_resumes_and_rebuilds_from_its_records(tiny_table: Path) -> None:
    """Three real runs through the study's worker: records carry the success rate (the T-Maze's flag); the
    documents list every row; a dry run changes nothing; a fresh checkout (empty --out) restores the committed
    records and rebuilds the same documents byte for byte without running anything."""
    docs = tiny_table / "docs"
    cfg = configure(omp.OfflineMemoryConfig, lengths=(3,), seeds=(0,), out=tiny_table / "runs", docs=docs)
    lines: list[str] = []
    dry = offline_memory_run.run_offline_memory(changed(cfg, dry_run=True), lines.append)
    assert dry["todo"] == 3 and not (tiny_table / "runs").exists() and not docs.exists()
    assert offline_memory_run.run_offline_memory(cfg, lines.append)["records"] == 3
    published = json.loads((docs / "offline_memory.json").read_text())
    assert sorted(r["encoder_name"] for r in published) == ["floor", "full", "xl"]
    for r in published:
        assert 0.0 <= r["success"] <= 1.0 and r["updates"] == 8 and r["success_curve"][-1][1] == r["success"]
    markdown = (docs / "offline_memory.md").read_text()
    assert "| `xl` | memory |" in markdown and "| `floor` | floor |" in markdown
    assert (docs / "plots" / "offline_memory.png").stat().st_size > 0
    assert (
        offline_memory_run.run_offline_memory(cfg, lines.append)["records"] == 3
    )  # resume: nothing left to run
    assert "0 to run" in lines[-2]

    shutil.rmtree(tiny_table / "runs")  # a fresh checkout: the committed documents, no run directories
    offline_memory_run.run_offline_memory(cfg, lines.append)
    assert any("restored 3 finished runs" in line for line in lines)
    assert (docs / "offline_memory.md").read_text() == markdown
    assert json.loads((docs / "offline_memory.json").read_text()) == published
    assert not list((tiny_table / "runs").rglob("stdout.log"))  # restored, not run
    section = "\n".join(offline_memory_report.study_section(docs))  # encoders.md's offline part
    assert "| `xl` | memory |" in section and "### Control tasks" in section
    assert "found the cue at some evaluation" in section and "| row | L = 3 |" in section  # the found table


def test_a_record_that_contradicts_its_job_is_refused(tiny_table: Path) -> None:
    docs = tiny_table / "docs"
    docs.mkdir()
    job = om.make_job(3, FULL, 0, tiny_table / "runs")
    bad = {**{k: job.spec[k] for k in records.IDENTITY}, "key": job.spec["key"], "score": 1.0, "updates": 2}
    (docs / "offline_memory.json").write_text(json.dumps([bad]))
    cfg = configure(
        omp.OfflineMemoryConfig,
        lengths=(3,),
        seeds=(0,),
        out=tiny_table / "runs",
        docs=docs,
        report_only=True,
    )
    with pytest.raises(UserError, match="whole budget"):
        offline_memory_run.run_offline_memory(cfg, print)


@pytest.mark.parametrize(
    ("field", "value"), [("success", 1.5), ("success", float("nan")), ("success_curve", [[1]])]
)
def test_a_record_with_a_bad_success_field_is_no_result(tmp_path: Path, field: str, value: object) -> None:
    job = om.make_job(10, FULL, 0, tmp_path)
    good = {**{k: job.spec[k] for k in records.IDENTITY}, "key": job.spec["key"], "score": 1.0,
            "updates": job.spec["budget"], "success": 1.0, "success_curve": [[600, 1.0]]}  # fmt: skip
    assert records.problem(good, job.spec) is None
    assert field in str(records.problem({**good, field: value}, job.spec))


def test_memoryless_scores_count_the_evaluation_cues() -> None:
    """Always-north and always-south succeed on complementary shares of the evaluation episodes, counted here
    from the env's cue with the trainer's reset seeds."""
    import gymnasium as gym

    import envs  # noqa: F401

    north, south = offline_memory_report.memoryless_scores(20, seed=7)
    env = gym.make("rlt/TMaze-v0", corridor_length=5)
    cues = [float(env.reset(seed=7 + i)[0][0]) for i in range(20)]
    assert (
        north == cues.count(1.0) / 20
        and south == cues.count(-1.0) / 20
        and north + south == pytest.approx(1.0)
    )
    assert offline_memory_report.cell_text({"mean": 0.7, "success": [1.0, 0.4]}).endswith(
        "1/2 solved (2 of 3 seeds)"
    )


def test_found_counts_runs_that_reached_the_cue_at_any_evaluation_and_kept_it() -> None:
    """A run that hit 1.0 mid-training and fell back to a memoryless 0.44 found the cue but did not keep it; one
    that never left 0.56 did not find it (a memoryless policy cannot reach 0.9)."""
    lost = {"seed": 0, "success": 0.44, "success_curve": [[200, 0.44], [400, 1.0], [600, 0.92], [800, 0.44]]}
    kept = {"seed": 1, "success": 1.0, "success_curve": [[200, 0.56], [400, 0.56], [600, 0.9], [800, 1.0]]}
    never = {
        "seed": 2,
        "success": 0.56,
        "success_curve": [[200, 0.56], [400, 0.89], [600, 0.56], [800, 0.56]],
    }
    assert [offline_memory_report.first_found(r) for r in (lost, kept, never)] == [400.0, 600.0, None]
    entry = {
        "mean": 2.0 / 3,
        "success": [0.44, 1.0, 0.56],
        "first_found": [offline_memory_report.first_found(r) for r in (lost, kept, never)],
    }
    assert offline_memory_report.found_text(entry) == "2/3 · first at 500 · kept 1/2"
    assert offline_memory_report.found_text({**entry, "first_found": [None] * 3}) == "0/3"
    assert offline_memory_report.found_text({"success": []}) == "–"


def test_estimates_use_measured_runs_then_the_benchmark_scaled_then_the_assumption(tmp_path: Path) -> None:
    """A cell with a finished run uses its rate; one without uses the benchmark's rate times the median ratio of
    the same length's runs to their benchmark rates; a row the benchmark lacks, the length's median; budget /
    rate + 10 s each (hand-computed)."""
    floor = om.Row("floor", "floor", "attention=full")
    done = om.make_job(10, FULL, 0, tmp_path)
    done.dir.mkdir(parents=True)
    (done.dir / "result.json").write_text(
        json.dumps({"task": "TMaze10", "encoder_name": "full", "updates_per_s": 20.0})
    )
    bench = {("full", 10): 80.0, ("xl", 10): 40.0}
    jobs = [
        om.make_job(10, FULL, 1, tmp_path),
        om.make_job(10, TINY_ROWS[1], 0, tmp_path),
        om.make_job(10, floor, 0, tmp_path),
    ]
    budget = om.BUDGET[10]
    got = omp.estimates(jobs, tmp_path, bench)
    assert got == pytest.approx([budget / 20.0 + 10, budget / (40.0 * 0.25) + 10, budget / 20.0 + 10])
    assert omp.estimates([om.make_job(50, FULL, 0, tmp_path)], tmp_path, {}) == [
        om.BUDGET[50] / om.ASSUMED_UPDATES_PER_S[50] + 10
    ]
    assert omp.bench_rates(tmp_path / "missing.json") == {}
    assert omp.bench_rates()[("full", 200)] > 0  # the committed benchmark covers the table's rows
