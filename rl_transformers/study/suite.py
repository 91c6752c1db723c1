"""The encoder study's tasks and budgets (presets ``quick`` and ``full``).

Online (PPO): the passive T-Maze with a corridor of 10 (Ni et al. 2023, arXiv 2307.03864) and five POPGym Easy
tasks (Morad et al. 2023, arXiv 2303.01859) spanning four of its five tags - diagnostic (RepeatPrevious),
control (PositionOnlyCartPole, the paper's "Stateless CartPole"), noisy (NoisyPositionOnlyCartPole), game
(CountRecall, MineSweeper); the navigation tag (Labyrinth) needs ``mazelib`` and is not registered. POPGym
returns are on its [-1, 1] scale; the T-Maze greedy return equals the success rate when the agent keeps to
the schedule (it is a lower bound otherwise: late steps cost ``-1/L`` each).

Offline (Decision Transformer): two datasets built locally by ``scripts/make_dataset.py`` (commands in
:data:`DATASET_COMMANDS`): CartPole-v1 medium-replay (discrete) and Pendulum-v1 medium (continuous); the score
is the normalized score ``100 (R - ref_min) / (ref_max - ref_min)`` at the fixed target return ``ref_max``.

Every encoder on a task gets the same hyper-parameters (as POPGym did): the PPO defaults of
:class:`~rl_transformers.algos.ppo_config.PPOConfig` (32 envs x 64 steps, 16-step training windows) and
the DT settings in :data:`DT_ARGS`. Budgets are whole PPO updates (multiples of 2,048 env steps) with an
evaluation (16 greedy episodes) every ``eval_every`` steps: at the last update where the budget is a multiple of
it (the POPGym tasks), not on T-Maze 10 (64 updates, every 5: the last evaluation is after update 60).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from rl_transformers.utils.errors import UserError, choice_hint

Algo = Literal["ppo", "dt"]
PRESETS = ("quick", "full")
BATCH = 32 * 64
"""Env steps per PPO update with the default 32 envs x 64 steps."""


@dataclass(frozen=True)
class Task:
    """One task of the suite with its per-preset budget."""

    name: str
    algo: Algo
    tag: str
    budget: dict[str, int]
    """Per preset: env steps (PPO) or gradient updates (DT)."""
    eval_every: dict[str, int]
    """Per preset: env steps (PPO) or updates (DT) between evaluations."""
    env_id: str | None = None
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    dataset: str | None = None
    target: float | None = None
    """DT: the fixed target return (raw) of the normalized score."""
    score_note: str = ""


def _ppo(name: str, env_id: str, tag: str, quick: int, full: int, note: str, **kwargs: Any) -> Task:
    return Task(
        name=name,
        algo="ppo",
        tag=tag,
        budget={"quick": quick * BATCH, "full": full * BATCH},
        eval_every={"quick": max(1, quick // 4) * BATCH, "full": max(1, full // 12) * BATCH},
        env_id=env_id,
        env_kwargs=kwargs,
        score_note=note,
    )


POPGYM = "POPGym MMER on [-1, 1]"
ONLINE: tuple[Task, ...] = (
    _ppo("TMaze10", "rlt/TMaze-v0", "memory", 4, 64, "greedy return (= success rate on schedule)",
         corridor_length=10),
    _ppo("RepeatPreviousEasy", "rlt/popgym-RepeatPreviousEasy-v0", "diagnostic", 4, 96, POPGYM),
    _ppo("PositionOnlyCartPoleEasy", "rlt/popgym-PositionOnlyCartPoleEasy-v0", "control", 4, 96, POPGYM),
    _ppo("NoisyPositionOnlyCartPoleEasy", "rlt/popgym-NoisyPositionOnlyCartPoleEasy-v0", "noisy", 4, 96,
         POPGYM),
    _ppo("CountRecallEasy", "rlt/popgym-CountRecallEasy-v0", "game", 4, 96, POPGYM),
    _ppo("MineSweeperEasy", "rlt/popgym-MineSweeperEasy-v0", "game", 4, 96, POPGYM),
)  # fmt: skip
"""Online tasks. Full budgets: 64-96 updates of 2,048 steps (131k-197k env steps): GTrXL needs ~113k steps
on T-Maze corridor 10 and ~184k on RepeatPreviousEasy (docs/results/online.md), so smaller budgets compare
encoders that have not learned yet."""

DATASET_ROOT = "datasets/minari"
OFFLINE: tuple[Task, ...] = (
    Task("CartPole-medium-replay", "dt", "discrete", {"quick": 300, "full": 1500}, {"quick": 300, "full": 500},
         dataset="rlt/cartpole/medium-replay-v0", target=500.0, score_note="normalized score at R*=500"),
    Task("Pendulum-medium", "dt", "continuous", {"quick": 300, "full": 1500}, {"quick": 300, "full": 500},
         dataset="rlt/pendulum/medium-v0", target=-150.0, score_note="normalized score at R*=-150"),
)  # fmt: skip
"""Offline tasks (Minari ids under :data:`DATASET_ROOT`)."""

DT_ARGS: dict[str, Any] = {
    "context_len": 10,
    "batch_size": 64,
    "learning_rate": 6e-4,
    "warmup_steps": 200,
    "eval_episodes": 10,
    "log_every": 100,
}
"""Decision Transformer settings shared by every encoder (the README's reduced-scale Pendulum protocol)."""

DATASET_COMMANDS = (
    "python scripts/make_dataset.py --env-id CartPole-v1 --kinds medium-replay --medium-return 100 "
    "--total-timesteps 50000 --eval-freq 5000 --num-episodes 200 --num-ref-episodes 50 --root datasets/minari "
    "--seed 0 --policy-dir runs/study/datasets/CartPole-v1/s0 --no-progress",
    "python scripts/make_dataset.py --env-id Pendulum-v1 --kinds medium --root datasets/minari --seed 0 "
    "--total-timesteps 20000 --medium-return -800 --eval-freq 500 --n-eval-episodes 5 --num-episodes 100 "
    "--num-ref-episodes 50 --sac-learning-starts 1000 --policy-dir runs/study/datasets/Pendulum-v1/s0 "
    "--no-progress",
)
"""How the two offline datasets were built (OMP_NUM_THREADS=1)."""

SEEDS = {"quick": (0,), "full": (0, 1, 2)}
"""Seeds per preset."""


def tasks(algo: Algo | None = None, names: tuple[str, ...] = ()) -> tuple[Task, ...]:
    """The suite's tasks (optionally of one algorithm / the given names, with a closest-match error)."""
    pool = [t for t in (*ONLINE, *OFFLINE) if algo is None or t.algo == algo]
    if not names:
        return tuple(pool)
    known = sorted(t.name for t in (*ONLINE, *OFFLINE))
    for name in names:
        if name not in known:
            raise UserError(f"unknown task {name!r}; {choice_hint(name, known)}", source="--tasks")
    return tuple(t for t in pool if t.name in names)


def check_preset(preset: str) -> str:
    if preset not in PRESETS:
        raise UserError(f"unknown preset {preset!r}; {choice_hint(preset, PRESETS)}", source="--preset")
    return preset
