"""The long-context DT benchmark (benchmarks/studies/dt_long.py) on a tiny T-Maze
(corridor 3) built here: every (row, K) gets positive numbers, the ratios are paired by round, the saved-bytes
meter matches hand-counted autograd graphs, and bad inputs are one-line errors. Timings are never asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.studies import dt_long
from rl_transformers.study import offline_memory as om
from rl_transformers.study.encoders import dt_backbone
from rl_transformers.utils.errors import UserError

ROOT = Path(__file__).resolve().parents[3]
L = 3
TINY = [
    om.Row("floor", "floor", "attention=full"),
    om.Row("full", "attention", "attention=full", "K = L + 1"),
    om.Row("xl", "memory", "attention=full"),
]
EXPECTED = {"full": (L + 1, 1), "xl": (-(-(L + 1) // 3), 3), "floor": (-(-(L + 1) // 3), 1)}
"""(K, segments) of each row, from the table's definition: K = L + 1, or K_s = ceil((L + 1) / 3)."""


@pytest.fixture(scope="module")
def minari(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from offline_data.memory_build import MemoryBuildConfig, build_memory_datasets

    root = tmp_path_factory.mktemp("minari")
    build_memory_datasets(
        MemoryBuildConfig(task="tmaze", memory_lengths=(L,), num_episodes=40, num_ref_episodes=2,
                          random_share=0.2, root=root, progress=False)
    )  # fmt: skip
    return root


@pytest.fixture(scope="module")
def report(minari: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("out")
    cfg = dt_long.DTLongConfig(
        lengths=(L,), rounds=2, updates=2, warmup=1, dataset_root=minari, out=out, rss_timeout_s=120.0
    )
    lines: list[str] = []
    result = dt_long.run_bench(cfg, "python benchmarks/bench_dt_long_context.py (test)", TINY, lines.append)
    result["lines"] = lines
    result["written"] = json.loads((out / "results.json").read_text())
    result["markdown"] = (out / "results.md").read_text()
    return result


def test_every_row_and_k_gets_positive_numbers(report: dict) -> None:
    found = {(r["row"], r["K"], r["segments"]) for r in report["results"]}
    assert found == {(name, k, n) for name, (k, n) in EXPECTED.items()}
    for r in report["results"]:
        for key in (
            "cpu_updates_per_s",
            "wall_updates_per_s",
            "saved_bytes",
            "peak_saved_bytes",
            "n_parameters",
        ):
            assert r[key] > 0, (r["row"], key)
        assert r["rss_peak_bytes"] > 0 and "rss_error" not in r, r
        assert len(r["cpu_rounds_s"]) == len(r["wall_rounds_s"]) == 2 and r["updates_per_round"] == 2
        assert r["peak_saved_bytes"] <= r["saved_bytes"]
    assert report["written"]["results"] == report["results"] and report["written"]["complete"]
    assert "incomplete" not in report["markdown"]
    assert report["written"]["machine"]["git_sha"] and report["written"]["command"].startswith(
        "python benchmarks/"
    )
    for name in EXPECTED:
        k, n = EXPECTED[name]
        assert f"| {name} | {k} | {n} | {3 * k * n} |" in report["markdown"]
    for name in EXPECTED:  # a progress line per row: saved bytes, speed, RSS
        assert sum(line.startswith(f"TMaze{L} {name}:") for line in report["lines"]) == 3


def test_ratios_are_paired_with_full_in_the_same_rounds(report: dict) -> None:
    by_row = {r["row"]: r for r in report["results"]}
    assert by_row["full"]["speed_vs_full_cpu"] == by_row["full"]["speed_vs_full_wall"] == 1.0
    assert report["results"][0]["row"] == "full"  # the reference is built and listed first
    # The rule itself, on rounds whose answer is known: updates/s = steps / s (median), ratio = full's s / s.
    seconds = {"full": {"cpu": [1.0, 2.0, 3.0], "wall": [1.0, 1.0, 1.0]},
               "x": {"cpu": [2.0, 2.0, 6.0], "wall": [4.0, 4.0, 0.5]}}  # fmt: skip
    rates = dt_long.rates(seconds, "x", steps=4)
    assert rates["cpu_updates_per_s"] == 2.0 and rates["speed_vs_full_cpu"] == 0.5  # median(0.5, 1, 0.5)
    assert rates["wall_updates_per_s"] == 1.0 and rates["speed_vs_full_wall"] == 0.25  # median(.25, .25, 2)


def test_saved_bytes_grow_with_k_and_segments_free_their_activations(report: dict) -> None:
    """``floor`` is ``full`` with a shorter K (2 steps instead of the corridor's 4): fewer saved bytes. A
    segmented update frees each segment's activations at its backward, so the most alive is below the sum."""
    by_row = {r["row"]: r for r in report["results"]}
    assert by_row["full"]["saved_bytes"] > 1.3 * by_row["floor"]["saved_bytes"]
    assert by_row["xl"]["peak_saved_bytes"] < 0.6 * by_row["xl"]["saved_bytes"]


def test_saved_bytes_meter_counts_hand_made_graphs() -> None:
    x = torch.randn(10, 20, requires_grad=True)  # exp saves its result: 10 * 20 * 4 bytes

    def one() -> None:
        x.exp().sum().backward()

    def two_in_turn() -> None:
        one()
        one()

    def two_at_once() -> None:
        (x.exp().sum() + x.exp().sum()).backward()

    assert dt_long.saved_bytes(one) == {"saved_bytes": 800, "peak_saved_bytes": 800}
    assert dt_long.saved_bytes(two_in_turn) == {"saved_bytes": 1600, "peak_saved_bytes": 800}
    assert dt_long.saved_bytes(two_at_once) == {"saved_bytes": 1600, "peak_saved_bytes": 1600}


def test_trainer_config_is_the_tables_job(minari: Path, tmp_path: Path) -> None:
    cfg = dt_long.DTLongConfig(dataset_root=minari)
    for row in TINY:
        config = dt_long.trainer_config(row, 200, cfg, tmp_path)
        args = row.dt_args(200)
        assert config.context_len == args["context_len"] and config.segments == args.get("segments", 1)
        assert config.batch_size == om.RECIPE["batch_size"] and config.window_starts == "aligned"
        assert config.backbone == dt_backbone(row.encoder(200).spec) and config.eval_episodes == 0
        assert config.dataset == f"rlt/tmaze-200/{om.DATASET_NAME}"


def test_rows_full_is_always_the_reference_and_bad_names_name_the_closest() -> None:
    assert [r.name for r in dt_long.choose_rows(("xl",), TINY)] == ["full", "xl"]
    assert [r.name for r in dt_long.choose_rows((), TINY)] == ["full", "floor", "xl"]
    with pytest.raises(UserError, match=r"--rows: unknown row 'fulll'.*did you mean 'full'"):
        dt_long.choose_rows(("xl", "fulll"), TINY)
    with pytest.raises(UserError, match="no 'full' row"):
        dt_long.choose_rows((), TINY[2:])


def test_missing_dataset_and_bad_options_are_user_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"no dataset rlt/tmaze-3/.*make_memory_dataset"):
        dt_long.run_bench(dt_long.DTLongConfig(lengths=(L,), dataset_root=tmp_path, out=None), "", TINY)
    with pytest.raises(UserError, match="--rounds 0"):
        dt_long.run_bench(dt_long.DTLongConfig(rounds=0), "", TINY)


def test_dry_run_lists_rows_and_k_and_touches_nothing(tmp_path: Path) -> None:
    lines: list[str] = []
    cfg = dt_long.DTLongConfig(
        lengths=(L, 200), dry_run=True, dataset_root=tmp_path / "none", out=tmp_path / "o"
    )
    assert dt_long.run_bench(cfg, "", TINY, lines.append)["dry_run"]
    text = "\n".join(lines)
    assert "TMaze3" in text and "TMaze200" in text and "rough total" in text
    assert any(line.split()[:3] == ["xl", "K", "67"] for line in lines)  # ceil(201 / 3)
    assert not (tmp_path / "o").exists()


def test_script_runs_and_reports_a_bad_row_in_one_line(minari: Path, tmp_path: Path) -> None:
    script = [sys.executable, str(ROOT / "benchmarks" / "bench_dt_long_context.py")]
    env_args = {"cwd": ROOT, "capture_output": True, "text": True, "timeout": 300}
    run = subprocess.run(
        [*script, "--lengths", "3", "--rows", "full", "floor", "--rounds", "1", "--updates", "1",
         "--no-rss", "--dataset-root", str(minari), "--out", str(tmp_path)], **env_args,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    written = json.loads((tmp_path / "results.json").read_text())
    assert {r["row"] for r in written["results"]} == {"full", "floor"}
    assert "--rows full floor" in written["command"] and "rss_peak_bytes" not in written["results"][0]
    bad = subprocess.run([*script, "--dry-run", "--rows", "locall"], **env_args)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert (
        bad.stderr.startswith("error: --rows: unknown row 'locall'") and "did you mean 'local'" in bad.stderr
    )
