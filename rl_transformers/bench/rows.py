"""One benchmark row: its fields before timing, the dense-equivalent FLOP formula, and skip marking."""

from __future__ import annotations

from typing import Any

from rl_transformers.backbone import registry
from rl_transformers.bench.config import ResolvedConfig, Shape
from rl_transformers.bench.ops import Impl, Op, resolved_options


def flops(target: str, mode: str, shape: Shape, causal: bool, n_layers: int) -> float:
    """Dense-equivalent FLOPs of one call (stated in the README; the same formula for every variant).

    Attention: 4·B·H·L²·D forward (QKᵀ and PV, 2 FLOPs per multiply-add), halved when causal; a step attends
    L + 1 keys: 4·B·H·(L+1)·D. Backward = 2.5 x forward (fwd+bwd = 3.5 x fwd, the FlashAttention convention).
    Layer adds the four d x d projections, 8·B·T·d²; a model block adds the FFN (width 4d), 16·B·T·d², per
    layer; backward of these matmuls = 2 x forward (fwd+bwd = 3 x fwd).
    """
    b, h, d, length = shape.batch, shape.heads, shape.d_head, shape.length
    if mode == "step":
        attn, tokens = 4.0 * b * h * (length + 1) * d, 1
    else:
        attn, tokens = 4.0 * b * h * length * length * d * (0.5 if causal else 1.0), length
    width = shape.width
    dense = 0.0
    if target in ("layer", "model"):
        dense += 8.0 * b * tokens * width**2
    if target == "model":
        dense += 16.0 * b * tokens * width**2
    layers = n_layers if target == "model" else 1
    if mode == "backward":
        return layers * (3.5 * attn + 3.0 * dense)
    return layers * (attn + dense)


def base_row(
    rc: ResolvedConfig,
    impl: Impl,
    label: str,
    position: str,
    target: str,
    mode: str,
    shape: Shape,
    causal: bool,
    load: float,
) -> dict[str, Any]:
    note = ""
    if impl.kind != "sdpa" and causal != rc.config.causal:
        note = (
            "non-causal only: run non-causal, compared with SDPA non-causal"
            if rc.config.causal
            else "causal only: run causal, compared with SDPA causal"
        )
    if impl.kind == "ours" and target == "kernel" and position != "none":
        kind = registry.get("position", position).cls.kind
        if kind in ("input", "qk"):
            note = (
                note + "; " if note else ""
            ) + f"position {position!r} ({kind}) is applied outside the kernel"
    if impl.kind == "peer" and impl.peer.different_operator and causal:
        note = (note + "; " if note else "") + f"different operator: {impl.peer.different_operator}"
    return {
        "variant": label,
        "kind": impl.kind,
        "attention": impl.attention if impl.kind != "peer" else None,
        "options": resolved_options(impl, shape.length),
        "exact": impl.exact,
        "streaming": impl.streaming,
        "position": position if impl.kind != "peer" else "none",
        "target": target,
        "mode": mode,
        "causal": causal,
        "causal_requested": rc.config.causal,
        "batch": shape.batch,
        "heads": shape.heads,
        "d_head": shape.d_head,
        "length": shape.length,
        "dtype": rc.dtype_name,
        "device": str(rc.device),
        "compiled": False,
        "status": "pending",
        "reason": "",
        "note": note,
        "time_ms": None,
        "time_ms_q1": None,
        "time_ms_q3": None,
        "time_ms_iqr": None,
        "repeats": 0,
        "loops": None,
        "early_stop": False,
        "first_call_ms": None,
        "tokens_per_s": None,
        "flops": flops(target, mode, shape, causal, rc.config.n_layers),
        "tflops": None,
        "backends": None,
        "real_flops": None,
        "real_tflops": None,
        "peak_mem_bytes": None,
        "mem_method": None,
        "mem_estimate_bytes": None,
        "ratio_sdpa": None,
        "num_err": None,
        "num_tol": None,
        "ref_err": None,
        "ref_tol": None,
        "probe": None,
        "checked_at": None,
        "loadavg": load,
    }


def skip(row: dict[str, Any], reason: str) -> Op | None:
    """Mark ``row`` skipped with ``reason``; returns None (no op to time)."""
    row["status"] = "skipped"
    row["reason"] = reason if reason.startswith("skipped") else f"skipped ({reason})"
    return None
