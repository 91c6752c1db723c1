"""PPO's learning-rate schedules: with ``--ppo.anneal-horizon H`` the rate at env step s is
``lr0 * max(0, 1 - s / H)`` whatever the budget, while the default anneals over the budget (two budgets, two
schedules); resume keeps the horizon schedule and refuses a changed horizon."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from rl_transformers.algos.ppo import train
from rl_transformers.algos.ppo_config import (
    RESUME_MUTABLE,
    RESUME_PER_INVOCATION,
    PPOConfig,
    TrainConfig,
    resume_config,
)
from rl_transformers.policies import PolicyConfig
from rl_transformers.runs.checkpoint import atomic_save
from rl_transformers.runs.resume import ResumeRefused, parse_cli
from rl_transformers.utils.config_json import to_jsonable
from rl_transformers.utils.errors import UserError

BATCH = 2 * 8  # num_envs * num_steps
LR = 1e-3


def tiny(root: Path, updates: int, horizon: int | None = None, anneal: bool = True) -> TrainConfig:
    ppo = PPOConfig(
        num_steps=8, seq_len=8, num_minibatches=1, update_epochs=1, learning_rate=LR, anneal_lr=anneal,
        anneal_horizon=horizon, info_every=0,
    )  # fmt: skip
    return TrainConfig(
        env_id="rlt/TMazeShort-v0",
        total_timesteps=updates * BATCH,
        num_envs=2,
        seed=5,
        policy=PolicyConfig(kind="mlp"),
        ppo=ppo,
        eval_every=0,
        run_root=str(root),
        progress=False,
    )


def logged_rates(run_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]
    return [r["train/learning_rate"] for r in rows]


def closed_form(steps: list[int], horizon: float) -> list[float]:
    return [LR * max(0.0, 1.0 - s / horizon) for s in steps]


def test_horizon_rate_closed_form() -> None:
    ppo = PPOConfig(learning_rate=LR, anneal_horizon=1000)
    for step, want in [(0, LR), (250, 0.75 * LR), (999, LR / 1000), (1000, 0.0), (5000, 0.0)]:
        assert ppo.horizon_rate(step) == pytest.approx(want, rel=1e-12, abs=1e-18)


def test_two_budgets_share_the_horizon_schedule_and_not_the_budget_one(tmp_path: Path) -> None:
    """H = 5 updates (not a multiple of a budget): 4- and 8-update runs log the same rates on their first 4
    updates, equal to the closed form at the update's start step (0 from step H on); the default schedule
    differs between the two budgets."""
    horizon = 5 * BATCH
    short = logged_rates(train(tiny(tmp_path / "a", 4, horizon)).run_dir)
    long = logged_rates(train(tiny(tmp_path / "b", 8, horizon)).run_dir)
    assert short == long[:4]
    np.testing.assert_allclose(long, closed_form([u * BATCH for u in range(8)], horizon), rtol=1e-12, atol=0)
    assert long[5:] == [0.0, 0.0, 0.0] and long[4] > 0.0
    budget_short = logged_rates(train(tiny(tmp_path / "c", 4)).run_dir)
    budget_long = logged_rates(train(tiny(tmp_path / "d", 8)).run_dir)
    np.testing.assert_allclose(budget_short, [LR * (1 - u / 4) for u in range(4)], rtol=1e-12)
    np.testing.assert_allclose(budget_long, [LR * (1 - u / 8) for u in range(8)], rtol=1e-12)
    assert budget_short[1:] != budget_long[1:4]


def test_horizon_equal_to_the_budget_is_todays_schedule(tmp_path: Path) -> None:
    trained = logged_rates(train(tiny(tmp_path / "h", 4, horizon=4 * BATCH)).run_dir)
    default = logged_rates(train(tiny(tmp_path / "d", 4)).run_dir)
    np.testing.assert_allclose(trained, default, rtol=1e-12)


def test_constant_rate(tmp_path: Path) -> None:
    assert logged_rates(train(tiny(tmp_path, 3, anneal=False)).run_dir) == [LR] * 3


def test_resume_with_a_raised_budget_keeps_the_horizon_schedule(tmp_path: Path) -> None:
    """Stopped after 2 of 4 updates, resumed with 7: the rates are those of one uninterrupted horizon run."""
    horizon = 6 * BATCH
    first = train(tiny(tmp_path, 4, horizon), callback=lambda tr: tr.update < 2)
    resumed = train(dataclasses.replace(tiny(tmp_path, 7, horizon), resume=str(first.run_dir)))
    assert resumed.step == 7 * BATCH
    np.testing.assert_allclose(
        logged_rates(first.run_dir), closed_form([u * BATCH for u in range(7)], horizon), rtol=1e-12, atol=0
    )


def test_resume_rules_for_the_horizon(tmp_path: Path) -> None:
    assert "ppo.anneal_horizon" not in RESUME_MUTABLE  # part of the optimisation: frozen
    saved = tiny(tmp_path, 4, horizon=100)
    path = atomic_save({"config": to_jsonable(saved)}, tmp_path / "run" / "checkpoints" / "last.pt")

    def merge(*flags: str) -> TrainConfig:
        given = parse_cli(
            TrainConfig, per_invocation=RESUME_PER_INVOCATION, argv=["--resume", str(path), *flags]
        )
        return resume_config(saved, given, source="RUN")

    assert merge("--total-timesteps", "999").ppo.anneal_horizon == 100
    with pytest.raises(ResumeRefused, match=r"--ppo.anneal-horizon \(saved: 100, given: 200\)"):
        merge("--ppo.anneal-horizon", "200")
    # a config saved before the field existed resumes with today's schedule (None)
    old = to_jsonable(tiny(tmp_path, 4))
    del old["ppo"]["anneal_horizon"]
    path = atomic_save({"config": old}, tmp_path / "old" / "checkpoints" / "last.pt")
    given = parse_cli(TrainConfig, per_invocation=RESUME_PER_INVOCATION, argv=["--resume", str(path)])
    assert given.ppo.anneal_horizon is None


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"anneal_horizon": 0}, r"anneal_horizon \(--ppo.anneal-horizon\) must be an int >= 1, got 0"),
        ({"anneal_horizon": 10, "anneal_lr": False}, r"--ppo.anneal-horizon\) needs an annealed rate"),
    ],
    ids=["zero", "without-anneal"],
)
def test_bad_horizon_is_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(UserError, match=match):
        PPOConfig(**kwargs)
