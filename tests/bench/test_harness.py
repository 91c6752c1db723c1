"""Benchmark harness on tiny CPU sizes: rows for every registry entry, the correctness gate, JSON, plots."""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import Tensor

from rl_transformers.backbone import available, registry
from rl_transformers.backbone.attention.full import FullAttention, FullOptions
from rl_transformers.backbone.reference import reference_attention
from rl_transformers.backbone.registry import Capabilities
from rl_transformers.bench import BenchConfig, run_benchmark
from rl_transformers.bench.config import Shape
from rl_transformers.bench.ops import Impl, build_op, registry_impls
from rl_transformers.bench.report import validate_results

TINY = dict(
    lengths=(32,), batch=1, heads=2, d_heads=(8,), targets=("kernel",), modes=("forward",), warmup=1, repeats=2,
    min_repeat_s=0.0, measure_memory=False, plots=False, probe_len=16, progress=False,
)  # fmt: skip


def by_variant(results: dict) -> dict[str, dict]:
    return {r["variant"]: r for r in results["rows"]}


@pytest.fixture(scope="module")
def tiny_results() -> dict:
    return run_benchmark(BenchConfig(**TINY), write=False)


def test_every_registered_attention_produces_a_row(tiny_results: dict) -> None:
    rows = by_variant(tiny_results)
    for name in available()["attention"]:
        assert name in rows, f"no row for attention {name!r}"
        # every attention passes the correctness gate at this size: exact ones "ok", approximate ones "approx"
        # ("failed" is the gate catching a wrong kernel, "skipped" a row that could not run)
        expected = "ok" if registry.capabilities("attention", name).exact else "approx"
        if not registry.get("attention", name).cls.kernel_form:  # a recurrent mixer: timed per layer only
            expected = "skipped"  # the harness's status for a row that cannot run, with the reason
            assert "unsupported" in rows[name]["reason"] and "no q, k, v kernel" in rows[name]["reason"], name
        assert rows[name]["status"] == expected, (name, rows[name]["status"], rows[name]["reason"])
    assert rows["sdpa"]["status"] == "ok" and rows["full"]["status"] == "ok"
    assert rows["full"]["ratio_sdpa"] > 0 and rows["sdpa"]["ratio_sdpa"] == 1.0
    # SDPA and full attention are gated against the dense reference over the full causal mask
    assert rows["full"]["ref_err"] < 1e-12 and rows["full"]["ref_tol"] is not None
    assert rows["full"]["probe"]["ok"] and rows["full"]["probe"]["density"] == 1.0
    for row in tiny_results["rows"]:
        timed = row["status"] in ("ok", "approx")
        assert (row["time_ms"] is not None) == timed
        if timed:
            assert row["repeats"] == 2 and row["num_err"] <= row["num_tol"]
            assert row["tokens_per_s"] == pytest.approx(row["batch"] * row["length"] / (row["time_ms"] / 1e3))
    validate_results(tiny_results)


class NoiseAttention(FullAttention):
    """Deliberately wrong: returns noise (a fresh draw at every call)."""

    def attend(self, q: Tensor, k: Tensor, v: Tensor, q_pos, k_pos, k_valid, ctx) -> Tensor:  # type: ignore[override]
        return torch.randn_like(q)


class WrongScaleAttention(FullAttention):
    """Deliberately wrong but deterministic and smooth: logits scaled by 1/D instead of 1/sqrt(D)."""

    def attend(self, q: Tensor, k: Tensor, v: Tensor, q_pos, k_pos, k_valid, ctx) -> Tensor:  # type: ignore[override]
        t, s = q.shape[2], k.shape[2]
        mask = torch.ones(t, s, dtype=torch.bool).tril(s - t)
        return reference_attention(q, k, v, mask=mask, scale=1.0 / q.shape[-1]).to(q.dtype)


