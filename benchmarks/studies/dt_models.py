"""Decision Transformer training-throughput candidates: ours and the peers' models of the same size.

Each builder returns a :class:`Candidate` (the module and a ``loss(batch)`` closure) or None when the peer
library is not installed. All candidates see the same synthetic Hopper-shaped batch (:func:`make_batch`) and
the paper's shape (Chen et al. 2021, arXiv 2106.01345): 3 layers, d = 128, 1 head, ReLU, K = 20, max_ep_len
1000, dropout 0.1 (GPT-2's places). Peers (optional, never project dependencies):

- ``huggingface``: ``transformers.DecisionTransformerModel`` (``pip install transformers``);
- ``d3rlpy``: ``d3rlpy.models.torch.ContinuousDecisionTransformer`` (``pip install d3rlpy``), GPT-2 shape,
  built with the same sizes through its own building blocks.

``rl_transformers`` is our default model (the fused training forward, ``dt_fast.py``);
``rl_transformers_generic`` is the same model forced through the generic backbone (``model.fused = False``);
``rl_transformers_compiled`` / ``rl_transformers_generic_compiled`` put either forward under ``torch.compile``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from rl_transformers.policies.decision_transformer import DecisionTransformer, dt_backbone_config

OBS_DIM, ACT_DIM, MAX_EP_LEN = 11, 3, 1000
"""Hopper's observation and action sizes, and the paper's timestep-embedding rows."""


@dataclass(frozen=True)
class DTShape:
    batch_size: int = 64
    context_len: int = 20
    dropout: float = 0.1
    d_model: int = 128
    n_layers: int = 3
    n_heads: int = 1


@dataclass
class Candidate:
    module: nn.Module
    loss: Callable[[dict[str, Tensor]], Tensor]


def make_batch(shape: DTShape, device: torch.device, seed: int = 0) -> dict[str, Tensor]:
    """One synthetic batch: window lengths uniform in 1..K (right-padded), Hopper-like value ranges."""
    g = torch.Generator().manual_seed(seed)
    b, k = shape.batch_size, shape.context_len
    lengths = torch.randint(1, k + 1, (b,), generator=g)
    mask = torch.arange(k)[None] < lengths[:, None]
    batch = {
        "returns_to_go": torch.rand(b, k, generator=g) * 3600,
        "observations": torch.randn(b, k, OBS_DIM, generator=g),
        "actions": torch.rand(b, k, ACT_DIM, generator=g) * 2 - 1,
        "timesteps": torch.randint(0, MAX_EP_LEN, (b, k), generator=g),
        "mask": mask,
    }
    return {name: t.to(device) for name, t in batch.items()}


def _masked_mse(pred: Tensor, actions: Tensor, mask: Tensor) -> Tensor:
    err = (pred - actions).pow(2).sum(-1)
    return (err * mask).sum() / (mask.sum() * actions.shape[-1])


def ours(shape: DTShape, device: torch.device, fused: bool = True) -> Candidate:
    obs_space = gym.spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (ACT_DIM,), np.float32)
    backbone = dt_backbone_config(
        dropout=shape.dropout, d_model=shape.d_model, n_layers=shape.n_layers, n_heads=shape.n_heads
    )
    model = DecisionTransformer(obs_space, action_space, backbone, shape.context_len, MAX_EP_LEN).to(device)
    model.fused = fused

    def loss(batch: dict[str, Tensor]) -> Tensor:
        out = model(**batch)
        return model.action_loss(out.predictions, batch["actions"], batch["mask"])

    return Candidate(model, loss)


def ours_generic(shape: DTShape, device: torch.device) -> Candidate:
    return ours(shape, device, fused=False)


def ours_compiled(shape: DTShape, device: torch.device, fused: bool = True) -> Candidate:
    """Our model with its forward under ``torch.compile`` (inductor; the first calls compile, so give the
    timing enough warm-up): does the PPO side's compile work pay for the DT update?"""
    plain = ours(shape, device, fused)
    model = plain.module
    compiled = torch.compile(model)

    def loss(batch: dict[str, Tensor]) -> Tensor:
        out = compiled(**batch)
        return model.action_loss(out.predictions, batch["actions"], batch["mask"])  # type: ignore[operator]

    return Candidate(model, loss)


