"""``early_exit``: depth-adaptive Transformer (Elbayad et al. 2020, arXiv 1910.10073) with the confidence
measures of CALM (Schuster et al. 2022, arXiv 2207.07061).

After each layer l < L a confidence c_l(i) is computed per token; a token exits at the first layer where
c_l(i) ≥ ``threshold`` (never before ``min_layers``). An exited token's hidden state is copied upward: the later
layers still see it as key/value (so later tokens can attend to it, and streaming stays exact), but it no longer
changes, and the output is the state at the exit layer. Confidence measures:

- ``saturation``: cosine similarity between the hidden states after layer l and before it (CALM "hidden-state
  saturation");
- ``softmax``: top-1 minus top-2 probability of ``confidence_head`` applied to the state (CALM "softmax
  response"; the owner of the task head assigns it, e.g. the policy's actor logits);
- ``classifier``: σ(w·h + b), a learned exit classifier, trained with the oracle label of CALM (1 if the
  layer-l state already agrees with the final layer: same argmax of ``confidence_head`` when one is set, else
  cosine(h_l, h_L) ≥ ``oracle_cosine``), binary cross-entropy in ``aux_losses["early_exit_classifier"]``.

Exits apply in eval mode; in training mode all layers run (as in CALM, where the exit classifier is trained
from full-depth states) unless ``exit_in_training=True``. ``info["backbone/exit_layer"]`` is the mean exit
depth (1-based) and ``info["backbone/exit_layer_per_token"]`` the (B, T) exit depths. Threshold ∞ = full depth.

The default threshold 0.99 with ``saturation`` is conservative: in the encoder study's trained 2-layer GTrXL
policies the layer-1 saturation stayed at 0.95-0.98, so no token exited after the first evaluation
(docs/results/encoders_screening.md, notes). ``info["backbone/exit_layer"]`` of an eval-mode forward shows whether
exits happen (training runs at full depth unless ``exit_in_training``); lower the threshold, or calibrate it on
held-out data as CALM does, to get them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, cast, get_args

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rl_transformers.backbone.blocks import Block
from rl_transformers.backbone.context import ForwardContext
from rl_transformers.backbone.depth.base import Depth
from rl_transformers.backbone.options import check_choice, check_int
from rl_transformers.backbone.registry import register

Measure = Literal["saturation", "softmax", "classifier"]
MEASURES: tuple[str, ...] = get_args(Measure)


@dataclass(frozen=True)
class EarlyExitOptions:
    measure: Measure = "saturation"
    """Confidence measure: saturation (cosine between layers), softmax (needs confidence_head), classifier."""
    threshold: float = 0.99
    """Exit when confidence >= threshold (inf = never exit, 0 = exit after min_layers)."""
    min_layers: int = 1
    """No token exits before this many layers."""
    oracle_cosine: float = 0.9
    """Oracle label for the exit classifier when no head is set: cosine(h_l, h_L) >= this."""
    exit_in_training: bool = False
    """Apply exits in training mode too (default: train at full depth, exit at inference)."""

    def __post_init__(self) -> None:
        check_choice("early_exit measure", self.measure, Measure)
        check_int("early_exit min_layers", self.min_layers, 1)


def top2_margin(logits: Tensor) -> Tensor:
    """p_top1 − p_top2 of softmax(logits) over the last dim (1 when there is a single class)."""
    probs = torch.softmax(logits, dim=-1)
    if probs.shape[-1] < 2:
        return probs[..., 0]
    top = probs.topk(2, dim=-1).values
    return top[..., 0] - top[..., 1]


@register("depth", "early_exit", options=EarlyExitOptions)
class EarlyExitDepth(Depth):
    aux_losses = ("early_exit_classifier",)  # names this entry adds to BackboneOutput.aux_losses (classifier)

    def __init__(self, cfg: Any, options: EarlyExitOptions, make_block: Callable[[int], Block]) -> None:
        super().__init__(cfg, options, make_block)
        self.blocks = nn.ModuleList(make_block(i) for i in range(cfg.n_layers))
        self.exit_classifier = nn.Linear(cfg.d_model, 1) if options.measure == "classifier" else None
        self.confidence_head: nn.Module | None = None
        """Optional task head (d -> logits) for the softmax measure and the classifier oracle."""

    def attention_for(self, application: int) -> nn.Module:
        return cast(Block, self.blocks[application]).attention

    def confidence(self, h: Tensor, h_prev: Tensor) -> Tensor:
        measure = self.options.measure
        if measure == "saturation":
            return F.cosine_similarity(h, h_prev, dim=-1)
        if measure == "softmax":
            if self.confidence_head is None:
                raise RuntimeError(
                    "early_exit measure='softmax' needs a head: set backbone.depth.confidence_head = <module "
                    "mapping (B, T, d) to logits>, or use measure='saturation' / 'classifier'"
                )
            return top2_margin(self.confidence_head(h))
        assert self.exit_classifier is not None
        return torch.sigmoid(self.exit_classifier(h)).squeeze(-1)

    def forward(
        self, x: Tensor, ctx: ForwardContext, states: tuple[Any, ...], depth_state: Any = None
    ) -> tuple[Tensor, tuple[Any, ...], Any]:
        n = len(self.blocks)
        use_exits = (not self.training) or self.options.exit_in_training
        b, t, _ = x.shape
        exited = torch.zeros(b, t, dtype=torch.bool, device=x.device)
        exit_layer = torch.full((b, t), n, dtype=torch.long, device=x.device)
        h, new_states, history = x, [], []
        for layer, block in enumerate(self.blocks):
            h_in = ctx.enter_layer(h, layer)
            h_new, st = block(h_in, ctx, states[layer])
            new_states.append(st)
            h_new = torch.where(exited.unsqueeze(-1), h, h_new)  # exited tokens are copied upward
            history.append(h_new)
            if use_exits and layer + 1 >= self.options.min_layers and layer < n - 1:
                conf = self.confidence(h_new, h)
                exits_now = ~exited & (conf >= self.options.threshold)
                exit_layer = torch.where(exits_now, torch.full_like(exit_layer, layer + 1), exit_layer)
                exited = exited | exits_now
            h = h_new
        if self.exit_classifier is not None and self.training:
            ctx.add_aux("early_exit_classifier", self._classifier_loss(history, ctx.valid))
        if ctx.collect_info:
            ctx.add_info("backbone/exit_layer", exit_layer.double().mean())
            ctx.add_info("backbone/exit_layer_per_token", exit_layer)
        return h, tuple(new_states), depth_state

    def _classifier_loss(self, history: list[Tensor], valid: Tensor) -> Tensor:
        """BCE of the exit classifier on layers 1..L-1 against the CALM oracle (targets without gradient)."""
        assert self.exit_classifier is not None
        final = history[-1].detach()
        losses = []
        for h in history[:-1]:
            with torch.no_grad():
                if self.confidence_head is not None:
                    label = self.confidence_head(h).argmax(-1) == self.confidence_head(final).argmax(-1)
                else:
                    label = F.cosine_similarity(h, final, dim=-1) >= self.options.oracle_cosine
            logit = self.exit_classifier(h.detach()).squeeze(-1)
            bce = F.binary_cross_entropy_with_logits(logit, label.to(logit.dtype), reduction="none")
            losses.append((bce * valid).sum() / valid.sum().clamp_min(1))
        return torch.stack(losses).mean() if losses else final.new_zeros(())
