"""MiniGrid Memory adapter: image + direction observation, the 3 useful actions, ``info["success"]``.

MiniGrid's Memory task (Chevalier-Boisvert et al. 2023, "Minigrid & Miniworld", arXiv 2306.13831): the agent
starts in a small room holding a cue object (key or ball), walks a hallway to a split with one key and one
ball, and must step next to the object matching the cue. Reaching the match gives ``1 - 0.9 * steps /
max_steps`` (``max_steps = 5 S^2``, 245 for S = 7), the other object 0, and both end the episode; running out
of steps truncates it. The cue is only visible from the start room, so the agent must remember it for the
length of the hallway (and first look at it: at S = 7 it starts facing east, away from the cue unless it
starts next to it).

:func:`make_minigrid_memory` wraps ``MiniGrid-MemoryS<S>-v0``: the observation becomes
``Dict(image=Box(uint8, (7, 7, 3)), direction=Discrete(4))`` (the constant ``mission`` text is dropped; the
image holds MiniGrid's (object, colour, state) codes of the 7 x 7 egocentric view), or, with
``flatten=True``, a ``Box(float32, (151,))`` (147 raw codes + one-hot direction). With ``reduced_actions``
(default) the action space is ``Discrete(3)`` = turn left, turn right, forward, since the other 4 MiniGrid
actions do nothing useful here. ``info["success"]`` is set at the end of each episode.

Scores on S = 7 (undiscounted return): optimal ≈ 0.978 (about 6 steps on average: look at the cue, walk the
hallway, turn, step; 1 - 0.9 * 6 / 245), best memoryless ≈ 0.49 (a coin flip at the split), uniform random
over the 3 actions: see ``envs.MEMORY_TASKS``. MiniGrid is imported only when an environment is built; a
missing install raises an ``ImportError`` naming ``pip install rl-transformers[minigrid]``.
"""

from __future__ import annotations

from typing import Any, cast

import gymnasium as gym
from gymnasium import spaces

from envs._optional import import_optional
from envs.wrappers import FloatFlattenObservation

N_REDUCED_ACTIONS = 3  # MiniGrid actions 0 = turn left, 1 = turn right, 2 = move forward


class MiniGridMemoryWrapper(gym.Wrapper):
    """Drop the mission text, optionally keep only the 3 movement actions, and report ``info["success"]``.

    Args:
        env: a MiniGrid Memory environment (Dict observation with ``image``, ``direction``, ``mission``).
        reduced_actions: expose ``Discrete(3)`` (left, right, forward) instead of MiniGrid's 7 actions.
    """

    def __init__(self, env: gym.Env, reduced_actions: bool = True) -> None:
        super().__init__(env)
        source = env.observation_space
        if not isinstance(source, spaces.Dict) or not {"image", "direction"} <= set(source.spaces):
            raise TypeError(f"expected a MiniGrid Dict observation with image and direction, got {source!r}")
        self.observation_space = spaces.Dict(
            {"image": source.spaces["image"], "direction": source.spaces["direction"]}
        )
        self.action_space = spaces.Discrete(N_REDUCED_ACTIONS) if reduced_actions else env.action_space

    @staticmethod
    def _strip(obs: dict[str, Any]) -> dict[str, Any]:
        return {"image": obs["image"], "direction": int(obs["direction"])}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        return self._strip(obs), info

    def step(self, action: Any) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        a = int(action)
        if not self.action_space.contains(a):
            raise ValueError(
                f"action must be in 0..{cast(spaces.Discrete, self.action_space).n - 1}, got {action!r}"
            )
        obs, reward, terminated, truncated, info = self.env.step(a)
        if terminated or truncated:
            info = {**info, "success": bool(terminated and cast(float, reward) > 0)}
        return self._strip(obs), float(reward), terminated, truncated, info


def make_minigrid_memory(
    size: int = 7,
    random_length: bool = False,
    flatten: bool = False,
    reduced_actions: bool = True,
    render_mode: str | None = None,
    **kwargs: Any,
) -> gym.Env:
    """Build MiniGrid's Memory task ``MiniGrid-MemoryS<size>[Random]-v0`` behind :class:`MiniGridMemoryWrapper`.

    Args:
        size: grid side S (odd, >= 7); MiniGrid registers 7, 9, 11, 13 and 13/17 with random hallway length.
        random_length: random hallway length (MiniGrid's ``MemoryS<S>Random`` variants).
        flatten: return a ``Box(float32, (151,))`` instead of the image/direction ``Dict``.
        reduced_actions: ``Discrete(3)`` (left, right, forward) instead of MiniGrid's ``Discrete(7)``.
        render_mode: MiniGrid render mode (``"rgb_array"`` or ``"human"``).
        **kwargs: other ``MemoryEnv`` arguments (e.g. ``max_steps``).
    """
    if int(size) != size or size < 7 or size % 2 == 0:
        raise ValueError(f"size must be an odd integer >= 7 (the hallway needs room), got {size!r}")
    memory_module = import_optional("minigrid.envs.memory", "minigrid", "rlt/MiniGridMemory-v0")
    env: gym.Env = memory_module.MemoryEnv(
        size=int(size), random_length=random_length, render_mode=render_mode, **kwargs
    )
    env = MiniGridMemoryWrapper(env, reduced_actions=reduced_actions)
    if flatten:
        env = FloatFlattenObservation(env)
    return env
