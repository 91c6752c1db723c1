"""Per-forward context handed to every layer: positions, padding, memory, and the aux/info sinks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor


@dataclass
class MemoryContext:
    """Hidden states a memory module prepends on the key/value side of one layer.

    h: (B, M, d) stop-gradient hidden states; pos: (B, M) their positions; valid: (B, M) bool.
    """

    h: Tensor
    pos: Tensor
    valid: Tensor
    k: Tensor | None = None
    """(B, M, d) the layer's key projection of ``h`` (before heads and position transforms), cached while
    acting with fixed weights (``Backbone.project_memory``), or None: the attention projects ``h`` itself."""
    v: Tensor | None = None
    """(B, M, d) the value projection of ``h``, cached with ``k``."""
    kf: Tensor | None = None
    """(B, H, M, F) the key features of a feature-map attention (``Attention.memory_key_features``: position
    transform and feature map of ``k``), cached with ``k`` where the attention has them, else None."""
    hook: Callable[[Any, Tensor, Tensor, ForwardContext], Tensor] | None = None
    """Optional callback ``hook(attention, x, out, ctx) -> out`` run by the attention of this application after
    its kernel: x (B, T, d) is the attention input, out (B, H, T, D) the per-head output before the output
    projection. Lets a memory use the layer's own projections (compressive) or mix in another attention (knn)."""


@dataclass
class ForwardContext:
    """Everything a layer needs besides its input and its own state.

    pos: (B, T) positions of the new tokens; valid: (B, T) bool key-padding mask (True = real token);
    causal: causal masking; aux: named auxiliary losses (summed over layers); info: diagnostics or None.
    memory: per-layer :class:`MemoryContext` (or None) filled by the memory module.
    """

    pos: Tensor
    valid: Tensor
    causal: bool
    all_valid: bool = False
    """True when no key-padding mask was given (lets kernels skip mask checks without a device sync)."""
    aligned: bool = False
    """True when key positions are column-aligned: for every key a mask lets a query see, q_pos - k_pos equals
    their column distance (KV caches and XL memories of the Backbone: time-aligned columns, positions counted
    since the row's reset, keys from before a reset invalid). Kernels that call the scheme on the whole
    bottom-right aligned key set pass it on (``Position.logits_aligned``)."""
    aux: dict[str, Tensor] = field(default_factory=dict)
    info: dict[str, Any] | None = None
    memory: list[MemoryContext | None] | None = None
    attention_inputs: list[Tensor] = field(default_factory=list)
    """Inputs of each attention application in this forward, in order (after the block's input norm). Memory
    modules build the next memory from them; the index of an application is its position in this list."""
    extras: dict[str, Any] = field(default_factory=dict)
    """Free slots for cross-module hooks (e.g. the kNN memory's per-layer store)."""

    embed: Any = None
    """Callable (x, pos, layer) -> x adding per-layer input embeddings (absolute positional schemes)."""
    segment: Tensor | None = None
    """(B, T) long, or None: the stream segment of each new token when rows restart inside the chunk
    (``Backbone.forward(starts=...)``): 0 continues the carried state, k counts the restarts up to the token.
    Carried keys (memory, KV cache) belong to segment 0; a query sees keys of its own segment only."""

    def enter_layer(self, x: Tensor, layer: int) -> Tensor:
        """Called by depth controllers with the hidden states entering ``layer`` (adds input embeddings)."""
        if self.embed is not None:
            x = self.embed(x, self.pos, layer)
        return x

    def add_aux(self, name: str, value: Tensor) -> None:
        """Add an auxiliary loss (summed when several layers report the same name)."""
        self.aux[name] = self.aux[name] + value if name in self.aux else value

    def add_info(self, name: str, value: Any) -> None:
        if self.info is not None:
            self.info[name] = value

    @property
    def collect_info(self) -> bool:
        return self.info is not None

    def memory_for(self, layer: int) -> MemoryContext | None:
        if self.memory is None or layer >= len(self.memory):
            return None
        return self.memory[layer]
