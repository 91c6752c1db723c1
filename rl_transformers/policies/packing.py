"""Packing stored sequences at their episode starts, so one forward pass never mixes episodes.

A row of a (B, T) training batch may contain episode starts. :class:`Packing` cuts every row at its starts,
lays the pieces out as one right-padded batch (P, L) (a piece after a cut starts from the row's state, reset),
and maps the outputs back to (B, T). Used by :meth:`~rl_transformers.policies.actor_critic.ActorCritic.features`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class Packing:
    """Index maps between (B, T) sequences and P right-padded pieces (P, L) cut at episode starts."""

    piece: Tensor
    """(B*T,) piece of each step."""
    offset: Tensor
    """(B*T,) position of each step inside its piece."""
    row: Tensor
    """(P,) sequence (row) each piece comes from."""
    reset: Tensor
    """(P,) bool: the piece starts an episode (its state is the row's state, reset)."""
    n_pieces: int
    length: int

    @classmethod
    def from_starts(cls, starts: Tensor) -> Packing:
        b, t = starts.shape
        cut = starts.clone().to(torch.bool)
        cut[:, 0] = True
        flat_cut = cut.reshape(-1)
        piece = torch.cumsum(flat_cut.long(), 0) - 1
        time = torch.arange(t, device=starts.device).repeat(b)
        offset = time - time[flat_cut][piece]
        row = torch.arange(b, device=starts.device).repeat_interleave(t)[flat_cut]
        n_pieces = int(flat_cut.sum())
        length = int(offset.max()) + 1
        return cls(piece, offset, row, starts.reshape(-1).to(torch.bool)[flat_cut], n_pieces, length)

    def pack(self, x: Tensor) -> Tensor:
        """(B, T, *f) -> (P, L, *f), zero padding."""
        flat = x.reshape(-1, *x.shape[2:])
        out = flat.new_zeros(self.n_pieces, self.length, *x.shape[2:])
        out[self.piece, self.offset] = flat
        return out

    def unpack(self, y: Tensor, b: int, t: int) -> Tensor:
        """(P, L, *f) -> (B, T, *f)."""
        return y[self.piece, self.offset].reshape(b, t, *y.shape[2:])

    def valid(self) -> Tensor:
        mask = torch.zeros(self.n_pieces, self.length, dtype=torch.bool, device=self.piece.device)
        mask[self.piece, self.offset] = True
        return mask


__all__ = ["Packing"]
