"""How much of the T-Maze cue reaches the junction, in freshly initialised policies or in a run's checkpoints.

A policy reads the cue at the junction only through its core's features there. Before training, how far those
features move with the cue is what the gradient that teaches the lookup starts from: the policy loss reaches the
cue's key and query projections through the attention weight on the cue, so a cue diluted among many remembered
steps gives a small difference and a weak signal. For each policy the tool walks the scripted episode of
:mod:`junction_probe` (east to the junction, once per cue) step by step, as acting does, and reports at the
junction

- ``feature_gap``: ||y(+1) - y(-1)|| / mean(||y(+1)||, ||y(-1)||), the core features' relative difference
  between the two cues (0: the junction does not see the cue);
- ``p_cue``: the probability of the cue's arm (north after +1, south after -1), averaged over the two cues
  (0.25 for a uniform policy, 1 for one that reads the cue).

and with ``--attention`` also

- ``attn_cue_layer<n>``: the attention weight that layer n's junction query puts on the cue's own step (episode
  position 0), averaged over heads and cues (1 / (L + 1) for attention that is uniform over the episode). A
  junction can read the cue without it: a lower layer's features at later steps can carry the cue onward.

A fresh policy is the transformer policy of a task's runs (rotary positions, the recipes' default) with the given
memory, its observation normaliser set to the scripted episodes' moments (those of any walk east, so the clip-3
scaled observations the runs see); a checkpoint keeps its own normaliser.

    python -m experiments.memory_tasks.cue_signal --corridor 400 --memory knn \
        --memory-options '{"mem_len": 64, "store_size": 512}' --seeds 0 1 2 3 4 5 6 7 8 9
    python -m experiments.memory_tasks.cue_signal --corridor 400 --checkpoints runs/.../checkpoints/step_*.pt
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch
from torch import Tensor

from experiments.memory_tasks.junction_probe import ppo_checkpoint, scripted_episode
from rl_transformers.backbone import Backbone
from rl_transformers.backbone.attention import full as full_attention
from rl_transformers.policies.actor_critic import ActorCritic
from rl_transformers.policies.gtrxl import PolicyConfig, gtrxl_backbone, make_policy
from rl_transformers.utils.atomic import atomic_write_text
from rl_transformers.utils.errors import run_cli

NORTH, SOUTH = 1, 3
"""rlt T-Maze actions of the two arms (envs/tmaze.py)."""


def signal(policy: ActorCritic, corridor: int, attention: bool = False) -> dict[str, float]:
    """``feature_gap`` and ``p_cue`` of ``policy`` at the junction of a corridor-``corridor`` walk (one step at a
    time, from a fresh state); with ``attention``, each layer's ``attn_cue_layer<n>`` there too."""
    obs = scripted_episode(corridor)
    starts = torch.zeros(obs.shape[:2], dtype=torch.bool)
    starts[:, 0] = True
    policy.eval()
    with torch.no_grad(), cue_attention(policy, attention) as on_cue:
        state = policy.acting_state(policy.initial_state(2))
        for t in range(obs.shape[1]):
            y, state = policy.eager_step(obs[:, t], state, starts[:, t])
        probs = policy.actor(policy.head_inputs(y)[0]).logits.softmax(-1)
    gap = (y[0] - y[1]).norm() / y.norm(dim=-1).mean()
    row = {"feature_gap": float(gap), "p_cue": float((probs[0, NORTH] + probs[1, SOUTH]) / 2)}
    return row | {f"attn_cue_layer{layer}": weight for layer, weight in sorted(on_cue.items())}


