"""BackboneConfig: the one typed description of a backbone.

A config names one registry entry per family (attention, position, memory, block, depth) and carries that
entry's options as a plain dict (JSON / CLI friendly) or as the entry's options dataclass. Options are validated
against the entry's dataclass in ``__post_init__``; ``cfg.options(kind)`` returns the typed instance.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from rl_transformers.backbone import registry
from rl_transformers.backbone.options import (
    check_choice,
    check_int,
    check_probability,
    check_types,
)
from rl_transformers.utils.errors import UserError, closest

Activation = Literal["relu", "gelu"]
KINDS = ("attention", "position", "memory", "block", "depth")
_OPTIONS = tuple(f"{kind}_options" for kind in KINDS)


@dataclass(frozen=True)
class BackboneConfig:
    """Shape, variant names and per-variant options of a :class:`~rl_transformers.backbone.Backbone`."""

    d_model: int = 64
    """Model width d."""
    n_layers: int = 2
    """Number of blocks (for ``depth="universal"``: the maximum number of applications of the shared block)."""
    n_heads: int = 4
    """Attention heads H; ``d_model`` must be divisible by it (head dim D = d_model / H)."""
    d_ff: int | None = None
    """Feed-forward hidden width (default 4 * d_model)."""
    dropout: float = 0.0
    """Dropout on attention probabilities and residual branches (and the FFN hidden layer, see ffn_dropout)."""
    ffn_dropout: float | None = None
    """Dropout on the FFN hidden layer; None: ``dropout`` (Vaswani et al.'s tensor2tensor). GPT-2, the Decision
    Transformer's network, has none there (0.0)."""
    activation: Activation = "relu"
    """FFN activation: relu or gelu."""
    causal: bool = True
    """Causal (autoregressive) attention. RL policies are causal; set False for bidirectional encoders."""
    attention: str = "full"
    """Attention registry name (see ``available()["attention"]``)."""
    attention_options: Any = field(default_factory=dict)
    """Options of the attention entry (dict or its options dataclass)."""
    position: str = "rope"
    """Positional scheme registry name."""
    position_options: Any = field(default_factory=dict)
    """Options of the positional scheme."""
    memory: str | None = None
    """Memory registry name (``xl``, ``compressive``, ``knn``) or None."""
    memory_options: Any = field(default_factory=dict)
    """Options of the memory entry."""
    block: str = "pre_ln"
    """Block registry name (``post_ln``, ``pre_ln``, ``gtrxl``, ``rezero``, ``reversible``)."""
    block_options: Any = field(default_factory=dict)
    """Options of the block (all blocks accept ``ffn_chunks``)."""
    depth: str = "fixed"
    """Depth control: ``fixed``, ``universal`` (shared weights + ACT), ``early_exit``."""
    depth_options: Any = field(default_factory=dict)
    """Options of the depth controller."""

    def __post_init__(self) -> None:
        plain = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in _OPTIONS}
        check_types(BackboneConfig, plain, "BackboneConfig.")
        for name in ("d_model", "n_layers", "n_heads"):
            check_int(f"BackboneConfig.{name}", getattr(self, name), 1)
        if self.d_model % self.n_heads:
            raise UserError(
                f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                f"valid n_heads for this width: {[h for h in range(1, self.d_model + 1) if self.d_model % h == 0]}"
            )
        check_int("d_ff", self.d_ff, 1, optional=True)
        check_probability("dropout", self.dropout)
        check_probability("ffn_dropout", self.ffn_dropout, optional=True)
        check_choice("activation", self.activation, Activation)
        for kind in KINDS:
            name = getattr(self, kind)
            if name is None:
                if kind != "memory":
                    raise UserError(f"{kind} may not be None (only memory is optional)")
                continue
            entry = registry.get(kind, name)
            # Normalise the options to a plain dict (JSON / CLI form) after validating them.
            typed = registry.build_options(kind, name, getattr(self, f"{kind}_options"))
            object.__setattr__(self, f"{kind}_options", options_to_dict(typed))
            entry.validate(self, typed)

    # -- derived values ---------------------------------------------------------------------------------------
    @property
    def d_head(self) -> int:
        """Head dimension D = d_model / n_heads."""
        return self.d_model // self.n_heads

    @property
    def ffn_width(self) -> int:
        """Feed-forward hidden width."""
        return self.d_ff if self.d_ff is not None else 4 * self.d_model

    @property
    def aux_loss_names(self) -> tuple[str, ...]:
        """Names the selected entries may add to ``BackboneOutput.aux_losses`` (their ``aux_losses`` attribute)."""
        names: list[str] = []
        for kind in KINDS:
            name = getattr(self, kind)
            if name is not None:
                names += getattr(registry.get(kind, name).cls, "aux_losses", ())
        return tuple(names)

    def options(self, kind: str) -> Any:
        """The typed options dataclass of the ``kind`` entry (attention, position, memory, block, depth)."""
        check_choice("kind", kind, KINDS)
        name = getattr(self, kind)
        if name is None:
            return None
        return registry.build_options(kind, name, getattr(self, f"{kind}_options"))

    def replace(self, **changes: Any) -> BackboneConfig:
        """A copy with some fields changed (options of a changed entry reset unless given)."""
        for kind in KINDS:
            if kind in changes and f"{kind}_options" not in changes and changes[kind] != getattr(self, kind):
                changes[f"{kind}_options"] = {}
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BackboneConfig:
        valid = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - valid)
        if unknown:
            hints = [f"{u!r} (did you mean {m!r}?)" if (m := closest(u, valid)) else repr(u) for u in unknown]
            raise UserError(
                f"unknown BackboneConfig fields {', '.join(hints)}; valid fields: {sorted(valid)}"
            )
        return cls(**data)


def options_to_dict(options: Any) -> dict[str, Any]:
    """Options dataclass -> plain dict (tuples become lists so the dict is JSON-stable)."""
    out = {}
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        out[f.name] = list(value) if isinstance(value, tuple) else value
    return out
