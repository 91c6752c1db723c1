"""experiments/memory_tasks/junction_probe.py: its scripted episode is the one rlt/TMazeAltLong-v0 emits when
walked east, and its one-pass probabilities equal the policy's step-by-step acting path."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import envs  # noqa: F401  (registers the rlt/ ids)
from experiments.memory_tasks import junction_probe
from rl_transformers.agents.load import load
from rl_transformers.algos.ppo import train
from rl_transformers.algos.ppo_config import TrainConfig
from rl_transformers.policies.gtrxl import PolicyConfig
from rl_transformers.utils.errors import UserError


def env_episodes() -> torch.Tensor:
    """Observations of the real env walked east to the junction, one episode per cue side (+1 first)."""
    env, found = gym.make("rlt/TMazeAltLong-v0"), {}
    for seed in range(20):
        obs, _ = env.reset(seed=seed)
        rows = [obs]
        for _ in range(junction_probe.CORRIDOR):
            obs, *_ = env.step(0)
            rows.append(obs)
        found.setdefault(float(rows[0][0]), torch.from_numpy(np.array(rows)))
    return torch.stack([found[1.0], found[-1.0]])


def test_scripted_episode_is_the_env_walked_east() -> None:
    assert torch.equal(junction_probe.scripted_episode(), env_episodes())


def test_probabilities_match_step_by_step_acting(tmp_path: Path) -> None:
    cfg = TrainConfig(
        env_id="rlt/TMazeAltLong-v0",
        total_timesteps=4096,
        save_every=2048,
        eval_every=0,
        run_root=tmp_path,
        policy=PolicyConfig(norm_obs=True),
    )
    run = train(cfg).run_dir
    rows = junction_probe.probe(run)
    assert [r[0] for r in rows] == [2048, 4096]
    policy = load(run / "checkpoints" / "step_4096.pt").policy
    obs, state = env_episodes(), policy.initial_state(2)
    with torch.no_grad():
        for t in range(obs.shape[1]):
            h, state = policy.eager_step(obs[:, t], state, torch.full((2,), t == 0))
            east = policy.actor(policy.head_inputs(h)[0]).logits.exp()[:, 0].mean()
            if t == obs.shape[1] - 2:
                corridor = float(east)
    assert abs(rows[-1][1] - corridor) < 1e-3 and abs(rows[-1][2] - float(east)) < 1e-3
    assert 0 < rows[-1][2] < 1


def test_a_checkpoint_that_is_not_ppo_s_is_named_in_a_user_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(junction_probe, "load", lambda path: object())  # e.g. a Decision Transformer's
    with pytest.raises(UserError, match=r"dt\.pt: not a PPO step checkpoint"):
        junction_probe.ppo_checkpoint(tmp_path / "dt.pt")
