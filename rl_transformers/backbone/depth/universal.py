"""``universal``: Universal Transformer with Adaptive Computation Time (Dehghani et al. 2019, arXiv 1807.03819;
ACT: Graves 2016, arXiv 1603.08983).

One block (shared weights) is applied up to N = ``n_layers`` times. Before step t a sinusoidal timestep signal
of t is added (positions come from the configured position scheme), by default scaled by the RMS of each token's
input: the paper adds it to √d-scaled embeddings, O(1) per coordinate like the signal, while a policy's
observation features are ~0.2 per coordinate, which a unit signal (cos 0 = 1 on half the coordinates) drowns. Each position owns a halting unit
h_t = σ(w·s_t + b); it halts at the first step N(i) where the cumulative halting probability reaches 1 − ε (or
at step N), with remainder R(i) = 1 − Σ_{t<N(i)} h_t. The output is the halting-weighted mean of the states
Σ_t p_t s_t (p_t = h_t before halting, R at the halting step). Halted positions are copied forward: their state
stops changing, and later steps still see it as key/value, which keeps streaming exact (every step runs on all
positions and keeps its own KV cache). Ponder cost ρ = mean(N(i) + R(i)); ``aux_losses["act_ponder"]`` is τ·ρ with
τ = ``ponder_weight`` (Graves's time penalty; 0.01 as tensor2tensor's Universal Transformer, ``act_loss_weight``),
which the trainers' ``aux_coef`` / ``aux_weights`` scale again. ``info["backbone/ponder_steps"]`` reports mean
N(i) and ``info["backbone/ponder_cost"]`` ρ. Shapes: x (B, T, d).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from rl_transformers.backbone.blocks import Block
from rl_transformers.backbone.context import ForwardContext
from rl_transformers.backbone.depth.base import Depth
from rl_transformers.backbone.options import check_choice, check_number
from rl_transformers.backbone.position.absolute import sinusoid_table
from rl_transformers.backbone.registry import register


@dataclass(frozen=True)
class UniversalOptions:
    act: bool = True
    """Adaptive Computation Time halting; False = always run n_layers steps (plain shared-weight recurrence)."""
    epsilon: float = 0.01
    """A position halts when its cumulative halting probability reaches 1 − epsilon."""
    halting_bias_init: float = 1.0
    """Initial bias b of the halting unit (Graves suggests a positive bias: few steps at the start)."""
    timestep_signal: bool = True
    """Add a sinusoidal embedding of the step index before each step (Dehghani 2019, eq. 4)."""
    timestep_scale: Literal["input_rms", "unit"] = "input_rms"
    """input_rms: the signal times the RMS of the token's input to the depth (detached), so it keeps the paper's
    size relative to the features whatever their scale; unit: added as is (right for √d-scaled embeddings)."""
    ponder_weight: float = 0.01
    """τ: the aux loss ``act_ponder`` is τ·ρ. ρ >= 2 always and its gradient pulls every position to halt at the
    first step, so at τ = 1 it outweighs an RL loss; 0.01 is tensor2tensor's ``act_loss_weight``."""

    def __post_init__(self) -> None:
        if not 0.0 < self.epsilon < 1.0:
            raise ValueError(f"epsilon must be in (0, 1), got {self.epsilon!r}")
        check_choice("timestep_scale", self.timestep_scale, ("input_rms", "unit"))
        check_number("ponder_weight", self.ponder_weight, low=0.0)


@register("depth", "universal", options=UniversalOptions)
class UniversalDepth(Depth):
    aux_losses = ("act_ponder",)  # names this entry adds to BackboneOutput.aux_losses

    def __init__(self, cfg: Any, options: UniversalOptions, make_block: Callable[[int], Block]) -> None:
        super().__init__(cfg, options, make_block)
        self.block = make_block(0)
        self.halting = nn.Linear(cfg.d_model, 1)
        nn.init.zeros_(self.halting.weight)
        nn.init.constant_(self.halting.bias, options.halting_bias_init)

    def attention_for(self, application: int) -> nn.Module:
        return self.block.attention

    def forward(
        self, x: Tensor, ctx: ForwardContext, states: tuple[Any, ...], depth_state: Any = None
    ) -> tuple[Tensor, tuple[Any, ...], Any]:
        n_steps = self.cfg.n_layers
        b, t, d = x.shape
        threshold = 1.0 - self.options.epsilon
        cum = x.new_zeros(b, t)  # Σ h before the current step
        running = torch.ones(b, t, dtype=torch.bool, device=x.device)
        n_updates = x.new_zeros(b, t)
        remainders = x.new_zeros(b, t)
        output = torch.zeros_like(x)
        new_states = []
        s = x
        scale = (
            1.0 if self.options.timestep_scale == "unit" else x.pow(2).mean(-1, keepdim=True).sqrt().detach()
        )
        for step in range(n_steps):
            s_in = ctx.enter_layer(s, step)
            if self.options.timestep_signal:
                signal = sinusoid_table(torch.full((1, 1), step, device=x.device), d).to(x.dtype)
                s_in = s_in + scale * signal
            s_new, st = self.block(s_in, ctx, states[step])
            new_states.append(st)
            if not self.options.act:
                s = s_new
                continue
            h = torch.sigmoid(self.halting(s_new)).squeeze(-1)
            last = step == n_steps - 1
            halts_now = running & ((cum + h >= threshold) | last)
            continues = running & ~halts_now
            remainder = (1.0 - cum) * halts_now
            weight = h * continues + remainder
            output = output + weight.unsqueeze(-1) * s_new
            remainders = remainders + remainder
            n_updates = n_updates + running.to(x.dtype)
            cum = cum + h * continues
            # Halted positions are copied forward: their state stops changing.
            s = torch.where(running.unsqueeze(-1), s_new, s)
            running = continues
        if not self.options.act:
            return s, tuple(new_states), depth_state
        valid = ctx.valid.to(x.dtype)
        ponder = ((n_updates + remainders) * valid).sum() / valid.sum().clamp_min(1.0)
        ctx.add_aux("act_ponder", self.options.ponder_weight * ponder)
        if ctx.collect_info:
            ctx.add_info(
                "backbone/ponder_steps", ((n_updates * valid).sum() / valid.sum().clamp_min(1)).detach()
            )
            ctx.add_info("backbone/ponder_cost", ponder.detach())
        return output, tuple(new_states), depth_state

    @classmethod
    def check_config(cls, cfg: Any, options: Any) -> None:
        if cfg.memory is not None and cfg.memory != "xl":
            raise ValueError(f"depth 'universal' supports memory None or 'xl', got {cfg.memory!r}")
