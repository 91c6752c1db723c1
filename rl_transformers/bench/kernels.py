"""Kernel census of one benchmark call: which attention kernels ran and the FLOPs they really did.

The rows' ``tflops`` are dense-equivalent (``rows.flops``: the same formula for every variant); this census
measures what a call actually issued, so a sparse kernel's use of the device can be read against the measured
peak. One extra call of the op runs under ``torch.profiler`` (CPU activity with shapes and FLOPs: the dispatcher
records every aten op, composite ones included, on any device and around compiled code), and:

- **backends**: the attention kernels the call reached - SDPA's ``flash``, ``efficient``, ``cudnn``,
  ``cpu_flash`` (the CPU's fused kernel), ``math`` (SDPA's unfused fallback), ``overrideable``, FlexAttention
  (``flex``, counted by ``attention/_flex.py``), or ``matmul`` when no attention kernel ran (the blocked /
  linear / eager forms: their products and softmax are separate ops);
- **flops**: matrix products counted by the profiler (mm, bmm, addmm, baddbmm: 2·m·n·k each, both passes), fused
  SDPA calls 4·B·H·T·S·D forward (halved when causal over a square T x S), backward 2.5 x that (the
  FlashAttention convention), and each flex call's computed tiles (``_flex.tile_flops``). Elementwise work
  (softmax, masks, gathers) is not counted: it is traffic, not FLOPs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch.profiler import ProfilerActivity, profile

from rl_transformers.backbone.attention import _flex

SDPA_KERNELS: dict[str, tuple[str, int, bool]] = {
    # aten op -> (backend, index of is_causal among its inputs, backward)  [native_functions.yaml signatures]
    "aten::_scaled_dot_product_flash_attention": ("flash", 4, False),
    "aten::_scaled_dot_product_flash_attention_backward": ("flash", 11, True),
    "aten::_scaled_dot_product_efficient_attention": ("efficient", 6, False),
    "aten::_scaled_dot_product_efficient_attention_backward": ("efficient", 11, True),
    "aten::_scaled_dot_product_cudnn_attention": ("cudnn", 6, False),
    "aten::_scaled_dot_product_cudnn_attention_backward": ("cudnn", 14, True),
    "aten::_scaled_dot_product_flash_attention_for_cpu": ("cpu_flash", 4, False),
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": ("cpu_flash", 7, True),
    "aten::_scaled_dot_product_fused_attention_overrideable": ("overrideable", 5, False),
}
MATH = "aten::_scaled_dot_product_attention_math"
MATMULS = frozenset({"aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm"})


@dataclass
class Census:
    """What one call ran."""

    backends: list[str] = field(default_factory=list)
    """Sorted attention kernels seen (see the module docstring)."""
    flops: float = 0.0
    """FLOPs the call's kernels did (matrix products and fused attention)."""


def sdpa_flops(event: Any, causal_index: int, backward: bool) -> float:
    """FLOPs of one fused SDPA kernel from its recorded shapes: q (B, H, T, D), k (B, H, S, D)."""
    shapes = [s for s in event.input_shapes if len(s) == 4]
    q, k = (shapes[1], shapes[2]) if backward else (shapes[0], shapes[1])
    if len(q) != 4 or len(k) != 4:
        return 0.0
    b, h, t, d = q
    s = k[2]
    inputs = list(event.concrete_inputs or [])
    causal = len(inputs) > causal_index and inputs[causal_index] is True
    fwd = 4.0 * b * h * t * s * d * (0.5 if causal and t == s else 1.0)
    return 2.5 * fwd if backward else fwd


def census(fn: Callable[[], Any]) -> Census:
    """Run ``fn`` once under the profiler and return its :class:`Census`."""
    work: list[float] = []
    previous, _flex.WORK = _flex.WORK, work
    try:
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_flops=True) as prof:
            fn()
    finally:
        _flex.WORK = previous
    result = Census(flops=float(sum(work)))
    seen = {"flex"} if work else set()
    for event in prof.events():
        name = event.name
        if name in SDPA_KERNELS:
            backend, index, backward = SDPA_KERNELS[name]
            seen.add(backend)
            result.flops += sdpa_flops(event, index, backward)
        elif name == MATH:
            seen.add("math")  # its products are counted below as matmuls
        elif name in MATMULS and not _nested(event):
            result.flops += float(event.flops or 0)
    if not seen:
        seen.add("matmul")
    result.backends = sorted(seen)
    return result


def _nested(event: Any) -> bool:
    """A product counted elsewhere: inside another product, or inside a flex call (its eager CPU form runs
    products of its own; the flex work is counted from the block mask)."""
    parent = event.cpu_parent
    while parent is not None:
        if parent.name in MATMULS or parent.name.startswith("FlexAttention"):
            return True
        parent = parent.cpu_parent
    return False
