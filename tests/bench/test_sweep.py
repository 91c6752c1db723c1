"""Encoder sweep: runner, resume, summary table, curves, TensorBoard, Student-t intervals."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from rl_transformers.backbone import Backbone, BackboneConfig
from rl_transformers.bench.sweep import (
    ScriptTrainer,
    SweepConfig,
    build_trainers,
    mean_ci95,
    mean_curve,
    parse_variant,
    run_sweep,
    t_quantile_975,
)

FAKE = str(Path(__file__).with_name("fake_trainer.py"))


def fake_trainer() -> ScriptTrainer:
    return ScriptTrainer(
        name="fake",
        script=FAKE,
        args=(),
        metrics=("eval/mean_reward", "rollout/ep_rew_mean"),
        python=sys.executable,
    )


def calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_sweep_runs_tabulates_and_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "calls.log"
    monkeypatch.setenv("FAKE_TRAINER_LOG", str(log))
    cfg = SweepConfig(
        variants=("full", "attention=local;position=none"), seeds=(1,), out=tmp_path / "sweep", workers=2
    )
    summary = run_sweep(cfg, trainers=[fake_trainer()], log=lambda *_: None)
    assert sorted(calls(log)) == ["full 1 threads=1 omp=1", "local 1 threads=1 omp=1"]
    rows = {r["variant"]: r for r in summary["rows"]}
    # final return = last value of the curve = len(attention) + seed (one seed: no interval)
    assert rows["full"]["final_return_mean"] == 5.0 and rows["full"]["final_return_ci95"] is None
    assert rows["attention=local;position=none"]["final_return_mean"] == 6.0
    assert rows["full"]["metric"] == "rollout/ep_rew_mean"
    expected = sum(
        p.numel() for p in Backbone(BackboneConfig(d_model=16, n_layers=1, n_heads=2)).parameters()
    )
    assert rows["full"]["parameters"] == expected and rows["full"]["parameters_source"] == "backbone"
    result = json.loads((tmp_path / "sweep/fake/full/s1/result.json").read_text())
    assert result["final_step"] == 500 and result["steps_per_s"] > 0 and len(result["curve"]) == 5
    table = (tmp_path / "sweep/summary.md").read_text()
    assert "| fake | full | 1 | 5 (n=1) | rollout/ep_rew_mean |" in table
    assert (tmp_path / "sweep/curves-fake.png").stat().st_size > 0
    assert list((tmp_path / "sweep/tensorboard/fake/full").glob("events.out.tfevents.*"))
    assert list(
        (tmp_path / "sweep/tensorboard/fake/attention=local-position=none").glob("events.out.tfevents.*")
    )

    again = run_sweep(cfg, trainers=[fake_trainer()], log=lambda *_: None)  # resume: nothing left to run
    assert len(calls(log)) == 2
    assert [r["final_return_mean"] for r in again["rows"]] == [5.0, 6.0]


def test_failed_runs_are_reported_and_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "calls.log"
    monkeypatch.setenv("FAKE_TRAINER_LOG", str(log))
    cfg = SweepConfig(variants=("full", "broken"), seeds=(0, 2), out=tmp_path / "sweep", workers=2)
    summary = run_sweep(cfg, trainers=[fake_trainer()], log=lambda *_: None)
    rows = {r["variant"]: r for r in summary["rows"]}
    assert rows["broken"]["n_seeds"] == 0 and rows["broken"]["n_failed"] == 2
    assert rows["broken"]["final_return_mean"] is None
    failure = json.loads((tmp_path / "sweep/fake/broken/s0/failed.json").read_text())
    assert failure["returncode"] == 3 and "diverged" in failure["stderr_tail"]
    # two seeds: mean of 4 and 6, half-width t(0.975, 1) * stdev / sqrt(2) = 12.7062 * 1.41421 / 1.41421
    assert rows["full"]["final_return_mean"] == 5.0
    assert rows["full"]["final_return_ci95"] == pytest.approx(12.7062, abs=1e-4)
    run_sweep(cfg, trainers=[fake_trainer()], log=lambda *_: None)
    assert len(calls(log)) == 6  # the two failed runs ran again, the finished ones did not


def test_t_quantile_and_interval_match_scipy() -> None:
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 5, 29, 30, 31, 45, 100, 1000):
        assert t_quantile_975(df) == pytest.approx(stats.t.ppf(0.975, df), rel=2e-4)
    values = [1.0, 2.5, 2.0, 4.0, 3.5]
    mean, half = mean_ci95(values)
    lo, hi = stats.t.interval(0.95, len(values) - 1, loc=mean, scale=stats.sem(values))
    assert mean == pytest.approx(2.6) and half == pytest.approx((hi - lo) / 2, rel=1e-4)


def test_mean_curve_interpolates_within_each_run() -> None:
    a = [(0.0, 0.0), (10.0, 10.0)]
    b = [(0.0, 2.0), (5.0, 4.0)]
    got = {step: (mean, n) for step, mean, _, n in mean_curve([a, b])}
    assert got[5.0] == (4.5, 2)  # a interpolated at 5 -> 5.0, b -> 4.0
    assert got[10.0] == (10.0, 1)  # b ends at 5: not extrapolated
    assert math.isclose(got[0.0][0], 1.0)


def test_variant_specs_and_commands(tmp_path: Path) -> None:
    v = parse_variant('attention=local;attention_options={"window": 8};memory=None')
    assert v.flags() == ["--backbone.attention", "local", "--backbone.attention-options", '{"window": 8}',
                         "--backbone.memory", "None"]  # fmt: skip
    assert parse_variant("linear").fields == (("attention", "linear"),)
    with pytest.raises(ValueError, match="Did you mean 'position'"):
        parse_variant("full;positon=rope")
    cfg = SweepConfig(algos=("ppo", "dt"), dt_dataset="data/x.hdf5", ppo_total_timesteps=64, dt_total_steps=8)
    ppo, dt = build_trainers(cfg)
    cmd = ppo.command(parse_variant("local"), 3, tmp_path)
    assert cmd[1].endswith("scripts/train_gtrxl.py")
    assert cmd[2:] == ["--env-id", "rlt/TMaze-v0", "--total-timesteps", "64", "--seed", "3", "--run-root",
                       str(tmp_path / "runs"), "--threads", "1", "--no-progress", "--backbone.attention", "local"]  # fmt: skip
    cmd = dt.command(parse_variant("full"), 0, tmp_path)
    assert cmd[1].endswith("scripts/train_dt.py") and "--runs-dir" in cmd and "--total-steps" in cmd
    with pytest.raises(ValueError, match="dt-dataset"):
        SweepConfig(algos=("dt",))
