"""Absolute positional schemes added to the hidden states: ``none``, ``sinusoidal``, ``learned``.

- ``sinusoidal`` (Vaswani et al. 2017, arXiv 1706.03762): PE(p, 2i) = sin(p / 10000^(2i/d)),
  PE(p, 2i+1) = cos(p / 10000^(2i/d)), added once to the input of the first layer.
- ``learned`` (Gehring et al. 2017, arXiv 1705.03122): a trainable table of ``max_len`` vectors; with
  ``per_layer=True`` every layer adds its own table (Al-Rfou et al. 2018, arXiv 1808.04444).

Positions are per-row counts since the last reset (B, T), so streaming continues them across chunks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from rl_transformers.backbone.position.base import NoOptions, Position
from rl_transformers.backbone.registry import register


@register("position", "none", options=NoOptions)
class NoPosition(Position):
    """No positional information (a bag of tokens; causal masking still orders them)."""

    kind = "none"


def sinusoid_table(pos: Tensor, dim: int, base: float = 10000.0) -> Tensor:
    """(..., dim) sinusoidal embedding of integer positions ``pos`` (...), sin on even and cos on odd dims."""
    half = torch.arange(0, dim, 2, device=pos.device, dtype=torch.float64)
    inv_freq = torch.exp(-math.log(base) * half / dim)
    angles = pos.double().unsqueeze(-1) * inv_freq
    out = torch.zeros(*pos.shape, dim, dtype=torch.float64, device=pos.device)
    out[..., 0::2] = torch.sin(angles)
    out[..., 1::2] = torch.cos(angles[..., : dim // 2])
    return out


@dataclass(frozen=True)
class SinusoidalOptions:
    base: float = 10000.0
    """Wavelength base of the sinusoids."""

    def __post_init__(self) -> None:
        if self.base <= 1:
            raise ValueError(f"sinusoidal base must be > 1, got {self.base!r}")


@register("position", "sinusoidal", options=SinusoidalOptions)
class SinusoidalPosition(Position):
    kind = "input"
    shift_invariant = False

    def embed(self, x: Tensor, pos: Tensor, layer: int) -> Tensor:
        if layer != 0:
            return x
        return x + sinusoid_table(pos, x.shape[-1], self.options.base).to(x.dtype)


@dataclass(frozen=True)
class LearnedOptions:
    max_len: int = 1024
    """Number of learned positions; a position >= max_len raises an error."""
    per_layer: bool = False
    """Every layer adds its own table (Al-Rfou 2018) instead of only the first."""

    def __post_init__(self) -> None:
        if self.max_len < 1:
            raise ValueError(f"learned max_len must be >= 1, got {self.max_len!r}")


@register("position", "learned", options=LearnedOptions)
class LearnedPosition(Position):
    kind = "input"
    shift_invariant = False

    def __init__(self, cfg: Any, options: LearnedOptions) -> None:
        super().__init__(cfg, options)
        n_tables = cfg.n_layers if options.per_layer else 1
        tables = [nn.Embedding(options.max_len, cfg.d_model) for _ in range(n_tables)]
        for table in tables:
            nn.init.normal_(table.weight, std=0.02)
        self.tables = nn.ModuleList(tables)

    def embed(self, x: Tensor, pos: Tensor, layer: int) -> Tensor:
        if layer >= len(self.tables):
            return x
        if pos.numel() and int(pos.max()) >= self.options.max_len:
            raise ValueError(
                f"position {int(pos.max())} exceeds learned max_len={self.options.max_len}; raise "
                "position_options['max_len'] or use a relative scheme (rope, alibi, xl_relative, ...)"
            )
        return x + self.tables[layer](pos)