@pytest.fixture
def broken_variants() -> Iterator[list[str]]:
    names = {"test_broken_noise": NoiseAttention, "test_broken_scale": WrongScaleAttention}
    caps = Capabilities(causal=True, exact=True, streaming="exact")
    available()
    for name, cls in names.items():
        registry.register("attention", name, options=FullOptions, capabilities=caps)(cls)
    try:
        yield list(names)
    finally:
        for name in names:
            registry._REGISTRY["attention"].pop(name, None)


def test_mixers_and_fox_are_timed_on_the_layer_target() -> None:
    """Entries without a q, k, v kernel of their own (the recurrent mixers, fox) run the layer target, forward and
    step, and pass the gate there: fox is exact, yet its softmax-structure probe (which needs the kernel) is
    skipped with the reason rather than erroring the row."""
    names = tuple(n for n in available()["attention"] if not registry.get("attention", n).cls.kernel_form)
    assert {"mamba", "gated_deltanet", "lru", "fox"} <= set(names)
    cfg = BenchConfig(**{**TINY, "targets": ("layer",), "modes": ("forward", "step"), "attentions": names})
    results = run_benchmark(cfg, write=False)
    for row in results["rows"]:
        if row["variant"] in names:
            expected = "ok" if registry.capabilities("attention", row["variant"]).exact else "approx"
            assert row["status"] == expected, (row["variant"], row["mode"], row["reason"])
            assert row["time_ms"] is not None and row["num_err"] <= row["num_tol"]
    fox = [r for r in results["rows"] if r["variant"] == "fox"]
    assert {r["mode"] for r in fox} == {"forward", "step"}
    assert all("no kernel on (q, k, v)" in r["probe"]["reason"] for r in fox if r.get("probe"))


def test_gate_reports_broken_implementations_as_failed(broken_variants: list[str]) -> None:
    cfg = BenchConfig(**{**TINY, "attentions": ("full", *broken_variants), "modes": ("forward", "backward")})
    results = run_benchmark(cfg, write=False)
    for row in results["rows"]:
        if row["variant"] in broken_variants:
            assert row["status"] == "failed", row
            assert row["time_ms"] is None and row["repeats"] == 0
        else:
            assert row["status"] == "ok"
    rows = {(r["variant"], r["mode"]): r for r in results["rows"]}
    assert "numerical error" in rows["test_broken_noise", "forward"]["reason"]
    scale = rows["test_broken_scale", "forward"]
    assert scale["num_err"] < 1e-6  # numerically fine ...
    assert (
        "softmax probe" in scale["reason"] and "depends on the keys" in scale["reason"]
    )  # ... but not softmax
    assert "numerical error" not in scale["reason"]
    assert rows["test_broken_scale", "backward"]["status"] == "failed"  # backward rows share the forward gate


def test_json_schema_markdown_and_plots(tmp_path: Path) -> None:
    cfg = BenchConfig(
        **{**TINY, "attentions": ("full", "local"), "lengths": (32, 64), "modes": ("forward", "step"),
           "plots": True, "out": tmp_path}
    )  # fmt: skip
    run_benchmark(cfg)
    data = json.loads((tmp_path / "results.json").read_text())
    validate_results(data)
    meta = data["meta"]
    assert (
        meta["torch_version"] == torch.__version__
        and meta["threads"] >= 1
        and len(meta["loadavg_start"]) == 3
    )
    assert isinstance(meta["git_sha"], (str, type(None))) and meta["timestamp"].endswith("+00:00")
    broken = copy.deepcopy(data)
    del broken["rows"][0]["time_ms"]
    with pytest.raises(ValueError, match="time_ms"):
        validate_results(broken)
    broken = copy.deepcopy(data)
    broken["rows"][0]["length"] = "32"
    with pytest.raises(ValueError, match="length"):
        validate_results(broken)
    markdown = (tmp_path / "results.md").read_text()
    assert "## kernel · forward · position none" in markdown and "| full |" in markdown
    assert "## Crossover vs SDPA" in markdown
    plots = sorted(p.name for p in (tmp_path / "plots").glob("*.png"))
    assert plots == ["none-kernel-forward-H2-D8.png", "none-kernel-step-H2-D8.png"]
    assert all((tmp_path / "plots" / p).stat().st_size > 1000 for p in plots)
    steps = [r for r in data["rows"] if r["mode"] == "step"]
    assert all(r["tokens_per_s"] == pytest.approx(1 / (r["time_ms"] / 1e3)) for r in steps)


