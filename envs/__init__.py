"""Gymnasium memory / POMDP tasks for rl_transformers, registered under ``rlt/`` on ``import envs``.

>>> import gymnasium as gym, envs
>>> env = gym.make("rlt/TMaze-v0", corridor_length=50)

Core tasks (numpy only): passive T-Maze (:mod:`envs.tmaze`), CartPole with velocities or positions hidden
(:mod:`envs.cartpole`), repeat-previous with Discrete or MultiDiscrete answers
(:mod:`envs.repeat_previous`), count-recall (:mod:`envs.count_recall`) and a continuous-action recall task
(:mod:`envs.continuous_recall`). Adapters for the optional extras, imported lazily: POPGym
(:mod:`envs.popgym_adapter`, ids ``rlt/popgym-<Name>-v0``) and MiniGrid Memory
(:mod:`envs.minigrid_adapter`, ``rlt/MiniGridMemory-v0``). ``MEMORY_TASKS`` describes the ids (memory
needed, random and optimal scores); :class:`FloatFlattenObservation` turns structured observations into
float vectors. Our own tasks end their episodes themselves after ``env.unwrapped.horizon`` steps (no
``TimeLimit``), so their length follows the constructor arguments given to ``gym.make``; the T-Maze and
MiniGrid Memory report ``info["success"]`` at the end of each episode.
"""

from __future__ import annotations

from envs.minigrid_adapter import make_minigrid_memory
from envs.popgym_adapter import POPGYM_NAMES, make_popgym
from envs.registry import MEMORY_TASKS, POPGYM_IDS, MemoryTask, register_all, registered_ids
from envs.wrappers import FloatFlattenObservation, MaskObservation, flat_dim, flatten_space_float

register_all()

__all__ = [
    "MEMORY_TASKS",
    "POPGYM_IDS",
    "POPGYM_NAMES",
    "FloatFlattenObservation",
    "MaskObservation",
    "MemoryTask",
    "flat_dim",
    "flatten_space_float",
    "make_minigrid_memory",
    "make_popgym",
    "register_all",
    "registered_ids",
]
