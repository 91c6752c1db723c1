"""Decision Transformer / BC checkpoints: what a save holds, how a resume restores it, loading a trained model.

A checkpoint holds tensors and plain data only (read back with ``torch.load(weights_only=True)``): the model's
weights and constructor kwargs (normalisation and return scale included, so the file alone rebuilds the
policy), optimizer and scheduler, the update counter, every rank's RNG states and sampler state, the run's
config (per-invocation fields reset: :func:`~rl_transformers.algos.run_config.saved_form`) and what the run
knows of its dataset (source, env id, reference scores).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from envs.spec_record import evaluated_spec
from rl_transformers.algos.distributed import gather_objects
from rl_transformers.algos.run_config import saved_form
from rl_transformers.policies.decision_transformer import DecisionTransformer
from rl_transformers.utils import (
    capture_rng_state,
    latest_checkpoint,
    load_checkpoint,
    restore_rng_state,
    to_jsonable,
)
from rl_transformers.utils.checkpoint_load import DT_WHAT, check_weights_fit
from rl_transformers.utils.errors import UserError

if TYPE_CHECKING:
    from rl_transformers.algos.dt import DTTrainer

__all__ = ["REQUIRED_KEYS", "checkpoint_state", "load_policy", "restore_checkpoint"]

REQUIRED_KEYS = ("model", "optimizer", "scheduler", "step", "rng", "sampler_rng")
"""Keys a checkpoint needs for ``--resume``."""


def checkpoint_state(tr: DTTrainer) -> dict[str, Any] | None:
    """The checkpoint payload of trainer ``tr`` (collective under DDP: gathers every rank's RNG states; None
    off rank 0)."""
    rngs = gather_objects(capture_rng_state(), tr.dist)
    samplers = gather_objects(tr.sampler_rng.bit_generator.state, tr.dist)
    if not tr.dist.is_main:
        return None
    info = tr.info
    return {
        "model": tr.model.state_dict(),
        "model_kwargs": tr.model.init_kwargs(),
        "optimizer": tr.optimizer.state_dict(),
        "scheduler": tr.scheduler.state_dict(),
        "step": tr.step,
        "rng": rngs,
        "sampler_rng": samplers,
        "world_size": tr.dist.world_size,
        "config": to_jsonable(saved_form(tr.config)),
        "dataset": {
            "source": info.source,
            "env_id": info.env_id,
            "env_spec": evaluated_spec(tr.config.env_id, info, tr.config.allow_env_modules),
            "ref_min_score": info.ref_min_score,
            "ref_max_score": info.ref_max_score,
        },
    }


def restore_checkpoint(tr: DTTrainer, ckpt: dict[str, Any]) -> None:
    """Put back what :func:`checkpoint_state` saved (RNG streams only when the world size is unchanged)."""
    tr.model.load_state_dict(ckpt["model"])
    tr.optimizer.load_state_dict(ckpt["optimizer"])
    tr.scheduler.load_state_dict(ckpt["scheduler"])
    tr.step = int(ckpt["step"])
    if int(ckpt.get("world_size", 1)) == tr.dist.world_size:
        restore_rng_state(ckpt["rng"][tr.dist.rank])
        tr.sampler_rng.bit_generator.state = ckpt["sampler_rng"][tr.dist.rank]
    elif tr.dist.is_main:
        warnings.warn(
            f"resume: world size changed ({ckpt.get('world_size')} -> {tr.dist.world_size}); "
            "random streams are reseeded, the run will not match an uninterrupted one",
            stacklevel=2,
        )


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
