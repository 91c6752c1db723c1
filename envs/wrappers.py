"""Observation wrappers: flatten any discrete/structured observation into a float Box, or mask Box entries.

``FloatFlattenObservation`` turns an observation space built from ``Box``, ``Discrete``, ``MultiDiscrete``,
``MultiBinary``, ``Tuple`` and ``Dict`` into one ``Box(float32)`` vector, so an MLP encoder can read it:
``Discrete(n)`` becomes a one-hot of length n, ``MultiDiscrete(nvec)`` the concatenation of one one-hot per
entry (length ``sum(nvec)``), ``MultiBinary`` its bits as floats, ``Box`` its flattened values (cast to
float32, bounds kept), and ``Tuple``/``Dict`` the concatenation of their children in iteration order (a
gymnasium ``Dict`` iterates its keys in sorted order). Unlike ``gymnasium.wrappers.FlattenObservation``, the
result is always float32 and a ``start`` offset of ``Discrete``/``MultiDiscrete`` is handled.
``Dict`` keys listed in ``drop_keys`` (e.g. MiniGrid's ``Text`` mission) are removed first.

``MaskObservation`` keeps a subset of the entries of a 1-D ``Box`` observation (used for the masked CartPole
tasks). Shapes: flat observation ``(flat_dim(space),)``; masked observation ``(len(keep),)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

SUPPORTED_SPACES = ("Box", "Discrete", "MultiDiscrete", "MultiBinary", "Tuple", "Dict")


def _unsupported(space: spaces.Space) -> TypeError:
    return TypeError(
        f"cannot flatten observation space {space!r} into a float Box; "
        f"supported spaces: {', '.join(SUPPORTED_SPACES)} (drop other Dict entries with drop_keys=...)"
    )


def flat_dim(space: spaces.Space) -> int:
    """Length of the float vector that :func:`flatten_value` returns for an element of ``space``."""
    if isinstance(space, spaces.Box):
        return int(np.prod(space.shape))
    if isinstance(space, spaces.Discrete):
        return int(space.n)
    if isinstance(space, spaces.MultiDiscrete):
        return int(np.sum(space.nvec))
    if isinstance(space, spaces.MultiBinary):
        return int(np.prod(space.shape))
    if isinstance(space, spaces.Tuple):
        return sum(flat_dim(s) for s in space.spaces)
    if isinstance(space, spaces.Dict):
        return sum(flat_dim(s) for s in space.spaces.values())
    raise _unsupported(space)


def _bounds(space: spaces.Space) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(space, spaces.Box):
        return space.low.astype(np.float32).ravel(), space.high.astype(np.float32).ravel()
    if isinstance(space, (spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)):
        n = flat_dim(space)
        return np.zeros(n, np.float32), np.ones(n, np.float32)
    if isinstance(space, (spaces.Tuple, spaces.Dict)):
        children = space.spaces if isinstance(space, spaces.Tuple) else list(space.spaces.values())
        parts = [_bounds(s) for s in children]
        if not parts:
            return np.zeros(0, np.float32), np.zeros(0, np.float32)
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    raise _unsupported(space)


def flatten_space_float(space: spaces.Space) -> spaces.Box:
    """The ``Box(float32)`` of shape ``(flat_dim(space),)`` that holds the flattened elements of ``space``."""
    low, high = _bounds(space)
    return spaces.Box(low=low, high=high, dtype=np.float32)


def flatten_value(space: spaces.Space, x: Any) -> np.ndarray:
    """Flatten one element ``x`` of ``space`` into a float32 vector of length ``flat_dim(space)``."""
    if isinstance(space, spaces.Box):
        return np.asarray(x, dtype=np.float32).ravel()
    if isinstance(space, spaces.Discrete):
        out = np.zeros(int(space.n), np.float32)
        out[int(np.asarray(x).item()) - int(space.start)] = 1.0
        return out
    if isinstance(space, spaces.MultiDiscrete):
        nvec = space.nvec.ravel().astype(np.int64)
        idx = np.asarray(x, dtype=np.int64).ravel() - space.start.ravel().astype(np.int64)
        out = np.zeros(int(nvec.sum()), np.float32)
        offsets = np.concatenate([[0], np.cumsum(nvec)[:-1]])
        out[offsets + idx] = 1.0
        return out
    if isinstance(space, spaces.MultiBinary):
        return np.asarray(x, dtype=np.float32).ravel()
    if isinstance(space, spaces.Tuple):
        parts = [flatten_value(s, v) for s, v in zip(space.spaces, x, strict=True)]
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)
    if isinstance(space, spaces.Dict):
        parts = [flatten_value(s, x[k]) for k, s in space.spaces.items()]
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)
    raise _unsupported(space)


class FloatFlattenObservation(gym.ObservationWrapper):
    """Flatten a structured/discrete observation into a ``Box(float32)`` vector (one-hot for discrete parts).

    Args:
        env: the environment to wrap.
        drop_keys: top-level ``Dict`` keys removed before flattening (e.g. ``("mission",)`` for MiniGrid).
    """

    def __init__(self, env: gym.Env, drop_keys: Sequence[str] = ()) -> None:
        super().__init__(env)
        space = env.observation_space
        self._drop_keys = tuple(drop_keys)
        if self._drop_keys:
            if not isinstance(space, spaces.Dict):
                raise TypeError(f"drop_keys={self._drop_keys} needs a Dict observation space, got {space!r}")
            missing = [k for k in self._drop_keys if k not in space.spaces]
            if missing:
                raise KeyError(f"drop_keys {missing} not in the observation keys {sorted(space.spaces)}")
            space = spaces.Dict({k: s for k, s in space.spaces.items() if k not in self._drop_keys})
        self._source_space = space
        self.observation_space = flatten_space_float(space)

    def observation(self, observation: Any) -> np.ndarray:
        if self._drop_keys:
            observation = {k: v for k, v in observation.items() if k not in self._drop_keys}
        return flatten_value(self._source_space, observation)


class MaskObservation(gym.ObservationWrapper):
    """Keep only the entries ``keep`` of a 1-D ``Box`` observation (bounds are sliced the same way).

    Args:
        env: the environment to wrap; its observation space must be a 1-D ``Box``.
        keep: indices of the entries to keep, in the order they appear in the output.
    """

    def __init__(self, env: gym.Env, keep: Sequence[int]) -> None:
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, spaces.Box) or len(space.shape) != 1:
            raise TypeError(f"MaskObservation needs a 1-D Box observation space, got {space!r}")
        keep_idx = np.asarray(keep, dtype=np.int64)
        if keep_idx.ndim != 1 or keep_idx.size == 0:
            raise ValueError(f"keep must be a non-empty list of indices, got {list(keep)}")
        if keep_idx.min() < 0 or keep_idx.max() >= space.shape[0]:
            raise ValueError(f"keep={list(keep)} has indices outside 0..{space.shape[0] - 1}")
        self.keep = keep_idx
        self.observation_space = spaces.Box(
            low=space.low[keep_idx], high=space.high[keep_idx], dtype=space.dtype
        )

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return np.asarray(observation)[self.keep].copy()
