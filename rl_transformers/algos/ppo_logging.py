"""What a PPO run logs after each update: stable-baselines3's tags (rollout/, train/, time/) and the backbone's.

Tags come from :mod:`rl_transformers.tags` (the vocabulary is tabulated in docs/design.md):
``rollout/ep_rew_mean`` / ``rollout/ep_len_mean`` (last 100 training episodes), the loss terms
(``train/loss``, ``train/policy_gradient_loss``, ``train/value_loss``, ``train/entropy_loss``,
``train/approx_kl``, ``train/clip_fraction``, ``train/grad_norm``, ``train/explained_variance``),
``train/learning_rate``, ``train/clip_range``, ``train/n_updates``, ``time/fps``, ``time/iterations``,
``time/total_timesteps``; backbone aux losses as ``backbone/aux/<name>`` and diagnostics (gate openness,
attention entropy, memory fill) as ``backbone/<name>``. Evaluation (``eval/mean_reward``,
``eval/mean_ep_length``) is logged by the trainer when due.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rl_transformers import logging as L
from rl_transformers import tags as T

__all__ = ["AUX_PREFIX", "record_update"]

AUX_PREFIX = "backbone/aux/"
"""PPO's tag prefix of backbone aux losses (DT logs them as ``train/aux_<name>``)."""

_LOSS_TAGS = {
    "loss": T.LOSS,
    "pg": T.POLICY_GRADIENT_LOSS,
    "v": T.VALUE_LOSS,
    "kl": T.APPROX_KL,
    "clip": T.CLIP_FRACTION,
    "grad_norm": T.GRAD_NORM,
}


def record_update(
    logger: L.Logger,
    metrics: dict[str, float],
    *,
    episode_returns: Sequence[float],
    episode_lengths: Sequence[int],
    learning_rate: float,
    clip_range: float,
    n_gradient_steps: int,
    fps: float,
    update: int,
    global_step: int,
) -> None:
    """Record one update's scalars (``metrics``: what ``PPOTrainer.train_epochs`` returned); the run's
    ``dump`` writes the row."""
    if len(episode_returns):
        logger.record(T.EP_REW_MEAN, float(np.mean(episode_returns)))
        logger.record(T.EP_LEN_MEAN, float(np.mean(episode_lengths)))
    for key, tag in _LOSS_TAGS.items():
        if key in metrics:
            logger.record(tag, metrics[key])
    if "ent" in metrics:
        logger.record(T.ENTROPY_LOSS, -metrics["ent"])
    logger.record(T.EXPLAINED_VARIANCE, metrics["explained_variance"])
    logger.record(T.LEARNING_RATE, learning_rate)
    logger.record(T.CLIP_RANGE, clip_range)
    logger.record(T.N_UPDATES, n_gradient_steps)
    logger.record(T.FPS, fps)
    logger.record(T.ITERATIONS, update)
    logger.record(T.TOTAL_TIMESTEPS, global_step)
    for key, value in metrics.items():
        _record_backbone(logger, key, value)


def _record_backbone(logger: Any, key: str, value: float) -> None:
    if key.startswith("aux/"):
        logger.record(AUX_PREFIX + key[len("aux/") :], value)
    elif key.startswith("info:"):
        name = key[len("info:") :]
        logger.record(name if name.startswith("backbone/") else f"backbone/{name}", value)
