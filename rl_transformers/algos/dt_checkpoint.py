"""Decision Transformer / BC checkpoints: the format and loading a trained model (the trainer saves and restores:
:meth:`~rl_transformers.algos.dt.DTTrainer.checkpoint`).

A checkpoint holds tensors and plain data only (read back with ``torch.load(weights_only=True)``): the model's
weights and constructor kwargs (normalisation and return scale included, so the file alone rebuilds the
policy), optimizer and scheduler, the update counter, every rank's RNG states and sampler state, the run's
config (per-invocation fields reset: :func:`~rl_transformers.runs.config.saved_form`) and what the run
knows of its dataset (source, env id, reference scores).
"""

from __future__ import annotations

from pathlib import Path

import torch

from rl_transformers.policies.decision_transformer import DecisionTransformer
from rl_transformers.runs.checkpoint_load import (
    DT_WHAT,
    check_weights_fit,
    latest_checkpoint,
    load_checkpoint,
)
from rl_transformers.utils.errors import UserError

__all__ = ["REQUIRED_KEYS", "load_policy"]

REQUIRED_KEYS = ("model", "optimizer", "scheduler", "step", "rng", "sampler_rng")
"""Keys a checkpoint needs for ``--resume``."""


def load_policy(path: str | Path, device: str | torch.device = "cpu") -> DecisionTransformer:
    """The model of a checkpoint file or run directory (weights + normalisation), in eval mode."""
    source = latest_checkpoint(path) or Path(path)
    ckpt = load_checkpoint(source, map_location=device)
    missing = [k for k in ("model", "model_kwargs") if k not in ckpt]
    if missing or not isinstance(ckpt.get("model_kwargs"), dict):
        raise UserError(f"checkpoint {source} lacks {missing or ['model_kwargs']}: not a DT checkpoint")
    try:
        check_weights_fit(
            lambda: DecisionTransformer.from_kwargs(ckpt["model_kwargs"]), ckpt["model"], source, DT_WHAT
        )
        model = DecisionTransformer.from_kwargs(ckpt["model_kwargs"])
        model.load_state_dict(ckpt["model"])
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        raise UserError(
            f"checkpoint {source}: its model does not rebuild ({type(err).__name__}: {err})"
        ) from err
    return model.to(device).eval()
