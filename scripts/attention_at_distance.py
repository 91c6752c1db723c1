"""Where a trained `xl_relative` policy looks: its position term and attention mass at one distance.

Loads PPO checkpoints (files or run directories), plays greedy episodes of the checkpoint's own env, and at one
step of each episode (``--step``, when the XL memory is full of that episode) splits every head's logits into
the content part ((q + u)·k) / sqrt(D) and the position part ((q + v)·W_R R_{i-j}) / sqrt(D) of Transformer-XL
(Dai et al. 2019, arXiv 1901.02860). Per layer it prints the largest std of the position part over the keys, the
most negative "position at distance d minus the row mean" over heads, and the largest attention mass at distance
d over heads, averaged over episodes. Distance d = 3 is the key RepeatPreviousEasy's action needs (its k = 4
counts the current observation). Used by docs/results/xl_relative.md.

    python scripts/attention_at_distance.py runs/ppo/rlt-popgym-RepeatPreviousEasy-v0/<run> --distance 3
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import tyro

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rl_transformers.backbone.position.relative import XLRelativePosition, per_head  # noqa: E402
from rl_transformers.policies import ActorCritic  # noqa: E402
from rl_transformers.utils.errors import UserError, run_cli  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Args:
    checkpoints: tyro.conf.Positional[tuple[Path, ...]]
    """PPO checkpoint files or run directories (their latest checkpoint)."""
    distance: int = 3
    """The key distance to report (0 = the current token)."""
    step: int = 40
    """Step of each episode at which the heads are read (the memory should be full of that episode)."""
    episodes: int = 16
    seed: int = 0


def split_logits(policy: ActorCritic, act: Callable[[], Any]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """[(content, position)] per layer, each (B, H, Tq, Tk) and scaled, recorded while ``act()`` runs."""
    found = [m for m in policy.modules() if isinstance(m, XLRelativePosition)]
    if not found:
        raise UserError("the policy has no xl_relative position (--backbone.position xl_relative)")
    pos = found[0]
    record: list[tuple[torch.Tensor, torch.Tensor]] = []
    original = pos.logits_aligned

    def spy(
        q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, layer: int
    ) -> torch.Tensor:
        content = torch.matmul(q + per_head(pos.u.to(q.dtype), q), k.transpose(-1, -2)) * pos.scale
        position = pos.aligned_scores(q + per_head(pos.v.to(q.dtype), q), k.shape[-2], layer) * pos.scale
        logits = original(q, k, q_pos, k_pos, layer)
        if not torch.allclose(content + position, logits, atol=1e-5):
            raise RuntimeError("the split does not add up to the layer's logits: XLRelativePosition changed")
        record.append((content, position))
        return logits

    pos.logits_aligned = spy  # type: ignore[method-assign]
    try:
        act()
    finally:
        del pos.logits_aligned
    return record


def summarize(record: list[tuple[torch.Tensor, torch.Tensor]], distance: int) -> list[dict[str, float]]:
    """Per layer: max over heads of the position std over keys, min over heads of position[d] - row mean, max over
    heads of the attention mass at d; each averaged over the batch (rows of the last query)."""
    out = []
    for content, position in record:
        c, p = content[..., -1, :], position[..., -1, :]  # (B, H, Tk): the current step's query
        col = p.shape[-1] - 1 - distance
        probs = torch.softmax(c + p, dim=-1)
        out.append({
            "position_std": float(p.std(-1).mean(0).max()),
            "position_at_d_minus_mean": float((p[..., col] - p.mean(-1)).mean(0).min()),
            "mass_at_d": float(probs[..., col].mean(0).max()),
            "keys": int(p.shape[-1]),
        })  # fmt: skip
    return out


def read(path: Path, a: Args) -> list[dict[str, float]]:
    from rl_transformers.algos.env_util import make_env_thunk
    from rl_transformers.algos.ppo_checkpoint import load_policy

    policy, cfg = load_policy(path)
    policy.eval()
    per_episode = []
    for episode in range(a.episodes):
        env = make_env_thunk(cfg.env_id, cfg.env_kwargs)()
        obs, _ = env.reset(seed=a.seed + episode)
        state, start = policy.initial_state(1), torch.ones(1, dtype=torch.bool)
        with torch.no_grad():
            for _ in range(a.step):
                out = policy.act(
                    torch.as_tensor(obs, dtype=torch.float32)[None], state, start, deterministic=True
                )
                obs, _, term, trunc, _ = env.step(policy.to_env(out.action)[0])
                if term or trunc:
                    raise UserError(f"an episode of {cfg.env_id} ended before --step {a.step}; lower it")
                state, start = out.state, torch.zeros(1, dtype=torch.bool)
            x = torch.as_tensor(obs, dtype=torch.float32)[None]
            rec = split_logits(policy, lambda: policy.act(x, state, start, deterministic=True))  # noqa: B023
        per_episode.append(summarize(rec, a.distance))
        env.close()
    return [{k: float(np.mean([e[i][k] for e in per_episode])) for k in per_episode[0][i]}
            for i in range(len(per_episode[0]))]  # fmt: skip


def main(a: Args) -> None:
    if not a.checkpoints:
        raise UserError("name at least one checkpoint or run directory")
    for path in a.checkpoints:
        print(json.dumps({"checkpoint": str(path), "distance": a.distance, "layers": read(path, a)}))


if __name__ == "__main__":
    run_cli(lambda: main(tyro.cli(Args, description=__doc__)))
