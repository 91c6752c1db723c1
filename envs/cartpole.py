"""CartPole with half of the state hidden: positions only (no velocities) or velocities only (no positions).

Gymnasium's ``CartPole-v1`` (Barto, Sutton & Anderson 1983) has the Markov state
``[x, x_dot, theta, theta_dot]``. Masking makes it a POMDP, the classic recurrent-RL probe (e.g. Meng et al.
2021, arXiv 2102.12344; POPGym, Morad et al. 2023, arXiv 2303.01859):

- ``rlt/CartPoleNoVel-v0`` keeps ``[x, theta]`` (indices 0, 2): velocities must be inferred from differences
  of successive observations, a memory of 2 steps suffices.
- ``rlt/CartPoleNoPos-v0`` keeps ``[x_dot, theta_dot]`` (indices 1, 3): positions must be integrated from the
  whole history of velocities (long memory), since the episode fails when |x| > 2.4 or |theta| > 12°.

Everything else is CartPole-v1: reward +1 per step, termination on falling, truncation at 500 steps
(``max_episode_steps=500`` on the registered ids). Scores: optimal 500; uniform random ≈ 22 (see
``envs.MEMORY_TASKS``). Spaces: observation ``Box(float32, (2,))``; action ``Discrete(2)`` (push left/right).
"""

from __future__ import annotations

import difflib
from typing import Any

import gymnasium as gym
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

from envs.wrappers import MaskObservation

STATE_NAMES = ("x", "x_dot", "theta", "theta_dot")
MASKS: dict[str, tuple[int, ...]] = {
    "velocity": (0, 2),  # velocities hidden: keep positions
    "position": (1, 3),  # positions hidden: keep velocities
}


def make_masked_cartpole(hide: str, render_mode: str | None = None, **kwargs: Any) -> gym.Env:
    """CartPole-v1 dynamics with ``hide="velocity"`` or ``hide="position"`` masked out of the observation.

    The 500-step time limit is added by ``gym.make`` from the registered spec (``max_episode_steps=500``);
    call ``gym.make("rlt/CartPoleNoVel-v0")`` rather than this function to get it.

    Args:
        hide: which half of the state to hide: ``"velocity"`` (keep x, theta) or ``"position"``
            (keep x_dot, theta_dot).
        render_mode: passed to ``CartPoleEnv`` (``"human"`` or ``"rgb_array"``).
        **kwargs: other ``CartPoleEnv`` arguments (e.g. ``sutton_barto_reward``).
    """
    if hide not in MASKS:
        close = difflib.get_close_matches(str(hide), list(MASKS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"hide={hide!r} is not valid; choose one of {list(MASKS)}{hint}")
    return MaskObservation(CartPoleEnv(render_mode=render_mode, **kwargs), keep=MASKS[hide])
