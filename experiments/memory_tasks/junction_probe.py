"""Where a T-Maze corridor-100 run's policy stands at the junction, from its step checkpoints.

For each ``checkpoints/step_<n>.pt`` of each run directory (``scripts/train_gtrxl.py --env-id
rlt/TMazeAltLong-v0 --save-every N``), the probability of "east" on the last corridor step and at the junction,
on a scripted episode that walks east all the way (the cue on either side, averaged; the run's own observation
normaliser). A seed that learns to turn shows the junction's probability falling away from the corridor's; a
trapped one shows it following the corridor's to 1.

    python -m experiments.memory_tasks.junction_probe RUN_DIR [RUN_DIR ...] --out FILE.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from rl_transformers.agents.load import load
from rl_transformers.agents.ppo_agent import PPOAgent
from rl_transformers.runs.checkpoint_load import step_files
from rl_transformers.utils.atomic import atomic_write_text
from rl_transformers.utils.errors import UserError, run_cli

CORRIDOR = 100
"""Corridor length of rlt/TMazeAltLong-v0: the junction is the observation of step 100 (steps from 0)."""


def scripted_episode(corridor: int = CORRIDOR) -> torch.Tensor:
    """(2, corridor + 1, 2) observations ``[cue, at_junction]`` of an episode that walks east to the junction of
    a corridor of that length, cue +1 in row 0 and -1 in row 1."""
    obs = torch.zeros(2, corridor + 1, 2)
    obs[0, 0, 0], obs[1, 0, 0] = 1.0, -1.0
    obs[:, -1, 1] = 1.0
    return obs


def ppo_checkpoint(path: Path) -> PPOAgent:
    """The PPO agent of the step checkpoint ``path`` (a UserError naming the file otherwise)."""
    agent = load(path)
    if not isinstance(agent, PPOAgent) or agent.step is None:
        raise UserError(
            "not a PPO step checkpoint (checkpoints/step_<n>.pt of scripts/train_gtrxl.py --save-every N)",
            source=str(path),
        )
    return agent


def east_probabilities(checkpoint: Path) -> tuple[int, float, float]:
    """(env step, p(east) on the last corridor step, p(east) at the junction) of one checkpoint."""
    agent = ppo_checkpoint(checkpoint)
    assert agent.step is not None
    policy, obs = agent.policy, scripted_episode()
    starts = torch.zeros(obs.shape[:2], dtype=torch.bool)
    starts[:, 0] = True
    with torch.no_grad():
        out = policy.features(obs, policy.initial_state(2), starts)
        east = policy.actor(policy.head_inputs(out.y)[0]).logits.exp()[..., 0].mean(0)
    return agent.step, float(east[-2]), float(east[-1])


def probe(run: Path) -> list[list[float]]:
    """[step, p_corridor, p_junction] per step checkpoint of ``run``, in step order."""
    ordered = [path for _, path in sorted(step_files(run / "checkpoints").items())]
    return [[step, round(c, 4), round(j, 4)] for step, c, j in map(east_probabilities, ordered)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("runs", nargs="+", type=Path, help="run directories with step checkpoints")
    parser.add_argument(
        "--out", type=Path, required=True, help="JSON file: run name -> [step, p_c, p_j] rows"
    )
    args = parser.parse_args(argv)
    rows = {run.name: probe(run) for run in args.runs}
    atomic_write_text(args.out, json.dumps(rows, indent=1) + "\n")
    for name, cells in rows.items():
        print(name, " | ".join(f"{s // 1000}k {c:.3f}/{j:.3f}" for s, c, j in cells[::2]))


if __name__ == "__main__":
    run_cli(main)
