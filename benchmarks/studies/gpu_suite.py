"""The GPU benchmark suite: one time-boxed command that measures everything the suite claims on a lent GPU.

``benchmarks/bench_gpu.py`` (and ``benchmarks/gpu/run.sh``, which first installs the carried wheels) runs, in this
order, each stage inside its own try block so that one failure costs only its own table, and rewrites the
results after every stage (a run stopped by its time limit still leaves every finished stage on disk):

1. **device**: name, memory, SMs, driver (``nvidia-smi``), torch / CUDA / cuDNN versions;
2. **ceilings**: the device's measured bf16 matrix-product rate (an n x n x n product, CUDA events, median) and
   device-to-device copy bandwidth (bytes read + written): the physical limits the attention rows are set
   against;
3. **attention (bf16)**: every registered attention, SDPA (default dispatch) and SDPA forced onto its flash and
   memory-efficient backends, kernel and layer targets, forward and forward + backward, causal, at L = 1K, 4K,
   16K, 64K (up to memory) through the attention harness (``harness.py``): every row passes the correctness gate
   (float64 reference) before it is timed; timing is CUDA events, median of repeats after warm-up;
4. **attention (fp32)**: the kernel target again in float32 at shorter lengths;
5. **PPO**: the default GTrXL policy's env steps/s on a vectorised memory task with 32, 256 and 1,024 envs
   (rollout, update and both), the update's samples/s being the ``train`` column;
6. **DT**: training updates/s of our Decision Transformer at the paper's size against Hugging Face's
   ``DecisionTransformerModel``, both at its default (with GPT-2's 1024-row position table) and at an equal
   parameter count (the position table cut to the 3K rows a K-step window uses).

``--dry-run`` runs every stage at toy sizes on the CPU (the test suite does, so the script never rots between
loans). Output: ``results.json``, ``results.md`` and ``attention.png`` in ``--out`` (:mod:`gpu_report`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rl_transformers.runs.provenance import git_sha, machine_info
from rl_transformers.utils.atomic import atomic_write_text

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class GpuSuiteConfig:
    """The GPU benchmark suite (``benchmarks/bench_gpu.py``)."""

    out: Path = Path("benchmarks/results/gpu")
    """Output folder: results.json, results.md, attention.png."""
    dry_run: bool = False
    """Every stage at toy sizes on the CPU (seconds): checks that the suite runs, measures nothing."""
    budget_s: float = 420.0
    """Wall-clock budget of the whole suite; a stage that would start after it is skipped (and says so), and
    the attention sweeps stop starting new groups at their share of it."""
    lengths: tuple[int, ...] = (1024, 4096, 16384, 65536)
    """Sequence lengths of the bf16 attention sweep."""
    fp32_lengths: tuple[int, ...] = (1024, 4096, 16384)
    """Sequence lengths of the fp32 kernel sweep."""
    ppo_envs: tuple[int, ...] = (32, 256, 1024)
    """Vectorised env counts of the PPO throughput stage (the env-steps/s curve; a count that would start after
    the budget is a skipped row)."""
    env_id: str = "rlt/TMaze-v0"
    """Memory task of the PPO stage."""
    repeats: int = 7
    """Timed repeats per attention row (median reported)."""
    attention_share: float = 0.55
    """Share of the time left that the bf16 attention sweep may start groups in (fp32 then gets 0.75 of the
    rest; the PPO and DT stages need about 30 s together on an H100)."""
    stages: tuple[str, ...] = ("ceilings", "attention", "attention_fp32", "ppo", "dt")
    """Stages to run (the device record always is)."""
    flex: str = "auto"
    """FlexAttention form of the mask-defined attentions (``backbone/attention/_flex.py``): "auto" (on a capable
    GPU from 512 queries), or "never" (today's dense / blocked / fused forms, e.g. the baseline of a comparison).
    Each new (attention, length, mode) compiles its kernel first (not timed, but it spends the budget)."""
    attentions: tuple[str, ...] = ()
    """Attention registry names of the attention stages (empty: every registered one); SDPA and its forced
    backends always run beside them. E.g. the FlexAttention entries alone, when a loan is short."""
    attention_targets: tuple[str, ...] = ("kernel", "layer")
    """Targets of the bf16 attention stage (``layer`` alone re-runs the layer rows of an earlier run)."""
    git_commit: str | None = None
    """Commit of the code (default: asked of git; set it where the copy carries no .git, as on a lent GPU)."""
    command: str = ""
    """The command line, recorded in the results."""
    render_from: Path | None = None
    """Only re-render results.md and attention.png in --out from this results.json (no measurement)."""
    merge_from: tuple[Path, ...] = ()
    """With --render-from: results.json files of later runs on the same device whose attention rows replace the
    rows of the same variant, target, mode, length and dtype (e.g. the layer rows re-run after a fix)."""

    def __post_init__(self) -> None:
        valid = ("ceilings", "attention", "attention_fp32", "ppo", "dt")
        if self.flex not in ("auto", "never"):
            raise ValueError(f"flex must be 'auto' or 'never', got {self.flex!r}")
        bad = [s for s in self.stages if s not in valid]
        if bad:
            raise ValueError(f"unknown stage(s) {bad}; valid: {list(valid)}")
        if not 0 < self.attention_share <= 1 or self.repeats < 1:
            raise ValueError(
                f"attention_share in (0, 1] and repeats >= 1 required, got {self.attention_share}, "
                f"{self.repeats}"
            )
        if self.merge_from and self.render_from is None:
            raise ValueError("--merge-from needs --render-from (the run whose rows it replaces)")
        from rl_transformers.backbone import available

        unknown = [a for a in self.attentions if a not in available()["attention"]]
        if unknown:
            raise ValueError(f"unknown attention(s) {unknown}; valid: {available()['attention']}")
        if self.budget_s <= 0:
            raise ValueError(f"budget_s must be > 0, got {self.budget_s}")


class Suite:
    """Runs the stages of a :class:`GpuSuiteConfig` and keeps ``results`` up to date on disk."""

    def __init__(self, cfg: GpuSuiteConfig) -> None:
        self.cfg = cfg
        self.device = torch.device("cpu" if cfg.dry_run else "cuda")
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("no CUDA device: run on a GPU machine, or pass --dry-run for the CPU smoke run")
        self.start = time.monotonic()
        self.work = Path(tempfile.mkdtemp(prefix="rlt-gpu-suite-"))
        self.results: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "dry_run": cfg.dry_run,
            "command": cfg.command,
            "git_commit": cfg.git_commit or git_sha() or "unknown",
            "stages": {},
        }

    @property
    def deadline(self) -> float:
        return self.start + self.cfg.budget_s

    def left_s(self) -> float:
        return self.deadline - time.monotonic()

    def run(self) -> dict[str, Any]:
        stages: dict[str, Callable[[], Any]] = {
            "device": self.device_record,
            "ceilings": self.ceilings,
            "attention": lambda: self.attention(
                "bfloat16", self.cfg.lengths, self.cfg.attention_targets, self.cfg.attention_share
            ),
            "attention_fp32": lambda: self.attention("float32", self.cfg.fp32_lengths, ("kernel",), 0.75),
            "ppo": self.ppo,
            "dt": self.dt,
        }
        try:
            for name, stage in stages.items():
                if name != "device" and name not in self.cfg.stages:
                    continue
                self.stage(name, stage)
        finally:
            shutil.rmtree(self.work, ignore_errors=True)
        return self.results

    def stage(self, name: str, fn: Callable[[], Any]) -> None:
        record: dict[str, Any] = {}
        if self.left_s() <= 0:
            record = {"status": "skipped", "reason": f"suite budget of {self.cfg.budget_s:.0f} s reached"}
        else:
            t0 = time.monotonic()
            print(f"[{time.monotonic() - self.start:6.1f}s] stage {name} ...", flush=True)
            try:
                record = {"status": "ok", "data": fn()}
            except Exception as err:  # one stage's failure is its own row, not the suite's end
                tail = traceback.format_exc().strip().splitlines()[-4:]
                record = {"status": "error", "reason": f"{type(err).__name__}: {err}", "traceback": tail}
                print(f"stage {name} failed: {record['reason']}", flush=True)
            record["seconds"] = round(time.monotonic() - t0, 1)
        self.results["stages"][name] = record
        self.write()

    def write(self) -> None:
        from benchmarks.studies import gpu_report

        out = self.cfg.out
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "results.json", json.dumps(self.results, indent=1, sort_keys=True) + "\n")
        atomic_write_text(out / "results.md", gpu_report.render_markdown(self.results))

    # -- stages -------------------------------------------------------------------------------------------
    def device_record(self) -> dict[str, Any]:
        info = machine_info(self.device)
        if self.device.type == "cuda":
            props = torch.cuda.get_device_properties(0)
            info |= {
                "gpu_memory_gib": round(props.total_memory / 2**30, 1),
                "multiprocessors": props.multi_processor_count,
                "capability": f"{props.major}.{props.minor}",
                "cudnn_version": torch.backends.cudnn.version(),
                "driver": _nvidia_smi("driver_version"),
            }
        info["git_sha"] = self.results["git_commit"]
        return info

    def ceilings(self) -> dict[str, Any]:
        n = 256 if self.cfg.dry_run else 8192
        dtype = torch.float32 if self.cfg.dry_run else torch.bfloat16
        gen = torch.Generator(device=self.device).manual_seed(0)
        a = torch.randn(n, n, device=self.device, dtype=dtype, generator=gen)
        b = torch.randn(n, n, device=self.device, dtype=dtype, generator=gen)
        mm_s = _median_time(lambda: a @ b, self.device, repeats=10)
        numel = (2**20 if self.cfg.dry_run else 2**30) // 2  # 1 GiB of bf16 on the GPU
        src = torch.randn(numel, device=self.device, generator=gen).to(dtype)
        dst = torch.empty_like(src)
        copy_s = _median_time(lambda: dst.copy_(src), self.device, repeats=10)
        moved = 2 * src.numel() * src.element_size()
        return {
            "matmul_n": n,
            "matmul_dtype": str(dtype).removeprefix("torch."),
            "matmul_tflops": 2 * n**3 / mm_s / 1e12,
            "copy_bytes": moved,
            "copy_tb_per_s": moved / copy_s / 1e12,
        }

    def attention(
        self, dtype: str, lengths: tuple[int, ...], targets: tuple[str, ...], share: float
    ) -> dict[str, Any]:
        from rl_transformers.backbone.attention import _flex
        from rl_transformers.bench.config import BenchConfig
        from rl_transformers.bench.harness import run_benchmark

        _flex.FLEX_PATH = self.cfg.flex
        tiny = self.cfg.dry_run
        bench = BenchConfig(
            attentions=self.cfg.attentions,
            targets=targets,
            modes=("forward", "backward"),
            lengths=(32,) if tiny else lengths,
            d_heads=(16,) if tiny else (64,),
            tokens=128 if tiny else 16384,
            width=32 if tiny else 2048,
            dtype=dtype,
            device=self.device.type,
            sdpa_backends=True,
            check_max_len=64 if tiny else 1024,
            ref_max_len=64 if tiny else 1024,
            probe_len=32 if tiny else 96,
            warmup=1 if tiny else 2,
            repeats=2 if tiny else self.cfg.repeats,
            max_call_s=1.0,
            slow_repeat_s=0.5,
            measure_memory=not tiny,
            out=self.work / f"attention-{dtype}",
            plots=False,
        )
        # This stage may start groups until it has used ``share`` of the time left.
        deadline = time.monotonic() + share * self.left_s()
        results = run_benchmark(bench, write=False, deadline=deadline)
        keep = (
            "variant", "attention", "kind", "target", "mode", "length", "batch", "heads", "d_head", "dtype",
            "causal", "status", "reason", "note", "time_ms", "time_ms_q1", "time_ms_q3", "tflops",
            "tokens_per_s", "ratio_sdpa", "peak_mem_bytes", "num_err", "ref_err", "exact", "backends",
            "real_flops", "real_tflops",
        )  # fmt: skip
        rows = [{k: r.get(k) for k in keep} for r in results["rows"]]
        return {
            "config": results["meta"]["config"],
            "notes": results["meta"]["notes"],
            "flex": self.cfg.flex,
            "rows": rows,
        }

    def ppo(self) -> dict[str, Any]:
        import envs  # noqa: F401  (registers the rlt/ ids)
        from rl_transformers.algos.ppo_config import PPOConfig, TrainConfig
        from rl_transformers.algos.throughput import measure_throughput

        rows = []
        counts = (2, 4) if self.cfg.dry_run else self.cfg.ppo_envs
        for n_envs in counts:
            if self.left_s() <= 0:
                rows.append({"num_envs": n_envs, "status": "skipped", "reason": "suite budget reached"})
                continue
            tiny = PPOConfig(num_steps=16, seq_len=8, num_minibatches=1, update_epochs=1)
            ppo = tiny if self.cfg.dry_run else None
            cfg = TrainConfig(
                env_id=self.cfg.env_id, num_envs=n_envs, device=self.device.type, progress=False
            )
            if ppo is not None:
                cfg = dataclasses.replace(cfg, ppo=ppo)
            updates, warmup = (1, 1) if self.cfg.dry_run else (4, 2)
            result = measure_throughput(cfg, updates=updates, warmup=warmup)
            rows.append(
                {
                    "num_envs": n_envs,
                    "status": "ok",
                    "samples_per_update": n_envs * cfg.ppo.num_steps,
                    **{k: round(v, 1) for k, v in result.items()},
                }
            )
        return {"env_id": self.cfg.env_id, "rows": rows}

    def dt(self) -> dict[str, Any]:
        from benchmarks.studies import dt_models
        from benchmarks.studies.dt_timing import run_rounds, summarise

        shape = (
            dt_models.DTShape(batch_size=4, context_len=5, d_model=16, n_layers=1)
            if self.cfg.dry_run
            else dt_models.DTShape()
        )
        names = ("rl_transformers", "rl_transformers_generic", "huggingface", "huggingface_equal_params")
        built, skipped = {}, {}
        for name in names:
            try:
                candidate = dt_models.BUILDERS[name](shape, self.device)
            except Exception as err:  # a peer's API change is a row, not the stage's end
                skipped[name] = f"{type(err).__name__}: {err}"
                continue
            if candidate is None:
                skipped[name] = f"not installed ({dt_models.INSTALL_HINT.get(name, '')})"
            else:
                built[name] = candidate
        batch = dt_models.make_batch(shape, self.device)
        steps, rounds, warmup = (2, 2, 1) if self.cfg.dry_run else (20, 7, 5)
        seconds = run_rounds(built, batch, self.device, steps, rounds, warmup)
        report = summarise(built, seconds, steps * shape.batch_size, reference="rl_transformers")
        return {
            "shape": dataclasses.asdict(shape),
            "steps": steps,
            "rounds": rounds,
            "warmup": warmup,
            "table": report["table"],
            "skipped": skipped,
        }


def _median_time(fn: Callable[[], Any], device: torch.device, repeats: int) -> float:
    """Median seconds of ``fn`` after two warm-up calls (CUDA events on a GPU, perf_counter on the CPU)."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn()
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def _nvidia_smi(field: str) -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else None


def run_suite(cfg: GpuSuiteConfig) -> dict[str, Any]:
    """Run the suite of ``cfg``; writes results.json, results.md and attention.png to ``cfg.out``."""
    from benchmarks.studies import gpu_report

    if cfg.render_from is not None:
        results = json.loads(Path(cfg.render_from).read_text())
        for path in cfg.merge_from:
            gpu_report.merge_results(results, json.loads(Path(path).read_text()))
        cfg.out.mkdir(parents=True, exist_ok=True)
        if cfg.merge_from:
            atomic_write_text(cfg.out / "results.json", json.dumps(results, indent=1, sort_keys=True) + "\n")
        atomic_write_text(cfg.out / "results.md", gpu_report.render_markdown(results))
        gpu_report.write_plot(results, cfg.out / "attention.png")
        return results
    if cfg.dry_run:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        torch.set_num_threads(1)
    results = Suite(cfg).run()
    gpu_report.write_plot(results, cfg.out / "attention.png")
    return results
