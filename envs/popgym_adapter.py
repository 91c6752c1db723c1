"""POPGym adapter: build a POPGym environment with its observation flattened into a float Box.

POPGym (Morad et al. 2023, "POPGym: Benchmarking Partially Observable Reinforcement Learning",
arXiv 2303.01859) is a suite of POMDPs whose observations are ``Discrete``, ``MultiDiscrete``, ``Tuple`` or
``Box``. :func:`make_popgym` instantiates one by class name and wraps it with
:class:`envs.wrappers.FloatFlattenObservation`, so every observation becomes a one-hot/float vector of shape
``(flat_dim,)`` (e.g. ``RepeatPreviousEasy``: ``Discrete(4)`` -> ``Box(float32, (4,))``), and ``info``
dicts are deep-copied (a few POPGym tasks reuse one mutable object across steps); actions, rewards
and POPGym's own episode limits are unchanged (POPGym rewards are scaled so that episode returns lie in
[-1, 1]). The ids ``rlt/popgym-<Name>-v0`` are registered for the names in :data:`POPGYM_NAMES` on
``import envs``; POPGym itself is imported only when one is built, and a missing install raises an
``ImportError`` naming ``pip install rl-transformers[popgym]``. The Labyrinth tasks need ``mazelib`` as
well and are not registered, but ``make_popgym("LabyrinthEscapeEasy")`` works where it is installed.
"""

from __future__ import annotations

import copy
import difflib
from typing import Any, SupportsFloat

import gymnasium as gym

from envs._optional import import_optional
from envs.wrappers import FloatFlattenObservation

_FAMILIES = (
    "Autoencode",
    "Battleship",
    "Concentration",
    "CountRecall",
    "HigherLower",
    "MineSweeper",
    "MultiarmedBandit",
    "NoisyPositionOnlyCartPole",
    "NoisyPositionOnlyPendulum",
    "PositionOnlyCartPole",
    "PositionOnlyPendulum",
    "RepeatFirst",
    "RepeatPrevious",
    "VelocityOnlyCartPole",
)
POPGYM_NAMES: tuple[str, ...] = tuple(
    f"{family}{level}" for family in _FAMILIES for level in ("Easy", "Medium", "Hard")
)
"""POPGym class names registered as ``rlt/popgym-<Name>-v0`` (popgym 1.0.x, Labyrinth tasks excluded)."""


def popgym_id(name: str) -> str:
    """The registered id of a POPGym class name, e.g. ``"rlt/popgym-RepeatPreviousEasy-v0"``."""
    return f"rlt/popgym-{name}-v0"


def _class_name(name: str) -> str:
    """Accept ``RepeatPreviousEasy``, ``popgym-RepeatPreviousEasy-v0`` or ``rlt/popgym-...-v0``."""
    base = name.split("/")[-1]
    if base.startswith("popgym-"):
        base = base[len("popgym-") :]
    if base.endswith("-v0"):
        base = base[: -len("-v0")]
    return base


def make_popgym(name: str, render_mode: str | None = None, **kwargs: Any) -> gym.Env:
    """Build the POPGym environment ``name`` with a flat float32 ``Box`` observation.

    Args:
        name: POPGym class name (``"RepeatPreviousEasy"``); ``popgym-...-v0`` ids are accepted too.
        render_mode: set on the environment when given (most POPGym tasks only print to stdout).
        **kwargs: constructor arguments of the POPGym class (e.g. ``k=8`` for ``RepeatPrevious``).

    Raises:
        ImportError: popgym is not installed (names the ``pip install`` command).
        ValueError: ``name`` is not a POPGym environment class (lists the close matches).
    """
    cls_name = _class_name(name)
    module = import_optional("popgym.envs", "popgym", f"make_popgym({name!r})")
    cls = getattr(module, cls_name, None)
    if not (isinstance(cls, type) and issubclass(cls, gym.Env)):
        valid = sorted(k for k, v in vars(module).items() if isinstance(v, type) and issubclass(v, gym.Env))
        close = difflib.get_close_matches(cls_name, valid, n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise ValueError(f"{name!r} is not a POPGym environment{hint}; valid names: {valid}")
    env = cls(**kwargs)
    if render_mode is not None:
        env.render_mode = render_mode
    return FloatFlattenObservation(FreshInfo(env))


class FreshInfo(gym.Wrapper):
    """Deep-copy the ``info`` dict of every ``reset``/``step``.

    Some POPGym tasks (CountRecall, MultiarmedBandit) return the same mutable object in successive infos,
    which ``gymnasium.utils.env_checker.check_env`` rejects and which would corrupt stored rollouts.
    """

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        return obs, copy.deepcopy(info)

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, copy.deepcopy(info)
