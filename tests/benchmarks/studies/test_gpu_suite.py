"""The GPU suite (benchmarks/bench_gpu.py): its CPU dry run end to end, and the report's arithmetic on hand-made rows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.studies import gpu_report
from benchmarks.studies.gpu_suite import GpuSuiteConfig
from rl_transformers.backbone import available

ROOT = Path(__file__).resolve().parents[3]


def bench_gpu_dry_run(out: Path, *flags: str) -> Path:
    """``benchmarks/bench_gpu.py --dry-run --out OUT FLAGS`` in a clean environment; returns OUT."""
    proc = subprocess.run(
        [sys.executable, "benchmarks/bench_gpu.py", "--dry-run", "--out", str(out), *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return bench_gpu_dry_run(tmp_path_factory.mktemp("gpu-dry"))


def test_dry_run_writes_every_stage(dry_run: Path) -> None:
    assert sorted(p.name for p in dry_run.iterdir()) == ["attention.png", "results.json", "results.md"]
    results = json.loads((dry_run / "results.json").read_text())
    assert results["dry_run"] is True
    assert {n: r["status"] for n, r in results["stages"].items()} == {
        n: "ok" for n in ("device", "ceilings", "attention", "attention_fp32", "ppo", "dt")
    }
    rows = results["stages"]["attention"]["data"]["rows"]
    # Every registered attention, SDPA and both forced SDPA backends have a row: nothing silently dropped.
    variants = {r["variant"] for r in rows}
    assert set(available()["attention"]) | {"sdpa", "peer:sdpa-flash", "peer:sdpa-efficient"} <= variants
    assert {(r["target"], r["mode"]) for r in rows} == {
        (t, m) for t in ("kernel", "layer") for m in ("forward", "backward")
    }
    # Every timed row says which attention kernels it ran and the FLOPs they really did (kernels.py).
    timed = [r for r in rows if r["time_ms"] is not None]
    assert timed and all(r["backends"] and r["real_flops"] > 0 and r["real_tflops"] > 0 for r in timed)
    sdpa = [r for r in timed if r["variant"] == "sdpa"]
    assert sdpa and all(set(r["backends"]) <= {"cpu_flash", "math"} for r in sdpa)
    ppo = results["stages"]["ppo"]["data"]["rows"]
    assert [r["num_envs"] for r in ppo] == [2, 4] and all(r["steps_per_s"] > 0 for r in ppo)
    assert "rl_transformers" in results["stages"]["dt"]["data"]["table"]


def test_dry_run_markdown_columns(dry_run: Path) -> None:
    text = (dry_run / "results.md").read_text()
    assert "**Dry run**" in text
    assert "| variant | L = 32 |" in text
    assert "| envs | parameters | rollout env steps/s | update samples/s | env steps/s (both) |" in text
    assert "| candidate | parameters | updates/s | samples/s | rl_transformers speed-up |" in text
    assert "| variant | mode | L | kernels | real TFLOP/s | dense-equivalent TFLOP/s |" in text
    for section in ("### Attention, bf16: kernel, forward", "### Attention, bf16: layer, backward"):
        assert section in text


def _row(variant: str, kind: str, mode: str, time_ms: float | None, ratio: float | None, **kw) -> dict:
    row = {
        "variant": variant, "attention": kw.get("attention", variant), "kind": kind, "target": "kernel",
        "mode": mode, "length": 16384, "batch": 1, "heads": 32, "d_head": 64, "dtype": "bfloat16",
        "status": kw.get("status", "ok"), "reason": kw.get("reason"), "time_ms": time_ms, "ratio_sdpa": ratio,
        "tflops": kw.get("tflops"), "exact": kw.get("exact", True), "causal": True,
    }  # fmt: skip
    return row


def test_limit_shares_follow_the_ceilings() -> None:
    rows = [
        _row("sdpa", "sdpa", "forward", 2.0, 1.0, attention="full", tflops=300.0),
        _row("local", "ours", "forward", 1.0, 0.5, tflops=600.0, exact=True),
        _row("linformer", "ours", "forward", 0.5, 0.25, tflops=1200.0, exact=False),
        _row("linear", "ours", "forward", 4.0, 2.0, tflops=150.0, exact=False),
        _row("lsh", "ours", "forward", None, None, status="failed", reason="numerical error"),
    ]
    results = {
        "stages": {
            "ceilings": {"data": {"matmul_tflops": 800.0, "copy_tb_per_s": 3.0}},
            "attention": {"data": {"rows": rows}},
        }
    }
    limits = {r["which"]: r for r in gpu_report.limit_rows(results)}
    assert limits["sdpa"]["share_matmul"] == pytest.approx(300 / 800)
    assert limits["fastest exact efficient attention"]["variant"] == "local"
    # q, k, v read and the output written once: 4 tensors of 1·32·16384·64 bf16 elements in 1 ms.
    expected_tb = 4 * 32 * 16384 * 64 * 2 / 1e-3 / 1e12
    assert limits["fastest exact efficient attention"]["tb_per_s"] == pytest.approx(expected_tb)
    assert limits["fastest exact efficient attention"]["share_copy"] == pytest.approx(expected_tb / 3.0)
    slow = gpu_report.slower_than_sdpa(results)
    assert any(s.startswith("linear (forward): ×2.00") for s in slow)
    assert any(s.startswith("lsh (forward): failed") for s in slow)
    assert not any(s.startswith("local") for s in slow)


def test_config_refuses_unknown_stage() -> None:
    with pytest.raises(ValueError, match="unknown stage"):
        GpuSuiteConfig(stages=("attention", "atention"))


def _run(device: str, rows: list[dict], notes: tuple[str, ...] = ()) -> dict:
    config = {
        "targets": ["kernel", "layer"],
        "config": {"modes": ["forward"]},
        "shapes": [{"batch": 1, "heads": 32, "d_head": 64, "length": n} for n in (1024, 16384)],
        "model_max_len": 4096,
        "repeats": 7,
    }
    return {
        "command": f"run on {device}",
        "git_commit": "abc",
        "stages": {
            "device": {"status": "ok", "data": {"device_name": device}},
            "attention": {"status": "ok", "data": {"rows": rows, "config": config, "notes": list(notes)}},
        },
    }


def test_merge_replaces_rows_of_the_same_measurement_and_adds_new_ones() -> None:
    layer_error = {
        **_row("full", "ours", "forward", None, None, status="error", reason="device"),
        "target": "layer",
    }
    layer_ok = {**_row("full", "ours", "forward", 3.0, 1.1), "target": "layer"}
    kernel = _row("full", "ours", "forward", 2.0, 1.0)
    kernel_short = {**kernel, "length": 1024}
    layer_short = {**layer_ok, "length": 1024, "time_ms": 9.0}
    note = "time budget reached: 2 groups (position, target, mode, size) not run"
    base = _run("NVIDIA H200", [kernel, layer_error], notes=(note,))
    later = _run("NVIDIA H200", [layer_ok, layer_short])
    assert gpu_report.merge_results(base, later) == 2
    data = base["stages"]["attention"]["data"]
    assert data["rows"] == [kernel, layer_ok, layer_short]  # kernel kept, layer replaced, new length added
    # One group of the plan (kernel, forward, L = 1024) still has no row: the note is recounted, not kept.
    assert data["notes"] == ["time budget reached: 1 groups (position, target, mode, size) not run"]
    assert base["merged"] == [{"command": "run on NVIDIA H200", "git_commit": "abc", "rows_merged": 2}]
    text = gpu_report.render_markdown(base)
    assert "Rows re-measured on the same device by `run on NVIDIA H200` · git `abc` (2 rows)" in text
    assert gpu_report.merge_results(base, _run("NVIDIA H200", [kernel_short])) == 1
    assert data["notes"] == []


def test_merge_refuses_another_device() -> None:
    base = _run("NVIDIA H200", [_row("full", "ours", "forward", 2.0, 1.0)])
    with pytest.raises(ValueError, match="different devices"):
        gpu_report.merge_results(base, _run("NVIDIA H100 80GB HBM3", []))


def test_merge_from_needs_render_from() -> None:
    with pytest.raises(ValueError, match="--merge-from needs --render-from"):
        GpuSuiteConfig(merge_from=(Path("x.json"),))


def test_run_sh_dry_run_records_command_commit_and_device(tmp_path: Path) -> None:
    """benchmarks/gpu/run.sh itself (the one command of a GPU loan), on the CPU with its fastest stage."""
    proc = subprocess.run(
        ["bash", "benchmarks/gpu/run.sh", str(tmp_path), "--dry-run", "--stages", "ceilings"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={
            "OMP_NUM_THREADS": "1",
            "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
            "PYTHON": sys.executable,
            "RLT_GIT_COMMIT": "0123abcd",
            "RLT_TIME_LIMIT_S": "240",
        },
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["dry_run"] is True and results["git_commit"] == "0123abcd"
    assert "--dry-run" in results["command"]
    assert {n: r["status"] for n, r in results["stages"].items()} == {"device": "ok", "ceilings": "ok"}
    assert results["stages"]["device"]["data"]["git_sha"] == "0123abcd"
    assert results["stages"]["ceilings"]["data"]["matmul_tflops"] > 0


def test_attentions_narrow_the_attention_stage_to_the_named_entries(tmp_path: Path) -> None:
    flags = ["--stages", "attention", "--attentions", "local", "full", "--attention-targets", "kernel"]
    out = bench_gpu_dry_run(tmp_path, *flags)
    rows = json.loads((out / "results.json").read_text())["stages"]["attention"]["data"]["rows"]
    assert {r["variant"] for r in rows} == {"local", "full", "sdpa", "peer:sdpa-flash", "peer:sdpa-efficient"}


def test_config_refuses_unknown_attention() -> None:
    with pytest.raises(ValueError, match=r"unknown attention\(s\) \['locl'\]; valid: .*'local'"):
        GpuSuiteConfig(attentions=("locl",))


@pytest.mark.parametrize("machine", ["gpu-h100", "gpu-h200"])
def test_the_committed_gpu_pages_rebuild_byte_for_byte(machine: str) -> None:
    """benchmarks/results/<machine>/results.md is what render_markdown writes from the results.json beside it."""
    folder = ROOT / "benchmarks" / "results" / machine
    results = json.loads((folder / "results.json").read_text(encoding="utf-8"))
    assert gpu_report.render_markdown(results) == (folder / "results.md").read_text(encoding="utf-8")
