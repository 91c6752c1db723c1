"""experiments/memory_tasks/transfer.py: a checkpoint's weights in a memory sized to another corridor act as the
checkpoint does where both memories hold the whole episode, and each corridor gets its row."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

import envs  # noqa: F401  (registers the rlt/ ids)
from experiments.memory_tasks import cue_signal, transfer
from experiments.memory_tasks.junction_probe import ppo_checkpoint
from rl_transformers.algos.ppo import train
from rl_transformers.policies import PolicyConfig, gtrxl_backbone
from rl_transformers.utils.errors import UserError
from tests.algos.test_ppo import BATCH, tiny

CORRIDOR = 6


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = tiny(tmp_path_factory.mktemp("run"), "rlt/TMazeAltLong-v0", updates=2, save_every=BATCH)
    policy = PolicyConfig(backbone=gtrxl_backbone(16, 1, 2, mem_len=8), norm_obs=True)
    cfg = dataclasses.replace(cfg, env_kwargs={"corridor_length": CORRIDOR}, policy=policy)
    run_dir = train(cfg).run_dir
    assert run_dir is not None
    return sorted((run_dir / "checkpoints").glob("step_*.pt"))[-1]


def test_memory_sizes() -> None:
    assert [transfer.memory_for(c) for c in (100, 200, 300, 400)] == [128, 256, 384, 512]


def test_at_its_own_corridor_the_resized_policy_scores_as_the_checkpoint(checkpoint: Path) -> None:
    row = transfer.transfer(ppo_checkpoint(checkpoint), CORRIDOR, episodes=8, seed=7)
    assert transfer.memory_for(CORRIDOR) == 7 != 8  # both hold the 7-step episode
    returns, _ = ppo_checkpoint(checkpoint).evaluate(8, seed=7)
    assert row["mean_return"] == pytest.approx(float(np.mean(returns)), abs=1e-6)
    assert row["solved_share"] == pytest.approx(float(np.mean(returns > 0.5)))
    assert row["trained_corridor"] == CORRIDOR and row["step"] == 2 * BATCH
    own = cue_signal.signal(ppo_checkpoint(checkpoint).policy, CORRIDOR, attention=True)
    assert own["feature_gap"] > 0
    for key, value in own.items():  # the junction's features, policy and attention, to rounding
        assert row[key] == pytest.approx(value, rel=1e-4, abs=1e-7), key


def test_the_command_writes_a_row_per_corridor(tmp_path: Path, checkpoint: Path) -> None:
    out = tmp_path / "transfer.json"
    transfer.main([str(checkpoint), "--corridors", "6", "20", "--episodes", "4", "--out", str(out)])
    (rows,) = json.loads(out.read_text(encoding="utf-8")).values()
    assert list(rows) == ["6", "20"]
    assert {"mean_return", "feature_gap", "p_cue", "attn_cue_layer0"} <= rows["20"].keys()
    assert -1.0 <= rows["20"]["mean_return"] <= 1.0


def test_only_xl_memories_are_resized(checkpoint: Path) -> None:
    agent = ppo_checkpoint(checkpoint)
    other = dataclasses.replace(agent.config.policy.backbone, memory="knn")
    with pytest.raises(UserError, match="XL memories only"):
        transfer.resized(agent.policy, dataclasses.replace(agent.config.policy, backbone=other), 16)
