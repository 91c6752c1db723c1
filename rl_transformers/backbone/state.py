"""Streaming state: small dataclasses of batch-first tensors, returned by every forward, never kept on modules.

Every tensor field of a :class:`State` has the batch dimension first (B, ...). Non-tensor fields (ints, strings,
None) are shared by all rows. Nested states, tuples and lists of states are handled recursively, so
``index_select`` (pick env rows), ``reset(mask)`` (clear rows at an episode start) and ``detach`` (truncate
back-propagation through time) work on any state built from these pieces.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import Tensor

S = TypeVar("S", bound="State")


def _map(value: Any, fn: Callable[[Tensor], Tensor]) -> Any:
    if isinstance(value, Tensor):
        return fn(value)
    if isinstance(value, State):
        return value.map(fn)
    if isinstance(value, tuple):
        return tuple(_map(v, fn) for v in value)
    if isinstance(value, list):
        return [_map(v, fn) for v in value]
    return value


def _reset(value: Any, mask: Tensor) -> Any:
    if isinstance(value, Tensor):
        return zero_rows(value, mask)
    if isinstance(value, State):
        return value.reset(mask)  # nested states may override (e.g. XL memory clears validity only)
    if isinstance(value, tuple):
        return tuple(_reset(v, mask) for v in value)
    if isinstance(value, list):
        return [_reset(v, mask) for v in value]
    return value


def zero_rows(t: Tensor, mask: Tensor) -> Tensor:
    """Rows of ``t`` where ``mask`` (B,) is True set to zero / False (out of place)."""
    shape = (mask.shape[0],) + (1,) * (t.dim() - 1)
    keep = ~mask.to(device=t.device).view(shape)
    return torch.where(keep, t, torch.zeros((), dtype=t.dtype, device=t.device))


@dataclass
class State:
    """Base class of all states. Subclasses are dataclasses whose tensor fields are batch-first."""

    def map(self: S, fn: Callable[[Tensor], Tensor]) -> S:
        """A copy with ``fn`` applied to every tensor (recursively)."""
        changes = {f.name: _map(getattr(self, f.name), fn) for f in dataclasses.fields(self)}
        return dataclasses.replace(self, **changes)

    def index_select(self: S, index: Tensor) -> S:
        """Rows ``index`` (1-D long tensor) of every tensor."""
        return self.map(lambda t: t.index_select(0, index.to(t.device)))

    def detach(self: S) -> S:
        """Stop gradients flowing into the past."""
        return self.map(lambda t: t.detach())

    def reset(self: S, mask: Tensor | None) -> S:
        """Rows where ``mask`` (B,) bool is True become the empty state (zeros / False), others unchanged.

        Subclasses whose empty state is not all-zero override this.
        """
        if mask is None:
            return self
        # Masked arithmetic, no host sync or data-dependent branch (``mask.any()`` / ``nonzero``): the same
        # work with or without resets, so a compiled step has one graph and no break.
        changes = {f.name: _reset(getattr(self, f.name), mask) for f in dataclasses.fields(self)}
        return dataclasses.replace(self, **changes)

    @property
    def batch_size(self) -> int | None:
        sizes: list[int] = []
        self.map(lambda t: sizes.append(t.shape[0]) or t)  # type: ignore[func-returns-value]
        return sizes[0] if sizes else None


def cat_rows(states: list[S]) -> S:
    """Concatenate states of the same structure along the batch dimension."""
    first = states[0]

    def merge(values: list[Any]) -> Any:
        v0 = values[0]
        if isinstance(v0, Tensor):
            return torch.cat(values, dim=0)
        if isinstance(v0, State):
            return cat_rows(values)
        if isinstance(v0, (tuple, list)):
            merged = [merge([v[i] for v in values]) for i in range(len(v0))]
            return type(v0)(merged)
        return v0

    changes = {f.name: merge([getattr(s, f.name) for s in states]) for f in dataclasses.fields(first)}
    return dataclasses.replace(first, **changes)


@dataclass
class KVCache(State):
    """Keys and values of past tokens for exact streaming of softmax attention.

    k, v: (B, H, S, D) (keys after any rotary transform); pos: (B, S) position of each cached key;
    valid: (B, S) bool, False for padding and for entries cleared by ``reset``.
    Columns are time-aligned across rows: every forward appends T columns to all rows.
    """

    k: Tensor
    v: Tensor
    pos: Tensor
    valid: Tensor

    @classmethod
    def empty(
        cls, batch: int, n_heads: int, d_head: int, device: torch.device | None, dtype: torch.dtype
    ) -> KVCache:
        return cls(
            k=torch.zeros(batch, n_heads, 0, d_head, device=device, dtype=dtype),
            v=torch.zeros(batch, n_heads, 0, d_head, device=device, dtype=dtype),
            pos=torch.zeros(batch, 0, dtype=torch.long, device=device),
            valid=torch.zeros(batch, 0, dtype=torch.bool, device=device),
        )

    @property
    def length(self) -> int:
        return self.k.shape[2]

    def append(self, k: Tensor, v: Tensor, pos: Tensor, valid: Tensor, max_len: int | None = None) -> KVCache:
        """Append T new columns; keep only the last ``max_len`` columns when given."""
        if self.k.shape[2] > 0:  # an empty cache (e.g. a training forward without state) costs no copy
            k = torch.cat([self.k, k], dim=2)
            v = torch.cat([self.v, v], dim=2)
            pos = torch.cat([self.pos, pos], dim=1)
            valid = torch.cat([self.valid, valid], dim=1)
        return KVCache(k, v, pos, valid).trimmed(max_len)

    def trimmed(self, max_len: int | None) -> KVCache:
        """The last ``max_len`` columns (views, no copy); self when shorter or ``max_len`` is None."""
        if max_len is None or self.k.shape[2] <= max_len:
            return self
        return KVCache(
            self.k[:, :, -max_len:], self.v[:, :, -max_len:], self.pos[:, -max_len:], self.valid[:, -max_len:]
        )


@dataclass
class BackboneState(State):
    """State of a whole :class:`Backbone`.

    pos: (B,) number of tokens each row has seen since its last reset (positions of new tokens start here);
    layers: one attention state per layer (None when the attention keeps none or memory is used);
    memory: the memory module's state (or None); depth: the depth controller's state (or None).
    """

    pos: Tensor
    layers: tuple[Any, ...]
    memory: Any = None
    depth: Any = None
