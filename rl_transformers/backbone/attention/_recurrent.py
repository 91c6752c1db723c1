"""Plumbing shared by the recurrent matrix-state mixers (``retnet``, ``gla``, ``mamba2``, ``mlstm``,
``deltanet``, ``gated_deltanet``): attention entries whose streaming state is a constant-size matrix per head.

They take q, k, v from :class:`Attention`'s projections (B, H, T, D), read the layer input x (B, T, d) for their
gates (``ForwardContext.attention_inputs``), and run a chunked operator of ``_gated_ops``. Rows restarting inside
the window (``ForwardContext.segment``) restart the recurrence there, so they mask by segment. They keep their
own state and take no memory module (``check_config`` asks for ``memory=None``). Position kinds none, input
and qk: the decay already orders the tokens, so the papers use none (RetNet: the xPos rotation, here ``rope``);
``rope`` rotates q and k (mamba2: C and B) before the kernel. Padded tokens (``k_valid``
False) neither write nor decay the state. States are kept in float32 or wider (``work_dtype``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from rl_transformers.backbone.attention.base import Attention
from rl_transformers.backbone.attention.linear import check_chunk_size, work_dtype
from rl_transformers.backbone.context import ForwardContext
from rl_transformers.backbone.state import State


@dataclass
class MatrixState(State):
    """s (B, H, K, V): the matrix memory of every head. The empty state is zeros (the base ``reset`` applies)."""

    s: Tensor


@dataclass(frozen=True)
class ChunkOptions:
    chunk_size: int = 64
    """C: tokens per chunk of the parallel form (a computation schedule: the result does not depend on it)."""

    def __post_init__(self) -> None:
        check_chunk_size(self.chunk_size)


class HeadNorm(nn.Module):
    """RMS norm of each head's output (the per-head GroupNorm of RetNet / GLA), learnable gain (H, D)."""

    def __init__(self, n_heads: int, d_head: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n_heads, 1, d_head))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        """x (B, H, T, D) -> same shape."""
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class RecurrentMixer(Attention):
    """Base of the matrix-state mixers: state, segments, padding and the memory refusal."""

    kernel_form: ClassVar[bool] = False  # the gates read the layer input: no q, k, v kernel alone

    position_kinds = frozenset({"none", "input", "qk"})
    segment_masks = True

    @classmethod
    def check_config(cls, cfg: Any, options: Any) -> None:
        super().check_config(cfg, options)
        if cfg.memory is not None:
            raise ValueError(
                f"attention {cls.registry_name!r} keeps its own recurrent state and takes no memory module, got "
                f"memory={cfg.memory!r}; set memory=None (--backbone.memory None)"
            )

    def state_shape(self) -> tuple[int, int]:
        """(K, V) of each head's matrix."""
        return self.d_head, self.d_head

    def init_state(self, batch: int, device: torch.device | None, dtype: torch.dtype) -> Any:
        kd, vd = self.state_shape()
        return MatrixState(s=torch.zeros(batch, self.n_heads, kd, vd, device=device, dtype=work_dtype(dtype)))

    def layer_input(self, ctx: ForwardContext, v: Tensor) -> Tensor:
        """x (B, T, d): the input of this attention application (its gates read it). When ``core`` runs on
        q, k, v alone (no ``forward``: the kernel target of the attention benchmark), the values v (B, H, T, D)
        merged over heads stand in."""
        return ctx.attention_inputs[-1] if ctx.attention_inputs else self.merge_heads(v)

    @staticmethod
    def segments(ctx: ForwardContext) -> Tensor | None:
        """(B, 1, T) segment of each token (broadcast over heads), or None when no row restarts."""
        return None if ctx.segment is None else ctx.segment[:, None, :]

    @staticmethod
    def padding(ctx: ForwardContext, k_valid: Tensor) -> Tensor | None:
        """(B, 1, T, 1) bool: True for real tokens, False for padding; None without padding."""
        if ctx.all_valid or (not torch.compiler.is_compiling() and bool(k_valid.all())):
            return None
        return k_valid[:, None, :, None]

    def carried(self, state: Any, b: int, device: torch.device, dtype: torch.dtype) -> Tensor:
        """The carried matrix (B, H, K, V) in ``dtype`` (zeros without a state)."""
        if isinstance(state, MatrixState):
            return state.s.to(dtype)
        kd, vd = self.state_shape()
        return torch.zeros(b, self.n_heads, kd, vd, device=device, dtype=dtype)

    def new_state(self, state: Any, s_end: Tensor) -> Any:
        return MatrixState(s=s_end.to(state.s.dtype)) if isinstance(state, MatrixState) else state
