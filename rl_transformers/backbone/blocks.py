"""Transformer blocks: how attention and feed-forward sub-layers are wrapped with norms and residuals.

- ``post_ln`` (Vaswani et al. 2017, arXiv 1706.03762): x = LN(x + Attn(x)); x = LN(x + FFN(x)).
- ``pre_ln`` (Xiong et al. 2020, arXiv 2002.04745): x = x + Attn(LN(x)); x = x + FFN(LN(x)); final LN.
- ``gtrxl`` (Parisotto et al. 2019, arXiv 1910.06764): identity-map reordering (LN on the branch input only,
  ReLU on the branch output) and a GRU-type gate instead of each residual sum, with gate bias b_g (default 2.0)
  so that at initialisation the block is close to the identity.
- ``rezero`` (Bachlechner et al. 2020, arXiv 2003.04887): x = x + α·F(x) with a scalar α initialised at 0.
- ``reversible`` (Gomez et al. 2017, arXiv 1707.04585; Kitaev et al. 2020, arXiv 2001.04451): two streams,
  y1 = x1 + Attn(x2), y2 = x2 + FFN(y1); activations are recomputed in backward (see ``reversible.py``).

Every block takes ``ffn_chunks``: the position-wise FFN is applied to ``ffn_chunks`` slices of the sequence in
turn, which bounds the size of its hidden activation (Kitaev 2020, §3 "chunking"). Shapes: x (B, T, d).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import torch
from torch import Tensor, nn

from rl_transformers.backbone.attention.base import Attention
from rl_transformers.backbone.context import ForwardContext
from rl_transformers.backbone.registry import register


@dataclass(frozen=True)
class BlockOptions:
    ffn_chunks: int = 1
    """Apply the FFN to this many sequence chunks in turn (bounds its activation memory)."""

    def __post_init__(self) -> None:
        if self.ffn_chunks < 1:
            raise ValueError(f"ffn_chunks must be >= 1, got {self.ffn_chunks!r}")


class FeedForward(nn.Module):
    """Position-wise FFN d -> d_ff -> d, optionally applied chunk by chunk along the sequence."""

    def __init__(self, cfg: Any, chunks: int = 1) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.d_model, cfg.ffn_width)
        self.fc2 = nn.Linear(cfg.ffn_width, cfg.d_model)
        self.act: nn.Module = nn.GELU() if cfg.activation == "gelu" else nn.ReLU()
        self.dropout = nn.Dropout(cfg.dropout if cfg.ffn_dropout is None else cfg.ffn_dropout)
        self.chunks = chunks

    def _ffn(self, x: Tensor) -> Tensor:
        hidden = self.act(self.fc1(x))
        return self.fc2(self.dropout(hidden) if self.training and self.dropout.p > 0 else hidden)

    def forward(self, x: Tensor) -> Tensor:
        if self.chunks == 1 or x.shape[1] <= 1:
            return self._ffn(x)
        return torch.cat([self._ffn(part) for part in x.chunk(self.chunks, dim=1)], dim=1)


class Block(nn.Module):
    """Base block. Subclasses implement :meth:`forward`; ``final_norm`` asks the model for a last LayerNorm."""

    Options: ClassVar[type]
    registry_name: ClassVar[str]
    final_norm: ClassVar[bool] = True

    def __init__(self, cfg: Any, options: BlockOptions, attention: Attention, layer: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.options = options
        self.attention = attention
        self.layer = layer
        self.ffn = FeedForward(cfg, options.ffn_chunks)
        self.dropout = nn.Dropout(cfg.dropout)

    def drop(self, x: Tensor) -> Tensor:
        """Residual-branch dropout; with p = 0 (or in eval mode) x itself, without a module call."""
        return self.dropout(x) if self.training and self.dropout.p > 0 else x

    def forward(self, x: Tensor, ctx: ForwardContext, state: Any) -> tuple[Tensor, Any]:
        raise NotImplementedError

    @classmethod
    def check_config(cls, cfg: Any, options: Any) -> None:
        return None

    @classmethod
    def run_stack(
        cls, blocks: list[Block], x: Tensor, ctx: ForwardContext, states: tuple[Any, ...]
    ) -> tuple[Tensor, tuple[Any, ...]]:
        """Apply ``blocks`` in order (reversible blocks override this to recompute activations in backward)."""
        new_states = []
        for i, block in enumerate(blocks):
            x = ctx.enter_layer(x, i)
            x, s = block(x, ctx, states[i])
            new_states.append(s)
        return x, tuple(new_states)


@register("block", "post_ln", options=BlockOptions)
class PostLNBlock(Block):
    final_norm = False

    def __init__(self, cfg: Any, options: BlockOptions, attention: Attention, layer: int) -> None:
        super().__init__(cfg, options, attention, layer)
        self.norm1 = nn.LayerNorm(cfg.d_model)
        self.norm2 = nn.LayerNorm(cfg.d_model)

    def forward(self, x: Tensor, ctx: ForwardContext, state: Any) -> tuple[Tensor, Any]:
        a, state = self.attention(x, ctx, state)
        x = self.norm1(x + self.drop(a))
        x = self.norm2(x + self.drop(self.ffn(x)))
        return x, state


@register("block", "pre_ln", options=BlockOptions)
class PreLNBlock(Block):
    def __init__(self, cfg: Any, options: BlockOptions, attention: Attention, layer: int) -> None:
        super().__init__(cfg, options, attention, layer)
        self.norm1 = nn.LayerNorm(cfg.d_model)
        self.norm2 = nn.LayerNorm(cfg.d_model)

    def forward(self, x: Tensor, ctx: ForwardContext, state: Any) -> tuple[Tensor, Any]:
        a, state = self.attention(self.norm1(x), ctx, state)
        x = x + self.drop(a)
        x = x + self.drop(self.ffn(self.norm2(x)))
        return x, state


@dataclass(frozen=True)
class GTrXLOptions(BlockOptions):
    gate_bias: float = 2.0
    """b_g: subtracted inside the update gate z = σ(W_z y + U_z x − b_g); large b_g = identity at init."""


class GRUGate(nn.Module):
    """GRU-type gating g(x, y) of Parisotto 2019 (eq. in §3.2), x = residual stream, y = branch output."""

    def __init__(self, d: int, gate_bias: float) -> None:
        super().__init__()
        self.w = nn.Linear(d, 3 * d, bias=False)  # W_r, W_z, W_g applied to y
        self.u_rz = nn.Linear(d, 2 * d, bias=False)  # U_r, U_z applied to x
        self.u_g = nn.Linear(d, d, bias=False)  # U_g applied to r ⊙ x
        self.gate_bias = gate_bias

    def forward(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        wr, wz, wg = self.w(y).chunk(3, dim=-1)
        ur, uz = self.u_rz(x).chunk(2, dim=-1)
        r = torch.sigmoid(wr + ur)
        z = torch.sigmoid(wz + uz - self.gate_bias)
        h = torch.tanh(wg + self.u_g(r * x))
        return (1 - z) * x + z * h, z


@register("block", "gtrxl", options=GTrXLOptions)
class GTrXLBlock(Block):
    def __init__(self, cfg: Any, options: GTrXLOptions, attention: Attention, layer: int) -> None:
        super().__init__(cfg, options, attention, layer)
        self.norm1 = nn.LayerNorm(cfg.d_model)
        self.norm2 = nn.LayerNorm(cfg.d_model)
        self.gate1 = GRUGate(cfg.d_model, options.gate_bias)
        self.gate2 = GRUGate(cfg.d_model, options.gate_bias)

    def forward(self, x: Tensor, ctx: ForwardContext, state: Any) -> tuple[Tensor, Any]:
        a, state = self.attention(self.norm1(x), ctx, state)
        x, z1 = self.gate1(x, torch.relu(self.drop(a)))
        x, z2 = self.gate2(x, torch.relu(self.drop(self.ffn(self.norm2(x)))))
        if ctx.collect_info:
            ctx.add_info(f"backbone/gate_openness/layer{self.layer}", 0.5 * (z1.mean() + z2.mean()).detach())
        return x, state


@register("block", "rezero", options=BlockOptions)
class ReZeroBlock(Block):
    final_norm = False

    def __init__(self, cfg: Any, options: BlockOptions, attention: Attention, layer: int) -> None:
        super().__init__(cfg, options, attention, layer)
        # One residual weight per sub-layer, both 0 at init: the block starts as the identity.
        self.alpha_attn = nn.Parameter(torch.zeros(()))
        self.alpha_ffn = nn.Parameter(torch.zeros(()))

    def forward(self, x: Tensor, ctx: ForwardContext, state: Any) -> tuple[Tensor, Any]:
        a, state = self.attention(x, ctx, state)
        x = x + self.alpha_attn * self.drop(a)
        x = x + self.alpha_ffn * self.drop(self.ffn(x))
        return x, state


@dataclass(frozen=True)
class ReversibleOptions(BlockOptions):
    recompute: bool = True
    """Recompute activations in backward (the point of the block). False = plain autograd through the same
    two-stream computation (stores activations; for debugging and for the gradient-equality test)."""


def _rng_state(device: torch.device) -> tuple[Tensor, Tensor | None]:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def _set_rng_state(state: tuple[Tensor, Tensor | None], device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def _layer_context(ctx: ForwardContext, layer: int) -> ForwardContext:
    """A copy of ``ctx`` as seen by attention application ``layer`` (for recomputation in backward)."""
    return dataclasses.replace(ctx, attention_inputs=list(ctx.attention_inputs[:layer]), aux={}, info=None)


class _ReversibleStack(torch.autograd.Function):
    """y1 = x1 + F_i(x2), y2 = x2 + G_i(y1) over all blocks, storing only the last (y1, y2).

    Backward walks the blocks in reverse, reconstructing x2 = y2 - G(y1) and x1 = y1 - F(x2) and
    back-propagating through one recomputed block at a time (Gomez 2017, Alg. 1). Dropout masks are reproduced
    by restoring the RNG state saved before each sub-layer. Gradients do not flow into the incoming state.
    """

    @staticmethod
    def forward(fctx, x, blocks, ctx, states, out_states, params_len, *params):  # type: ignore[override]
        rngs = []
        with torch.no_grad():
            x1 = x2 = x
            for i, block in enumerate(blocks):
                rng_f = _rng_state(x.device)
                f, s = block.f(x2, ctx, states[i])
                y1 = x1 + f
                rng_g = _rng_state(x.device)
                y2 = x2 + block.g(y1)
                x1, x2 = y1, y2
                out_states.append(s)
                rngs.append((rng_f, rng_g))
        fctx.save_for_backward(x1, x2)
        fctx.blocks, fctx.ctx, fctx.states, fctx.rngs, fctx.params = blocks, ctx, states, rngs, params
        return (x1 + x2) / 2

    @staticmethod
    def backward(fctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        y1, y2 = fctx.saved_tensors
        params = fctx.params
        dy1 = dy2 = grad_out / 2
        param_grads: list[Tensor | None] = [None] * len(params)

        def accumulate(grads: tuple[Tensor | None, ...]) -> None:
            for j, g in enumerate(grads):
                if g is not None:
                    prev = param_grads[j]
                    param_grads[j] = g if prev is None else prev + g

        device = y1.device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            for i in reversed(range(len(fctx.blocks))):
                block = fctx.blocks[i]
                rng_f, rng_g = fctx.rngs[i]
                with torch.enable_grad():
                    y1r = y1.detach().requires_grad_(True)
                    _set_rng_state(rng_g, device)
                    g = block.g(y1r)
                grads = torch.autograd.grad(g, (y1r, *params), dy2, allow_unused=True)
                dy1 = dy1 + grads[0]
                accumulate(grads[1:])
                x2 = (y2 - g).detach()
                with torch.enable_grad():
                    x2r = x2.requires_grad_(True)
                    _set_rng_state(rng_f, device)
                    f, _ = block.f(x2r, _layer_context(fctx.ctx, i), fctx.states[i])
                grads = torch.autograd.grad(f, (x2r, *params), dy1, allow_unused=True)
                dy2 = dy2 + grads[0]
                accumulate(grads[1:])
                y1, y2 = (y1 - f).detach(), x2
        return (dy1 + dy2, None, None, None, None, None, *param_grads)


@register("block", "reversible", options=ReversibleOptions)
class ReversibleBlock(Block):
    """One reversible layer: F = Attn(LN(·)), G = FFN(LN(·)); the stack runs as two streams (see run_stack)."""

    def __init__(self, cfg: Any, options: ReversibleOptions, attention: Attention, layer: int) -> None:
        super().__init__(cfg, options, attention, layer)
        self.norm1 = nn.LayerNorm(cfg.d_model)
        self.norm2 = nn.LayerNorm(cfg.d_model)

    def f(self, x: Tensor, ctx: ForwardContext, state: Any) -> tuple[Tensor, Any]:
        a, state = self.attention(self.norm1(x), ctx, state)
        return self.drop(a), state

    def g(self, x: Tensor) -> Tensor:
        return self.drop(self.ffn(self.norm2(x)))

    def forward(self, x: Tensor, ctx: ForwardContext, state: Any) -> tuple[Tensor, Any]:
        raise RuntimeError(
            "reversible blocks run as a whole stack (ReversibleBlock.run_stack), not one by one"
        )

    @classmethod
    def check_config(cls, cfg: Any, options: Any) -> None:
        if cfg.depth != "fixed":
            raise ValueError(
                f"block 'reversible' needs depth='fixed' (got {cfg.depth!r}): it recomputes a fixed stack"
            )
        if cfg.position == "learned" and cfg.options("position").per_layer:
            raise ValueError(
                "block 'reversible' cannot add per-layer learned positions (use per_layer=False)"
            )

    @classmethod
    def run_stack(
        cls, blocks: list[Block], x: Tensor, ctx: ForwardContext, states: tuple[Any, ...]
    ) -> tuple[Tensor, tuple[Any, ...]]:
        x = ctx.enter_layer(x, 0)
        revs: list[ReversibleBlock] = blocks  # type: ignore[assignment]
        options = cast(ReversibleOptions, revs[0].options)
        if not (options.recompute and torch.is_grad_enabled()):
            x1 = x2 = x
            new_states = []
            for i, block in enumerate(revs):
                f, s = block.f(x2, ctx, states[i])
                x1 = x1 + f
                x2 = x2 + block.g(x1)
                new_states.append(s)
            return (x1 + x2) / 2, tuple(new_states)
        aux_before = set(ctx.aux)
        params = list(
            dict.fromkeys(
                [*(p for b in revs for p in b.parameters()), *revs[0].attention.position.parameters()]
            )
        )
        params = [p for p in params if p.requires_grad]
        out_states: list[Any] = []
        y = _ReversibleStack.apply(x, revs, ctx, states, out_states, len(params), *params)
        if set(ctx.aux) - aux_before:
            raise ValueError(
                f"attention {revs[0].attention.registry_name!r} returns aux losses {sorted(set(ctx.aux) - aux_before)}, "
                "which cannot be trained through recomputing reversible blocks; use recompute=False or another block"
            )
        return y, tuple(out_states)