def ours_generic_compiled(shape: DTShape, device: torch.device) -> Candidate:
    return ours_compiled(shape, device, fused=False)


def huggingface(shape: DTShape, device: torch.device, n_positions: int = 1024) -> Candidate | None:
    try:
        from transformers import DecisionTransformerConfig, DecisionTransformerModel
    except ImportError:
        return None
    p = shape.dropout
    cfg = DecisionTransformerConfig(
        state_dim=OBS_DIM, act_dim=ACT_DIM, hidden_size=shape.d_model, n_layer=shape.n_layers,
        n_head=shape.n_heads, max_ep_len=MAX_EP_LEN, resid_pdrop=p, embd_pdrop=p, attn_pdrop=p,
        n_positions=n_positions,
    )  # fmt: skip
    model = DecisionTransformerModel(cfg).to(device)  # type: ignore[arg-type]  # transformers' stub of `to`

    def loss(batch: dict[str, Tensor]) -> Tensor:
        mask = batch["mask"]
        out = model(
            states=batch["observations"],
            actions=batch["actions"],
            rewards=torch.zeros_like(batch["returns_to_go"])[..., None],
            returns_to_go=batch["returns_to_go"][..., None] / 1000.0,
            timesteps=batch["timesteps"],
            attention_mask=mask.long(),
        )
        return _masked_mse(out.action_preds, batch["actions"], mask)

    return Candidate(model, loss)


def huggingface_equal_params(shape: DTShape, device: torch.device) -> Candidate | None:
    """Hugging Face's model with GPT-2's position table cut from 1024 rows (its default: 131k of its 859k
    parameters at the paper's size) to the 3K rows a K-step window uses, so both sides count about the same
    parameters (the DT's own timestep embedding positions the tokens in both)."""
    return huggingface(shape, device, n_positions=3 * shape.context_len)


def d3rlpy_model(shape: DTShape, device: torch.device) -> Candidate | None:
    try:
        from d3rlpy.models.torch import ContinuousDecisionTransformer
        from d3rlpy.models.torch.encoders import VectorEncoder
        from d3rlpy.models.torch.transformers import SimplePositionEncoding
    except ImportError:
        return None
    p = shape.dropout
    # A linear state embedding of width d (the paper's), d3rlpy's learned timestep embedding.
    encoder = VectorEncoder((OBS_DIM,), hidden_units=[shape.d_model], exclude_last_activation=True)
    model = ContinuousDecisionTransformer(
        encoder=encoder,
        embed_size=shape.d_model,
        position_encoding=SimplePositionEncoding(shape.d_model, MAX_EP_LEN + 1),
        action_size=ACT_DIM,
        num_heads=shape.n_heads,
        context_size=shape.context_len,
        num_layers=shape.n_layers,
        attn_dropout=p,
        resid_dropout=p,
        embed_dropout=p,
        activation=nn.ReLU(),
    ).to(device)

    def loss(batch: dict[str, Tensor]) -> Tensor:
        mask = batch["mask"]
        pred = model(
            batch["observations"],
            batch["actions"],
            batch["returns_to_go"][..., None] / 1000.0,
            batch["timesteps"],
            mask.float(),
        )
        return _masked_mse(pred, batch["actions"], mask)

    return Candidate(model, loss)


BUILDERS: dict[str, Callable[[DTShape, torch.device], Candidate | None]] = {
    "rl_transformers": ours,
    "rl_transformers_generic": ours_generic,
    "rl_transformers_compiled": ours_compiled,
    "rl_transformers_generic_compiled": ours_generic_compiled,
    "huggingface": huggingface,
    "huggingface_equal_params": huggingface_equal_params,
    "d3rlpy": d3rlpy_model,
}
"""Candidate name -> builder (None when the peer is not installed)."""
INSTALL_HINT = {
    "huggingface": "pip install transformers",
    "huggingface_equal_params": "pip install transformers",
    "d3rlpy": "pip install d3rlpy",
}

__all__ = ["BUILDERS", "Candidate", "DTShape", "make_batch"]
