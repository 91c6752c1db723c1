"""BenchConfig: what the benchmark harness measures, with CPU and GPU defaults.

Fields left at ``None`` take the default of the device the run lands on (``resolve()``):

========================  ==========================================  ===========================================
field                     CPU default                                 GPU default
========================  ==========================================  ===========================================
dtype                     float32                                     bfloat16
lengths                   256, 1K, 4K, 16K                            512 ... 64K (powers of two)
batch / tokens            B = 2                                       B = max(1, 16K tokens // L)
heads / width, d_heads    H = 4, D = 64                               H = 2048 // D, D in (64, 128)
memory_budget_gb          min(8, half of the free RAM)                80% of the GPU memory
threads                   1                                           torch's default
check_max_len             1024                                        4096
model_max_len             4096                                        none
========================  ==========================================  ===========================================
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

TARGETS = ("kernel", "layer", "model")
MODES = ("forward", "backward", "step")
DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def _choices(kind: str, values: tuple[str, ...] | list[str], valid: tuple[str, ...] | list[str]) -> None:
    for value in values:
        if value not in valid:
            close = difflib.get_close_matches(str(value), list(valid), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"unknown {kind} {value!r}.{hint} Valid {kind}s: {list(valid)}")


@dataclass(frozen=True)
class BenchConfig:
    """Benchmark of every registered attention against SDPA (see ``benchmarks/README.md``)."""

    attentions: tuple[str, ...] = ()
    """Attention registry names to run (empty: every entry of ``available()["attention"]`` at run time)."""
    exclude: tuple[str, ...] = ()
    """Attention names to leave out."""
    attention_options: str = "{}"
    """JSON mapping attention name -> options dict, e.g. '{"local": {"window": 128}}' (default options else)."""
    positions: tuple[str, ...] = ("none",)
    """Positional schemes to combine with every attention (``none`` isolates the attention kernel)."""
    targets: tuple[str, ...] = ("kernel", "model")
    """kernel: ``Attention.core`` on given q, k, v (SDPA baseline: ``F.scaled_dot_product_attention``);
    layer: the attention layer with its projections; model: a ``Backbone`` of ``n_layers`` blocks."""
    modes: tuple[str, ...] = ("forward", "backward", "step")
    """forward (no grad), backward (forward + backward), step (one new token, state holding L past tokens)."""
    causal: bool = True
    """Causal masking. Entries that are non-causal only (e.g. linformer) run non-causal and say so."""
    lengths: tuple[int, ...] | None = None
    """Sequence lengths L (default: see the module docstring)."""
    batch: int | None = None
    """Batch size B (ignored when ``tokens`` is set)."""
    tokens: int | None = None
    """Tokens per batch: B = max(1, tokens // L) (the FlashAttention convention)."""
    heads: int | None = None
    """Heads H (ignored when ``width`` is set)."""
    width: int | None = None
    """Model width H·D: H = width // D."""
    d_heads: tuple[int, ...] | None = None
    """Head dimensions D to sweep."""
    model_max_len: int | None = None
    """Longest L of the ``model`` target (default: 4096 on CPU, where a 16K model call is FFN-bound at ~6 s for
    every variant; no limit on GPU)."""
    n_layers: int = 2
    """Blocks of the ``model`` target (pre-LN, FFN width 4·H·D)."""
    dtype: str | None = None
    """float32, bfloat16, float16 or float64 (default: float32 on CPU, bfloat16 on GPU)."""
    device: str = "auto"
    """auto (cuda when available), cpu or cuda."""
    threads: int | None = None
    """torch CPU threads (default: 1 on CPU - how the project's trainers run, and robust on shared machines,
    where multi-threaded kernels stall on preempted threads; torch's default on GPU). Recorded in the results."""
    seed: int = 0
    """Seed of the inputs and weights."""
    warmup: int = 2
    """Untimed calls per implementation before timing."""
    repeats: int = 10
    """Timed repeats per implementation (round-robin over implementations)."""
    slow_repeat_s: float = 1.0
    """A repeat longer than this stops the implementation after ``slow_repeats`` repeats (marked early_stop)."""
    slow_repeats: int = 3
    """Repeats kept for slow implementations."""
    min_repeat_s: float | None = None
    """Each repeat loops the op until it lasts this long (per-call time = repeat / loops); default 0.02 s CPU,
    0.005 s GPU."""
    max_call_s: float = 4.0
    """Skip ("skipped (time)") a size whose single call is predicted (or measured in the memory process) to take
    longer than this (the SDPA baseline gets 4x)."""
    memory_budget_gb: float | None = None
    """Skip ("skipped (memory)") sizes whose estimated peak memory exceeds this (see the module docstring)."""
    measure_memory: bool = True
    """Peak memory: fresh process per config on CPU, ``torch.cuda.max_memory_allocated`` on GPU."""
    check_max_len: int | None = None
    """Correctness gate at lengths up to this; a longer size is gated at the longest checked length of its
    series, or by a check run at this length when none was (its row says so) (default: 1024 CPU, 4096 GPU)."""
    ref_max_len: int = 2048
    """Error vs the dense float64 reference only up to this length (it materialises L x L)."""
    probe_len: int = 96
    """Length of the softmax-structure probe of exact entries (float64, see correctness.py)."""
    compile: bool = False
    """Also time ``torch.compile`` d versions (column ``compiled``; compile time reported as first-call)."""
    profile: bool = False
    """Write a ``torch.profiler`` trace per implementation to ``<out>/profile`` (TensorBoard)."""
    peers: bool = False
    """Add peer rows from third-party packages when installed (extra ``bench-peers``)."""
    census: bool = True
    """After timing, run each op once more under the profiler: the attention kernels it used (column
    ``backends``) and the FLOPs they really did (``real_flops``, ``real_tflops``; see ``kernels.py``)."""
    sdpa_backends: bool = False
    """Add SDPA forced onto its flash and memory-efficient backends as rows of their own (kernel target; on CUDA:
    the default ``sdpa`` row is whatever SDPA dispatches to)."""
    quick: bool = False
    """Small smoke configuration: L in (256, 1024), kernel target, 5 repeats."""
    out: Path | None = None
    """Results directory (default ``benchmarks/results/<cpu|gpu>``): results.json, results.md, plots/."""
    plots: bool = True
    """Write matplotlib plots (Agg backend)."""
    progress: bool = True
    """Print one line per measured group."""

    def __post_init__(self) -> None:
        _choices("target", self.targets, TARGETS)
        _choices("mode", self.modes, MODES)
        if not self.targets or not self.modes:
            raise ValueError("targets and modes must not be empty")
        if self.dtype is not None:
            _choices("dtype", [self.dtype], tuple(DTYPES))
        _choices("device", [self.device], ("auto", "cpu", "cuda"))
        for name in ("batch", "tokens", "heads", "width", "threads", "n_layers"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"BenchConfig.{name} must be a positive int or None, got {value!r}")
        for name in ("lengths", "d_heads"):
            value = getattr(self, name)
            if value is not None and (not value or any(int(v) < 1 for v in value)):
                raise ValueError(f"BenchConfig.{name} must be positive ints, got {value!r}")
        if self.repeats < 1 or self.warmup < 0 or self.slow_repeats < 1:
            raise ValueError(
                f"repeats >= 1, warmup >= 0, slow_repeats >= 1 required, got {self.repeats}, {self.warmup}, "
                f"{self.slow_repeats}"
            )
        try:
            opts = json.loads(self.attention_options)
        except json.JSONDecodeError as err:
            raise ValueError(
                f"attention_options is not valid JSON: {err}: {self.attention_options!r}"
            ) from err
        if not isinstance(opts, dict) or not all(isinstance(v, dict) for v in opts.values()):
            raise ValueError(
                f"attention_options must map names to option dicts, got {self.attention_options!r}"
            )

    def shapes(self, gpu: bool) -> tuple[Shape, ...]:
        """Problem sizes of this config on a GPU (``gpu=True``) or CPU, device defaults filled in."""
        lengths = self.lengths or (
            (256, 1024)
            if self.quick
            else tuple(2**i for i in range(9, 17))
            if gpu
            else (256, 1024, 4096, 16384)
        )
        d_heads = self.d_heads or ((64, 128) if gpu else (64,))
        tokens = self.tokens if self.tokens is not None else (16384 if gpu and self.batch is None else None)
        width = self.width if self.width is not None else (2048 if gpu and self.heads is None else None)
        shapes = []
        for d in d_heads:
            h = max(1, width // d) if width is not None else (self.heads or 4)
            for length in sorted(lengths):
                b = max(1, tokens // length) if tokens is not None else (self.batch or 2)
                shapes.append(Shape(batch=b, heads=h, d_head=d, length=int(length)))
        return tuple(shapes)

    @property
    def options_by_attention(self) -> dict[str, dict[str, Any]]:
        return json.loads(self.attention_options)

    def resolve(self) -> ResolvedConfig:
        """Fill device defaults (module docstring) and return the concrete settings of this run."""
        device = self.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cuda" and not torch.cuda.is_available():
            raise ValueError(
                "device='cuda' requested but torch.cuda.is_available() is False; use device='cpu'"
            )
        gpu = device == "cuda"
        quick = self.quick
        dtype = self.dtype or ("bfloat16" if gpu else "float32")
        if self.memory_budget_gb is not None:
            budget = self.memory_budget_gb * 2**30
        elif gpu:
            budget = 0.8 * torch.cuda.get_device_properties(0).total_memory
        else:
            budget = min(8 * 2**30, 0.5 * available_ram_bytes())
        shapes = self.shapes(gpu)
        targets = ("kernel",) if quick and self.targets == ("kernel", "model") else self.targets
        return ResolvedConfig(
            config=self,
            device=torch.device(device),
            dtype=DTYPES[dtype],
            dtype_name=dtype,
            shapes=tuple(shapes),
            targets=targets,
            repeats=min(self.repeats, 5) if quick else self.repeats,
            min_repeat_s=self.min_repeat_s if self.min_repeat_s is not None else (0.005 if gpu else 0.02),
            memory_budget=float(budget),
            threads=self.threads or (torch.get_num_threads() if gpu else 1),
            check_max_len=self.check_max_len or (4096 if gpu else 1024),
            model_max_len=self.model_max_len or (2**62 if gpu else 4096),
            out=self.out or Path("benchmarks/results") / ("gpu" if gpu else "cpu"),
        )


@dataclass(frozen=True)
class Shape:
    """One problem size: batch B, heads H, head dim D, length L."""

    batch: int
    heads: int
    d_head: int
    length: int

    @property
    def width(self) -> int:
        return self.heads * self.d_head

    def label(self) -> str:
        return f"B{self.batch}-H{self.heads}-D{self.d_head}-L{self.length}"


@dataclass(frozen=True)
class ResolvedConfig:
    """The concrete settings of one run (``BenchConfig.resolve()``)."""

    config: BenchConfig
    device: torch.device
    dtype: torch.dtype
    dtype_name: str
    shapes: tuple[Shape, ...]
    targets: tuple[str, ...]
    repeats: int
    min_repeat_s: float
    memory_budget: float
    threads: int
    check_max_len: int
    model_max_len: int
    out: Path

    def to_dict(self) -> dict[str, Any]:
        cfg = {f.name: getattr(self.config, f.name) for f in dataclasses.fields(self.config)}
        cfg["out"] = str(cfg["out"]) if cfg["out"] is not None else None
        return {
            "config": cfg,
            "device": str(self.device),
            "dtype": self.dtype_name,
            "shapes": [dataclasses.asdict(s) for s in self.shapes],
            "targets": list(self.targets),
            "repeats": self.repeats,
            "min_repeat_s": self.min_repeat_s,
            "memory_budget_bytes": self.memory_budget,
            "threads": self.threads,
            "check_max_len": self.check_max_len,
            "model_max_len": self.model_max_len,
            "out": str(self.out),
        }


def available_ram_bytes() -> float:
    """MemAvailable from /proc/meminfo (fallback: 8 GiB)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float(8 * 2**30)
