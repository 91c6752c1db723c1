"""experiments/memory_tasks/cue_signal.py: the junction sees the cue exactly when the policy's memory reaches it,
a fresh policy is uniform over the actions, and the normaliser holds the moments of a walk east."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import envs  # noqa: F401  (registers the rlt/ ids)
from experiments.memory_tasks import cue_signal
from experiments.memory_tasks.junction_probe import scripted_episode
from rl_transformers.policies.actor_critic import ActorCritic


def test_a_memory_that_reaches_the_cue_carries_it_to_the_junction() -> None:
    reached = cue_signal.signal(cue_signal.fresh_policy(20, "xl", {"mem_len": 32}, seed=0), 20)
    assert reached["feature_gap"] > 1e-5


def test_a_context_shorter_than_the_corridor_does_not() -> None:
    # no memory: each of the 2 layers attends over its last context_len (64) steps, so the junction sees 128
    # steps back through the stack, and the cue is 150 back
    cut = cue_signal.signal(cue_signal.fresh_policy(150, None, {}, seed=0), 150)
    assert cut["feature_gap"] == 0.0
    assert cut["p_cue"] == pytest.approx(0.25, abs=0.01)  # the actor head starts near uniform


def test_a_fresh_policy_normalises_as_the_runs_do() -> None:
    corridor = 40
    norm = cue_signal.fresh_policy(corridor, "xl", {"mem_len": 64}, seed=1).obs_norm
    assert norm is not None
    walked = scripted_episode(corridor).reshape(-1, 2).double()
    torch.testing.assert_close(norm.mean, walked.mean(0))
    torch.testing.assert_close(norm.var, walked.var(0, unbiased=False))
    cue = norm(scripted_episode(corridor))[:, 0, 0]
    assert cue.tolist() == [3.0, -3.0]  # +-sqrt(L + 1) = 6.4 before the clip of 3


def test_the_command_writes_each_policy_s_row(tmp_path: Path) -> None:
    out = tmp_path / "signal.json"
    cue_signal.main(["--corridor", "20", "--memory-options", '{"mem_len": 32}', "--seeds", "0", "3",
                     "--out", str(out)])  # fmt: skip
    rows = json.loads(out.read_text(encoding="utf-8"))
    assert list(rows) == ["seed 0", "seed 3"]
    again = cue_signal.signal(cue_signal.fresh_policy(20, "xl", {"mem_len": 32}, seed=3), 20)
    assert rows["seed 3"]["feature_gap"] == pytest.approx(again["feature_gap"], abs=1e-6)


def uniform_attention_policy(corridor: int, mem_len: int) -> ActorCritic:
    policy = cue_signal.fresh_policy(corridor, "xl", {"mem_len": mem_len}, seed=0)
    with torch.no_grad():
        for name, param in policy.core.backbone.named_parameters():
            if ".q_proj." in name:
                param.zero_()  # every logit 0 (rotary positions rotate a zero query to zero): uniform attention
    return policy


def test_attention_that_ignores_content_puts_one_share_on_the_cue_step() -> None:
    corridor = 20
    policy = uniform_attention_policy(corridor, mem_len=32)
    row = cue_signal.signal(policy, corridor, attention=True)
    # the junction's query sees the corridor's 20 remembered steps and itself
    assert row["attn_cue_layer0"] == pytest.approx(1 / (corridor + 1), rel=1e-5)
    assert row["attn_cue_layer1"] == pytest.approx(1 / (corridor + 1), rel=1e-5)
    assert "attn_cue_layer0" not in cue_signal.signal(policy, corridor)


def test_a_memory_that_has_dropped_the_cue_step_gives_it_no_weight() -> None:
    # the junction remembers steps 10-19 only: the weight is on the cue's position, not on the oldest key
    row = cue_signal.signal(uniform_attention_policy(20, mem_len=10), 20, attention=True)
    assert row["attn_cue_layer0"] == 0.0 and row["attn_cue_layer1"] == 0.0


def test_the_attention_spy_is_removed_after_its_walk() -> None:
    policy = cue_signal.fresh_policy(20, "xl", {"mem_len": 32}, seed=0)
    inner = cue_signal.full_attention.dense_attention
    spied = cue_signal.signal(policy, 20, attention=True)
    assert cue_signal.full_attention.dense_attention is inner and not policy.core.backbone.collect_info
    assert 0 < spied["attn_cue_layer0"] < 1
    # the dense path it routes through gives the fused path's features, to rounding
    assert spied["feature_gap"] == pytest.approx(cue_signal.signal(policy, 20)["feature_gap"], rel=1e-4)