def test_step_op_matches_a_full_forward_over_past_and_new_token() -> None:
    """The step op (state of L past tokens + one token) computes the last row of causal attention."""
    shape = Shape(batch=2, heads=2, d_head=8, length=20)
    full = Impl("full", "ours", attention="full")
    for impl in (full, registry_impls(("full",), (), {})[0]):  # ours and the SDPA baseline
        op = build_op(impl, "kernel", "step", shape, causal=True, dtype=torch.float64)
        q, k, v = (torch.cat([op.inputs[f"past_{n}"], op.inputs[n]], dim=2) for n in "qkv")
        expected = reference_attention(q, k, v, mask=torch.ones(21, 21, dtype=torch.bool).tril())[:, :, -1:]
        torch.testing.assert_close(op.output(), expected, atol=1e-12, rtol=0)


def test_non_causal_only_entries_run_non_causal() -> None:
    impl = Impl("nc", "ours", attention="full", causal_ok=False, noncausal_ok=True)
    assert impl.run_causal(True) is False and impl.run_causal(False) is False
    assert Impl("c", "ours", causal_ok=True, noncausal_ok=False).run_causal(False) is True
    names = [n for n in available()["attention"] if not registry.capabilities("attention", n).causal]
    if not names:
        pytest.skip("no non-causal-only attention registered")
    cfg = BenchConfig(**{**TINY, "attentions": (names[0],), "modes": ("forward", "step")})
    rows = {(r["variant"], r["mode"]): r for r in run_benchmark(cfg, write=False)["rows"]}
    row = rows[names[0], "forward"]
    assert row["causal"] is False and "non-causal" in row["note"]
    assert rows["sdpa (non-causal)", "forward"]["causal"] is False
    if row["status"] in ("ok", "approx"):
        base = rows["sdpa (non-causal)", "forward"]["time_ms"]
        assert row["ratio_sdpa"] == pytest.approx(row["time_ms"] / base)
    assert rows[names[0], "step"]["status"] == "skipped"


def test_memory_is_measured_in_a_fresh_process_and_budget_is_enforced() -> None:
    from rl_transformers.bench.memory import MemoryJob, measure_cpu

    impl = Impl("full", "ours", attention="full", options={"force_dense": True})
    common = dict(target="kernel", mode="forward", causal=True, position="none", n_layers=1, dtype="float32",
                  seed=0, threads=1)  # fmt: skip
    # dense logits + probs of B*H*L*L floats: 2 * 4 * 512^2 * 4 B = 8 MiB at least
    ok = measure_cpu(MemoryJob(impl, shape=Shape(2, 2, 8, 512), budget_bytes=2**31, **common), timeout=120)
    assert "error" not in ok, ok
    assert ok["peak_bytes"] >= 4 * 2**20 and ok["method"] in ("vmhwm", "ru_maxrss")
    capped = measure_cpu(
        MemoryJob(impl, shape=Shape(2, 2, 8, 2048), budget_bytes=2**20, **common), timeout=120
    )
    assert capped["error"] == "memory"


def test_memory_and_time_estimates_skip_sizes() -> None:
    cfg = BenchConfig(
        **{**TINY, "attentions": ("full",), "lengths": (32, 64, 4096), "measure_memory": True,
           "memory_budget_gb": 0.02, "max_call_s": 30.0}
    )  # fmt: skip
    rows = {(r["variant"], r["length"]): r for r in run_benchmark(cfg, write=False)["rows"]}
    assert rows["full", 32]["peak_mem_bytes"] is not None
    big = rows["full", 4096]
    # peaks at L=32, 64 are below the 1 MiB floor: slope clamped to 1 -> 1 MiB * 4096 / 64 = 64 MiB > 20 MiB
    assert big["status"] == "skipped" and big["reason"].startswith("skipped (memory): estimated 64 MiB")
    assert big["mem_estimate_bytes"] == pytest.approx(64 * 2**20) and big["time_ms"] is None


