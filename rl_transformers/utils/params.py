"""Parameter counts, so that runs and benchmarks that choose sizes say how big the model they built is."""

from __future__ import annotations

from torch import nn


def count_parameters(module: nn.Module, trainable_only: bool = True) -> int:
    """Number of (trainable) parameter entries of ``module``; a tensor shared by several submodules counts once."""
    sizes = {id(p): p.numel() for p in module.parameters() if p.requires_grad or not trainable_only}
    return sum(sizes.values())


def format_parameters(n: int) -> str:
    """``88,579 (88.6k)`` - exact count and a short form, for logs and tables."""
    short = f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.1f}k" if n >= 1e3 else str(n)
    return f"{n:,} ({short})"
