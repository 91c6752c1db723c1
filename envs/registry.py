"""The ``rlt/`` Gymnasium ids and their descriptions (``MEMORY_TASKS``); registration on ``import envs``.

Every id is registered once with ``gymnasium.register`` (re-importing is a no-op). Task constructors take
keyword arguments, so ``gym.make("rlt/TMaze-v0", corridor_length=50)`` changes the memory length. Our own
tasks end their episodes themselves (fixed horizons), so only the CartPole ids carry a
``max_episode_steps`` (500, as CartPole-v1). ``MEMORY_TASKS`` maps each described id to a
:class:`MemoryTask`: what memory it needs, the score of a uniformly random policy (mean undiscounted
return; exact where the task allows it -- T-Maze via :func:`envs.tmaze.random_policy_return`, 1/n for the
recall tasks, -2/3 for ContinuousRecall, -1/2 for POPGym's +-1 answers -- otherwise measured with
:func:`envs.scores.random_policy_score` over 2,000 episodes, seed 0: CartPole, MiniGrid, POPGym
CountRecall) and the optimal score (analytic).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from envs.popgym_adapter import POPGYM_NAMES, popgym_id
from envs.tmaze import random_policy_return


@dataclass(frozen=True)
class MemoryTask:
    """Description of one registered task, for the README table and ``--list`` style CLIs."""

    id: str
    """Registered Gymnasium id (``rlt/...``)."""
    description: str
    """One line: what the agent sees and must do."""
    memory: str
    """What has to be remembered, and for how long."""
    random_score: float
    """Mean undiscounted return of a uniformly random policy."""
    optimal_score: float
    """Mean undiscounted return of an optimal policy (analytic)."""
    entry_point: str = field(repr=False, default="")
    """``module:callable`` that builds the environment."""
    kwargs: dict[str, Any] = field(repr=False, default_factory=dict)
    """Constructor arguments of the registered id."""
    max_episode_steps: int | None = None
    """Time limit added by ``gym.make`` (``None``: the task ends its episodes itself)."""
    reward_threshold: float | None = None
    """Return at which the task counts as solved (Gymnasium spec field), or ``None``."""
    extra: str | None = None
    """Optional dependency group needed (``pip install rl-transformers[<extra>]``), or ``None``."""
    return_bounds: tuple[float, float] | None = None
    """Lowest and highest undiscounted return an episode can have with the registered kwargs (``None``: not
    stated); :func:`return_bounds` gives it for other kwargs too. Records are checked against it."""

    def __post_init__(self) -> None:
        if not self.id.startswith("rlt/"):
            raise ValueError(f"task ids live in the rlt/ namespace, got {self.id!r}")
        if self.extra not in (None, "popgym", "minigrid"):
            raise ValueError(f"extra must be None, 'popgym' or 'minigrid', got {self.extra!r}")


_TMAZE = "envs.tmaze:TMazeEnv"
_CARTPOLE = "envs.cartpole:make_masked_cartpole"
_REPEAT = "envs.repeat_previous:RepeatPreviousEnv"
_MULTI_REPEAT = "envs.repeat_previous:MultiRepeatPreviousEnv"
_COUNT = "envs.count_recall:CountRecallEnv"
_CONT = "envs.continuous_recall:ContinuousRecallEnv"
_MINIGRID = "envs.minigrid_adapter:make_minigrid_memory"
_POPGYM = "envs.popgym_adapter:make_popgym"


def _tmaze(name: str, length: int, penalty_on: str = "lag") -> MemoryTask:
    kwargs: dict[str, Any] = {"corridor_length": length}
    which = "passive T-Maze"
    if penalty_on == "action":
        kwargs["penalty_on"] = "action"
        which = "passive T-Maze, AMAGO's recoverable penalty (each non-east move)"
    return MemoryTask(
        id=f"rlt/{name}-v0",
        description=f"{which}, corridor {length}: cue at t=0, turn to the cued side at the junction",
        memory=f"1 bit for {length} steps",
        random_score=random_policy_return(length, penalty_on=penalty_on),
        optimal_score=1.0,
        entry_point=_TMAZE,
        kwargs=kwargs,
        # at worst -1/L on each of the first L steps (behind schedule, or a non-east move); the goal's 1 at best
        return_bounds=(-1.0, 1.0),
    )


_CORE_TASKS: tuple[MemoryTask, ...] = (
    _tmaze("TMazeShort", 5),
    _tmaze("TMaze", 10),
    _tmaze("TMazeLong", 100),
    _tmaze("TMazeAlt", 10, "action"),
    _tmaze("TMazeAltLong", 100, "action"),
    _tmaze("TMazeAltVeryLong", 400, "action"),
    MemoryTask(
        id="rlt/CartPoleNoVel-v0",
        description="CartPole-v1 observing [x, theta] only (velocities hidden)",
        memory="last 1-2 observations (finite differences)",
        random_score=22.35,
        optimal_score=500.0,
        entry_point=_CARTPOLE,
        kwargs={"hide": "velocity"},
        max_episode_steps=500,
        reward_threshold=475.0,
        return_bounds=(0.0, 500.0),  # +1 per step, at most 500 steps
    ),
    MemoryTask(
        id="rlt/CartPoleNoPos-v0",
        description="CartPole-v1 observing [x_dot, theta_dot] only (positions hidden)",
        memory="integral of the velocity history (whole episode)",
        random_score=22.35,
        optimal_score=500.0,
        entry_point=_CARTPOLE,
        kwargs={"hide": "position"},
        max_episode_steps=500,
        reward_threshold=475.0,
        return_bounds=(0.0, 500.0),  # +1 per step, at most 500 steps
    ),
    MemoryTask(
        id="rlt/RepeatPrevious-v0",
        description="one-hot symbol stream (4 symbols, 32 steps); answer the symbol seen 4 steps ago",
        memory="last 4 symbols (FIFO)",
        random_score=0.25,
        optimal_score=1.0,
        entry_point=_REPEAT,
        kwargs={"n_symbols": 4, "delay": 4, "episode_length": 32},
    ),
    MemoryTask(
        id="rlt/RepeatPreviousLong-v0",
        description="one-hot symbol stream (4 symbols, 64 steps); answer the symbol seen 32 steps ago",
        memory="last 32 symbols (FIFO)",
        random_score=0.25,
        optimal_score=1.0,
        entry_point=_REPEAT,
        kwargs={"n_symbols": 4, "delay": 32, "episode_length": 64},
    ),
    MemoryTask(
        id="rlt/RepeatPreviousMulti-v0",
        description="as RepeatPrevious with a MultiDiscrete answer: symbols seen 1 and 4 steps ago",
        memory="last 4 symbols (FIFO), read at two offsets",
        random_score=0.25,
        optimal_score=1.0,
        entry_point=_MULTI_REPEAT,
        kwargs={"n_symbols": 4, "delays": (1, 4), "episode_length": 32},
    ),
    MemoryTask(
        id="rlt/CountRecall-v0",
        description="value + query symbols (4 symbols, 16 steps); answer how often the query was seen",
        memory="4 counters over the whole episode (order-agnostic)",
        random_score=1.0 / 17.0,
        optimal_score=1.0,
        entry_point=_COUNT,
        kwargs={"n_symbols": 4, "episode_length": 16},
    ),
    MemoryTask(
        id="rlt/ContinuousRecall-v0",
        description="scalar cue U(-1,1) at t=0, output it at t=5 (Box action); reward -abs(a - cue)",
        memory="1 real number for 5 steps",
        random_score=-2.0 / 3.0,
        optimal_score=0.0,
        entry_point=_CONT,
        kwargs={"delay": 5},
    ),
    MemoryTask(
        id="rlt/ContinuousRecallLong-v0",
        description="scalar cue U(-1,1) at t=0, output it at t=50 (Box action); reward -abs(a - cue)",
        memory="1 real number for 50 steps",
        random_score=-2.0 / 3.0,
        optimal_score=0.0,
        entry_point=_CONT,
        kwargs={"delay": 50},
    ),
    MemoryTask(
        id="rlt/MiniGridMemory-v0",
        description="MiniGrid-MemoryS7: see key/ball in the start room, walk the hallway, go to its match",
        memory="1 bit (key or ball) for ~5 steps, plus looking at the cue first",
        random_score=0.238,
        optimal_score=0.978,
        entry_point=_MINIGRID,
        kwargs={"size": 7},
        extra="minigrid",
        return_bounds=(0.0, 1.0),  # MiniGrid's 1 - 0.9 t / T on success, else 0
    ),
)

# POPGym diagnostic tasks: returns lie in [-1, 1]; every answer is worth +-1/N, so the optimum is 1.
_POPGYM_DIAGNOSTIC: dict[str, tuple[str, str, float]] = {
    "RepeatPreviousEasy": (
        "POPGym: output the suit of the 4th most recent card (52 cards)",
        "last 3 suits",
        -0.5,
    ),
    "RepeatPreviousMedium": (
        "POPGym: output the suit of the 32nd most recent card (104 cards)",
        "last 31 suits",
        -0.5,
    ),
    "RepeatPreviousHard": (
        "POPGym: output the suit of the 64th most recent card (156 cards)",
        "last 63 suits",
        -0.5,
    ),
    "RepeatFirstEasy": ("POPGym: output the suit of the first card (52 cards)", "1 suit, 51 steps", -0.5),
    "CountRecallEasy": ("POPGym: count how often the queried colour was dealt", "2 counters", -0.927),
    "AutoencodeEasy": ("POPGym: watch 52 suits, then recite them in reverse", "52 suits (stack)", -0.5),
}

_POPGYM_TASKS: tuple[MemoryTask, ...] = tuple(
    MemoryTask(
        id=popgym_id(name),
        description=desc,
        memory=memory,
        random_score=random_score,
        optimal_score=1.0,
        entry_point=_POPGYM,
        kwargs={"name": name},
        extra="popgym",
    )
    for name, (desc, memory, random_score) in _POPGYM_DIAGNOSTIC.items()
)

MEMORY_TASKS: dict[str, MemoryTask] = {task.id: task for task in (*_CORE_TASKS, *_POPGYM_TASKS)}
"""Described ``rlt/`` ids -> :class:`MemoryTask` (core tasks, MiniGrid Memory, POPGym diagnostics)."""

POPGYM_IDS: tuple[str, ...] = tuple(popgym_id(name) for name in POPGYM_NAMES)
"""Every registered ``rlt/popgym-<Name>-v0`` id (all need ``pip install rl-transformers[popgym]``)."""


def registered_ids() -> tuple[str, ...]:
    """All ids this package registers: the tasks of ``MEMORY_TASKS`` plus every POPGym id."""
    return tuple(dict.fromkeys((*MEMORY_TASKS, *POPGYM_IDS)))


def register_all() -> None:
    """Register every ``rlt/`` id with Gymnasium (idempotent)."""
    for task in _CORE_TASKS:
        if task.id not in gym.registry:
            gym.register(
                id=task.id,
                entry_point=task.entry_point,
                kwargs=dict(task.kwargs),
                max_episode_steps=task.max_episode_steps,
                reward_threshold=task.reward_threshold,
            )
    for name in POPGYM_NAMES:
        env_id = popgym_id(name)
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=_POPGYM, kwargs={"name": name})


POPGYM_RETURN_BOUNDS = (-1.0, 1.0)
"""POPGym scales every task's episode return to [-1, 1] (Morad et al. 2023, arXiv 2303.01859)."""


def return_bounds(env_id: str, kwargs: dict[str, Any] | None = None) -> tuple[float, float] | None:
    """Lowest and highest undiscounted episode return of a registered ``rlt/`` task built with ``kwargs`` (None:
    not stated). T-Maze: ``L * penalty`` (default penalty -1/L) to ``goal_reward``; POPGym: [-1, 1]."""
    if env_id in POPGYM_IDS:
        return POPGYM_RETURN_BOUNDS
    task = MEMORY_TASKS.get(env_id)
    if task is None or task.return_bounds is None:
        return None
    if task.entry_point != _TMAZE:
        return task.return_bounds
    args = {**task.kwargs, **(kwargs or {})}
    length = int(args.get("corridor_length", 10))
    penalty = args.get("penalty")
    step = -1.0 / length if penalty is None else float(penalty)
    return (length * step, float(args.get("goal_reward", 1.0)))