@pytest.mark.skipif(
    not all(__import__("importlib").util.find_spec(m) for m in ("local_attention", "x_transformers")),
    reason="bench-peers extra not installed",
)
def test_peers_share_the_gate_and_exact_peers_match_their_masks() -> None:
    cfg = BenchConfig(
        **{**TINY, "attentions": ("local",), "lengths": (128,), "d_heads": (16,), "peers": True}
    )
    rows = by_variant(run_benchmark(cfg, write=False))
    for name in ("peer:x-transformers", "peer:local-attention"):
        assert rows[name]["status"] == "ok", rows[name]["reason"]
        assert rows[name]["ref_err"] < 1e-6  # x-transformers: full causal; local-attention: 0 <= i - j <= 64
    assert math.isfinite(rows["local"]["ref_err"])


@pytest.mark.gpu
def test_gpu_run_uses_bf16_and_cuda_memory() -> None:
    cfg = BenchConfig(
        **{**TINY, "device": "cuda", "dtype": None, "measure_memory": True, "attentions": ("full",)}
    )
    results = run_benchmark(cfg, write=False)
    row = by_variant(results)["full"]
    assert row["dtype"] == "bfloat16" and row["mem_method"] == "cuda_max_memory_allocated"
    assert results["meta"]["device"].startswith("cuda")


@pytest.mark.gpu
def test_gpu_layer_rows_pass_the_gate() -> None:
    """The layer target's dense reference twin runs on the op's device (it was built on the CPU once: every
    layer row of the first H200 run errored with a device mismatch)."""
    cfg = BenchConfig(
        **{**TINY, "device": "cuda", "dtype": None, "targets": ("layer",), "attentions": ("full", "local")}
    )
    rows = by_variant(run_benchmark(cfg, write=False))
    for name in ("full", "local"):
        assert rows[name]["status"] in ("ok", "approx"), rows[name]["reason"]
        assert rows[name]["ref_err"] is not None and math.isfinite(rows[name]["ref_err"])


def test_gate_runs_when_every_timed_length_is_above_check_max_len(broken_variants: list[str]) -> None:
    """Only L = 2048 requested (> the CPU check_max_len 1024): broken entries still fail, checked at 1024."""
    cfg = BenchConfig(
        **{
            **TINY,
            "attentions": ("full", *broken_variants),
            "lengths": (2048,),
            "heads": 1,
            "ref_max_len": 1024,
        }
    )
    rows = by_variant(run_benchmark(cfg, write=False))
    for name in broken_variants:
        assert rows[name]["status"] == "failed" and rows[name]["time_ms"] is None, rows[name]
        assert rows[name]["checked_at"] == 1024
    assert "numerical error" in rows["test_broken_noise"]["reason"]
    assert "softmax probe" in rows["test_broken_scale"]["reason"]
    full = rows["full"]
    assert full["status"] == "ok" and full["checked_at"] == 1024 and full["time_ms"] is not None
    assert "checked at L = 1024 (timed length above check_max_len)" in full["note"]
    assert full["ref_err"] < 1e-12  # the dense-reference comparison ran at the checked length


def test_hashing_and_routing_pass_the_bf16_gate() -> None:
    """lsh buckets and routing clusters are assigned in float32 from half-precision inputs: in bf16 the same
    kernel then attends the same keys as its float64 run (before, bucket / cluster flips gave errors of 0.17 and
    0.45 here, 0.9 and 0.7 on an H200). The layer target stays out: its bf16 projections move keys themselves."""
    cfg = BenchConfig(
        **{
            **TINY,
            "lengths": (256,),
            "d_heads": (64,),
            "heads": 4,
            "dtype": "bfloat16",
            "attentions": ("lsh", "routing"),
            "repeats": 1,
        }
    )
    rows = by_variant(run_benchmark(cfg, write=False))
    for name in ("lsh", "routing"):
        assert rows[name]["status"] == "approx", rows[name]["reason"]
        assert rows[name]["num_err"] < rows[name]["num_tol"]
