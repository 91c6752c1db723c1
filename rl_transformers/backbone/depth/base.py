"""The depth-controller interface and ``fixed`` depth (a stack of ``n_layers`` distinct blocks).

A depth controller owns the blocks and the loop over them: it receives a ``make_block(i)`` factory, builds what
it needs (``fixed``: n_layers blocks; ``universal``: one shared block), and maps x (B, T, d) plus one attention
state per layer application to the output and the new states. It calls ``ctx.enter_layer(x, i)`` with the
hidden states entering layer i (absolute position schemes add their per-layer embeddings there).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import torch
from torch import Tensor, nn

from rl_transformers.backbone.blocks import Block
from rl_transformers.backbone.context import ForwardContext
from rl_transformers.backbone.registry import register


class Depth(nn.Module):
    Options: ClassVar[type]
    registry_name: ClassVar[str]

    def __init__(self, cfg: Any, options: Any, make_block: Callable[[int], Block]) -> None:
        super().__init__()
        self.cfg = cfg
        self.options = options

    @property
    def n_applications(self) -> int:
        """Number of layer applications (= number of per-layer attention states)."""
        return self.cfg.n_layers

    def attention_for(self, application: int) -> nn.Module:
        """The attention module used at layer application ``application`` (for its ``init_state``)."""
        raise NotImplementedError

    def init_state(self, batch: int, device: torch.device | None, dtype: torch.dtype) -> Any:
        """The controller's own state (None for most)."""
        return None

    def forward(
        self, x: Tensor, ctx: ForwardContext, states: tuple[Any, ...], depth_state: Any = None
    ) -> tuple[Tensor, tuple[Any, ...], Any]:
        raise NotImplementedError

    @classmethod
    def check_config(cls, cfg: Any, options: Any) -> None:
        return None


@dataclass(frozen=True)
class FixedOptions:
    """``fixed`` depth takes no options."""


@register("depth", "fixed", options=FixedOptions)
class FixedDepth(Depth):
    def __init__(self, cfg: Any, options: Any, make_block: Callable[[int], Block]) -> None:
        super().__init__(cfg, options, make_block)
        self.blocks = nn.ModuleList(make_block(i) for i in range(cfg.n_layers))

    def attention_for(self, application: int) -> nn.Module:
        return cast(Block, self.blocks[application]).attention

    def forward(
        self, x: Tensor, ctx: ForwardContext, states: tuple[Any, ...], depth_state: Any = None
    ) -> tuple[Tensor, tuple[Any, ...], Any]:
        blocks = cast(list[Block], list(self.blocks))
        x, new_states = type(blocks[0]).run_stack(blocks, x, ctx, states)
        return x, new_states, depth_state
