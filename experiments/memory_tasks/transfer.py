"""A T-Maze policy trained at one corridor length, evaluated at others (no training: zero-shot transfer).

The policy's weights are the checkpoint's; its memory is sized to each corridor (an XL memory of
``128 * L / 100`` steps: 128 at corridor 100, 512 at 400, the probes' sizes), since a memory holds no weights.
Each row gives the greedy return over ``--episodes`` episodes of the recoverable T-Maze at that corridor and,
from :mod:`cue_signal`, the junction's ``feature_gap``, ``p_cue`` and each layer's attention weight on the cue's
step along the scripted walk east. A policy whose lookup is content-based (the cue's observation, not its
distance) keeps reading the cue in longer corridors; one that learnt a distance does not.

    python -m experiments.memory_tasks.transfer runs/.../checkpoints/last.pt --corridors 100 200 300 400 \
        --out experiments/memory_tasks/tuning/tmaze_alt_transfer/c100_s100.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import torch

from experiments.memory_tasks.cue_signal import signal
from experiments.memory_tasks.junction_probe import ppo_checkpoint
from rl_transformers.agents.ppo_agent import PPOAgent
from rl_transformers.algos.evaluation import evaluate_episodes
from rl_transformers.policies.actor_critic import ActorCritic
from rl_transformers.policies.gtrxl import PolicyConfig, make_policy
from rl_transformers.utils.atomic import atomic_write_text
from rl_transformers.utils.errors import UserError, run_cli


def memory_for(corridor: int) -> int:
    """XL memory length at corridor ``corridor``: the whole episode and a margin (128 at 100, 512 at 400)."""
    return 128 * corridor // 100


def resized(agent_policy: ActorCritic, policy_cfg: PolicyConfig, mem_len: int) -> ActorCritic:
    """``agent_policy``'s weights in a policy whose XL memory holds ``mem_len`` steps."""
    backbone = policy_cfg.backbone
    if backbone.memory != "xl":
        raise UserError(f"memory {backbone.memory!r}: this tool resizes XL memories only")
    options = {**backbone.memory_options, "mem_len": mem_len}
    cfg = dataclasses.replace(policy_cfg, backbone=dataclasses.replace(backbone, memory_options=options))
    policy = make_policy(cfg, agent_policy.observation_space, agent_policy.action_space)
    policy.load_state_dict(agent_policy.state_dict())
    return policy.eval()


def transfer(agent: PPOAgent, corridor: int, episodes: int, seed: int) -> dict[str, float]:
    """Greedy return and the junction's cue signal of ``agent``'s policy at corridor ``corridor``."""
    cfg = agent.config
    policy = resized(agent.policy, cfg.policy, memory_for(corridor))
    env_kwargs = {**cfg.env_kwargs, "corridor_length": corridor}
    with torch.no_grad():
        stats = evaluate_episodes(
            policy, cfg.env_id, env_kwargs, episodes, seed=seed, seq_len=cfg.ppo.seq_len
        )
    row = {
        "trained_corridor": float(cfg.env_kwargs.get("corridor_length", 100)),
        "step": float(agent.step or 0),
    }
    row |= {"mean_return": float(stats.returns.mean()), "solved_share": float((stats.returns > 0.5).mean())}
    return row | signal(policy, corridor, attention=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("checkpoints", type=Path, nargs="+", help="PPO step checkpoints (checkpoints/*.pt)")
    parser.add_argument(
        "--corridors", type=int, nargs="+", required=True, help="corridor lengths to evaluate"
    )
    parser.add_argument("--episodes", type=int, default=50, help="greedy episodes per corridor (default 50)")
    parser.add_argument("--seed", type=int, default=12345, help="first evaluation episode's seed")
    parser.add_argument("--out", type=Path, help="also write {checkpoint: {corridor: row}} to this JSON file")
    args = parser.parse_args(argv)
    import envs  # noqa: F401  registers rlt/TMazeAltLong-v0

    table: dict[str, dict[str, dict[str, float]]] = {}
    for path in args.checkpoints:
        label, agent = f"{path.parent.parent.name}/{path.name}", ppo_checkpoint(path)
        for corridor in args.corridors:
            row = transfer(agent, corridor, args.episodes, args.seed)
            table.setdefault(label, {})[str(corridor)] = {k: round(v, 6) for k, v in row.items()}
            print(
                f"{label} at corridor {corridor}: return {row['mean_return']:.2f}, solved "
                f"{row['solved_share']:.2f}, feature_gap {row['feature_gap']:.4f}, p_cue {row['p_cue']:.3f}"
            )
    if args.out is not None:
        atomic_write_text(args.out, json.dumps(table, indent=1) + "\n")


if __name__ == "__main__":
    run_cli(main)
