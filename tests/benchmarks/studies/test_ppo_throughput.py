"""measure_throughput --attentions: one process per attention, the table with ratios to full (no time asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
TINY_FLAGS = [
    "--num-envs", "2", "--ppo.num-steps", "8", "--ppo.seq-len", "4", "--ppo.num-minibatches", "1",
    "--ppo.update-epochs", "1", "--backbone.d-model", "16", "--backbone.n-heads", "2", "--backbone.n-layers", "1",
    "--backbone.memory", "None", "--backbone.position", "alibi", "--updates", "1", "--warmup", "0",
]  # fmt: skip


def test_table_of_two_tiny_variants_and_a_refused_one(tmp_path: Path) -> None:
    out = tmp_path / "table"
    cmd = [
        sys.executable,
        "benchmarks/measure_throughput.py",
        "--attentions",
        "local",
        "linear",
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd + TINY_FLAGS, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((out / "results.json").read_text())
    rows = {r["attention"]: r for r in report["rows"]}
    assert list(rows) == ["full", "local", "linear"]  # full measured first, for the ratios
    assert rows["full"]["status"] == "ok" and rows["full"]["ratio_full"] == 1.0
    local = rows["local"]
    assert local["status"] == "ok" and local["steps_per_s"] > 0
    assert local["ratio_full"] == pytest.approx(local["steps_per_s"] / rows["full"]["steps_per_s"], rel=1e-2)
    # per CPU-second as well (process time of the timed updates), with its own ratio
    assert local["steps_per_cpu_s"] > 0
    cpu_ratio = local["steps_per_cpu_s"] / rows["full"]["steps_per_cpu_s"]
    assert local["ratio_full_cpu"] == pytest.approx(cpu_ratio, rel=1e-2)
    # same flags for every row: the same parameter count (attention options differ, projections do not)
    assert local["parameters"] == rows["full"]["parameters"] > 0
    # linear attention cannot take a logit-bias position scheme: refused, no process started, reason given
    assert rows["linear"]["status"] == "unsupported" and "alibi" in rows["linear"]["reason"]
    assert report["command"].startswith("python benchmarks/measure_throughput.py --attentions local linear")
    assert report["config"]["backbone"]["position"] == "alibi" and report["config"]["num_envs"] == 2
    assert report["machine"]["git_sha"] is None or len(report["machine"]["git_sha"]) >= 40
    # the machine record is taken before the measurement (3 processes, each importing torch: > 1 s) and
    # completed after it, so "load at start" is the start's
    machine = report["machine"]
    assert (
        machine["timestamp"] <= machine["finished"] and len(machine["loadavg_end"]) == 3
    )  # ISO, to the second
    markdown = (out / "results.md").read_text()
    assert "| local |" in markdown and "| linear | — |" in markdown and "unsupported" in markdown
    assert f"load at start {machine['loadavg_start'][0]}, at end {machine['loadavg_end'][0]}" in markdown


def test_unknown_attention_is_refused_with_the_closest_name(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "benchmarks/measure_throughput.py",
        "--attentions",
        "lokal",
        "--out",
        str(tmp_path),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "'local'" in proc.stderr and "lokal" in proc.stderr
    assert not (tmp_path / "results.json").exists()
