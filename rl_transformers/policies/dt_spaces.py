"""Decision Transformer spaces: which spaces the model accepts, and Box / Discrete spaces as plain JSON data.

A checkpoint records the model's observation and action spaces through :func:`space_to_dict` so that
:meth:`~rl_transformers.policies.decision_transformer.DecisionTransformer.from_kwargs` rebuilds the model
without the dataset. Split out of ``decision_transformer.py``, which re-exports these names (old import paths
keep working). Imports nothing from the policies package.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


def space_to_dict(space: gym.spaces.Space) -> dict[str, Any]:
    """A Box or Discrete space as plain JSON data (inverse: :func:`space_from_dict`)."""
    if isinstance(space, gym.spaces.Box):
        return {
            "type": "Box",
            "low": space.low.tolist(),
            "high": space.high.tolist(),
            "shape": list(space.shape),
            "dtype": str(space.dtype),
        }
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    raise ValueError(f"cannot serialise space {space!r}; supported: Box, Discrete")


def space_from_dict(data: dict[str, Any]) -> gym.spaces.Space:
    """Inverse of :func:`space_to_dict`."""
    kind = data.get("type")
    if kind == "Box":
        low = np.asarray(data["low"], dtype=data["dtype"]).reshape(data["shape"])
        high = np.asarray(data["high"], dtype=data["dtype"]).reshape(data["shape"])
        return gym.spaces.Box(low=low, high=high, dtype=np.dtype(data["dtype"]))  # type: ignore[arg-type]
    if kind == "Discrete":
        return gym.spaces.Discrete(int(data["n"]), start=int(data["start"]))
    raise ValueError(f"unknown space type {kind!r}; valid: ['Box', 'Discrete']")


def check_space(space: gym.spaces.Space, what: str) -> None:
    """Raise a ValueError naming ``space`` unless it is a Box or Discrete space (``what``: its role)."""
    if not isinstance(space, gym.spaces.Box | gym.spaces.Discrete):
        raise ValueError(
            f"DecisionTransformer supports Box and Discrete {what} spaces, got {type(space).__name__} "
            f"{space!r} (flatten Dict observations first, e.g. with offline_data's readers)"
        )


__all__ = ["check_space", "space_from_dict", "space_to_dict"]