@contextmanager
def cue_attention(policy: ActorCritic, active: bool = True) -> Iterator[dict[int, float]]:
    """Within the block, each call of the dense attention path (``full`` attention) records, per layer, the weight
    of its last query on the keys at episode position 0, averaged over heads and rows; a layer's last call wins,
    so after a walk that ends at the junction the dict holds the junction's weights. The backbone collects
    diagnostics meanwhile, which routes every call through that path. Inactive: yields an empty dict."""
    weights: dict[int, float] = {}
    backbone, inner = policy.core.backbone, full_attention.dense_attention
    if not active or not isinstance(backbone, Backbone):
        yield weights
        return

    def spy(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, position: Any, q_pos: Tensor, k_pos: Tensor,
            layer: int, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:  # fmt: skip
        out, probs = inner(q, k, v, mask, position, q_pos, k_pos, layer, *args, **kwargs)
        first = (k_pos == 0).to(probs.dtype)[:, None, :]  # (B, 1, S); masked keys have weight 0
        weights[layer] = float((probs[..., -1, :] * first).sum(-1).mean())
        return out, probs

    collecting = backbone.collect_info
    full_attention.dense_attention, backbone.collect_info = spy, True
    try:
        yield weights
    finally:
        full_attention.dense_attention, backbone.collect_info = inner, collecting


def fresh_policy(corridor: int, memory: str | None, memory_options: dict[str, Any], seed: int) -> ActorCritic:
    """The runs' transformer policy (rotary positions, clip-3 observation scaling) with this memory, initialised
    from ``seed``, its normaliser at the scripted episodes' moments."""
    backbone = dataclasses.replace(
        gtrxl_backbone(), position="rope", memory=memory, memory_options=dict(memory_options)
    )
    config = PolicyConfig(backbone=backbone, norm_obs=True, norm_obs_clip=3.0)
    env = gym.make("rlt/TMaze-v0", corridor_length=corridor)
    spaces = env.observation_space, env.action_space
    env.close()
    torch.manual_seed(seed)
    policy = make_policy(config, *spaces)
    assert policy.obs_norm is not None
    policy.obs_norm.update(scripted_episode(corridor))
    return policy


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--corridor", type=int, required=True, help="corridor length L")
    parser.add_argument("--checkpoints", type=Path, nargs="+", help="PPO checkpoints (else: fresh policies)")
    parser.add_argument("--memory", default="xl", help="fresh policies' memory name, or None (default: xl)")
    parser.add_argument("--memory-options", type=json.loads, default={}, help="JSON options of the memory")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(10)), help="fresh policies' seeds")
    parser.add_argument(
        "--attention", action="store_true", help="also each layer's attention weight on the cue's step"
    )
    parser.add_argument("--out", type=Path, help="also write {label: row} to this JSON file")
    args = parser.parse_args(argv)
    import envs  # noqa: F401  registers rlt/TMaze-v0

    if args.checkpoints is None:
        memory = None if args.memory == "None" else args.memory
        rows = [signal(fresh_policy(args.corridor, memory, args.memory_options, s), args.corridor, args.attention)
                for s in args.seeds]  # fmt: skip
        labels = [f"seed {s}" for s in args.seeds]
    else:
        rows = [signal(ppo_checkpoint(p).policy, args.corridor, args.attention) for p in args.checkpoints]
        labels = [
            f"{p.parent.parent.name}/{p.name}" for p in args.checkpoints
        ]  # run folder / checkpoint file
    for label, row in zip(labels, rows, strict=True):
        layers = "".join(f"  {k[5:]} {v:.4f}" for k, v in row.items() if k.startswith("attn_"))
        print(f"{label}: feature_gap {row['feature_gap']:.4f}  p_cue {row['p_cue']:.3f}{layers}")
    if args.out is not None:
        table = {
            label: {k: round(v, 6) for k, v in row.items()} for label, row in zip(labels, rows, strict=True)
        }
        atomic_write_text(args.out, json.dumps(table, indent=1) + "\n")
    if len(rows) > 1:
        median = statistics.median(r["feature_gap"] for r in rows)
        print(f"median feature_gap {median:.4f} over {len(rows)}")


if __name__ == "__main__":
    run_cli(main)
