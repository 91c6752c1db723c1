"""Baseline cores behind the transformer's interface: LSTM, GRU and a memory-less MLP.

``RecurrentCore`` (LSTM, Hochreiter & Schmidhuber 1997; GRU, Cho et al. 2014, arXiv 1406.1078) carries its
hidden state h (and cell state c for the LSTM) per env; ``reset`` zeroes the rows of envs starting an episode,
as the backbone does, so the same PPO code (state stored at each training-sequence start, sequences cut at
episode starts) trains it with truncated back-propagation through time. ``MLPCore`` has no state: it answers
"does memory help at all" on equal terms (same encoder, heads, PPO settings).

Shapes: x (B, T, d_in) -> y (B, T, hidden); state h, c (B, n_layers, hidden) (batch first, as every
:class:`~rl_transformers.backbone.state.State`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from rl_transformers.backbone.state import State
from rl_transformers.policies.cores import Core, CoreOutput


@dataclass
class RecurrentState(State):
    """h (B, L, H) hidden state; c (B, L, H) LSTM cell state (None for the GRU)."""

    h: Tensor
    c: Tensor | None = None


@dataclass
class NoState(State):
    """State of a memory-less core (nothing to carry)."""


class RecurrentCore(Core):
    """A stacked LSTM or GRU over the chunk, started from the carried state."""

    def __init__(
        self,
        kind: Literal["lstm", "gru"],
        d_in: int,
        hidden: int,
        n_layers: int = 1,
        init: Literal["orthogonal", "torch"] = "orthogonal",
    ) -> None:
        super().__init__()
        if kind not in ("lstm", "gru"):
            raise ValueError(f"recurrent kind {kind!r} is not one of ['gru', 'lstm']")
        self.kind = kind
        self.d_in, self.d_out, self.n_layers = d_in, hidden, n_layers
        rnn_cls = nn.LSTM if kind == "lstm" else nn.GRU
        self.rnn = rnn_cls(d_in, hidden, num_layers=n_layers, batch_first=True)
        if init == "torch":  # PyTorch's uniform(-1/sqrt(hidden), 1/sqrt(hidden)) as constructed
            return
        for name, p in self.rnn.named_parameters():
            if "bias" in name:
                nn.init.zeros_(p)
            else:
                nn.init.orthogonal_(p, 1.0)

    def initial_state(self, batch: int, device: torch.device | str, dtype: torch.dtype) -> RecurrentState:
        h = torch.zeros(batch, self.n_layers, self.d_out, device=device, dtype=dtype)
        return RecurrentState(h=h, c=h.clone() if self.kind == "lstm" else None)

    def forward(
        self,
        x: Tensor,
        state: Any,
        reset: Tensor | None = None,
        valid: Tensor | None = None,
        *,
        return_state: bool = True,
    ) -> CoreOutput:
        # Padding (valid=False) only ever follows the real steps of a row, so it cannot change their outputs.
        if reset is not None:
            state = state.reset(reset.to(torch.bool))
        h0 = state.h.transpose(0, 1).contiguous()
        if self.kind == "lstm":
            y, (h, c) = self.rnn(x, (h0, state.c.transpose(0, 1).contiguous()))
            return CoreOutput(y, RecurrentState(h.transpose(0, 1), c.transpose(0, 1)))
        y, h = self.rnn(x, h0)
        return CoreOutput(y, RecurrentState(h.transpose(0, 1), None))


class MLPCore(Core):
    """Memory-less core: a per-step MLP (Linear -> ReLU) x n_layers."""

    stateful = False

    def __init__(self, d_in: int, hidden: int, n_layers: int = 2) -> None:
        super().__init__()
        self.d_in, self.d_out = d_in, hidden
        layers: list[nn.Module] = []
        for i in range(n_layers):
            layers += [nn.Linear(d_in if i == 0 else hidden, hidden), nn.ReLU()]
        self.net = nn.Sequential(*layers)

    def initial_state(self, batch: int, device: torch.device | str, dtype: torch.dtype) -> NoState:
        return NoState()

    def forward(
        self,
        x: Tensor,
        state: Any,
        reset: Tensor | None = None,
        valid: Tensor | None = None,
        *,
        return_state: bool = True,
    ) -> CoreOutput:
        return CoreOutput(self.net(x), state)
