"""Aggregates equal rliable called directly; score matrices keep complete seeds only."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("rliable")
from rliable import library as rly
from rliable import metrics

from rl_transformers.study import aggregate as agg

TASKS = ["a", "b", "c"]
REPS = 300


def records() -> list[dict]:
    rng = np.random.default_rng(0)
    out = []
    for name, shift in (("gru", 0.3), ("full", 0.1), ("mlp", -0.2)):
        for seed in range(3):
            for task in TASKS:
                out.append({"algo": "ppo", "task": task, "encoder_name": name, "seed": seed,
                            "score": float(np.clip(shift + rng.normal(0, 0.3), -1, 1))})  # fmt: skip
    out.append({"algo": "ppo", "task": "a", "encoder_name": "half", "seed": 0, "score": 0.5})
    return out


def test_score_matrices_and_incomplete() -> None:
    scores, incomplete = agg.score_matrices(records(), TASKS)
    assert set(scores) == {"gru", "full", "mlp"} and "half" in incomplete
    rec = {(r["encoder_name"], r["task"], r["seed"]): r["score"] for r in records()}
    assert scores["full"].shape == (3, 3)
    assert scores["full"][2, 1] == rec[("full", "b", 2)]
    partial = [
        r for r in records() if not (r["encoder_name"] == "mlp" and r["seed"] == 1 and r["task"] == "c")
    ]
    scores, _ = agg.score_matrices(partial, TASKS)
    assert scores["mlp"].shape == (2, 3)  # seed 1 is not complete on every task


def test_aggregate_equals_rliable_directly() -> None:
    scores, _ = agg.score_matrices(records(), TASKS)
    out = agg.aggregate(records(), TASKS, reference="gru", reps=REPS)
    np.random.seed(agg.SEED)
    point, ci = rly.get_interval_estimates(scores, lambda x: np.array([metrics.aggregate_iqm(x)]), reps=REPS)
    pairs = {"full": (scores["full"], scores["gru"]), "mlp": (scores["mlp"], scores["gru"])}
    np.random.seed(agg.SEED)
    ppoint, pci = rly.get_interval_estimates(pairs, metrics.probability_of_improvement, reps=REPS)
    for name in ("gru", "full", "mlp"):
        row = out["encoders"][name]
        assert row["iqm"] == pytest.approx(point[name][0])
        assert (row["ci_low"], row["ci_high"]) == pytest.approx((ci[name][0][0], ci[name][1][0]))
        assert row["n_seeds"] == 3 and row["n_tasks"] == 3
    for name in ("full", "mlp"):
        row = out["encoders"][name]
        assert row["prob_improvement"] == pytest.approx(float(np.squeeze(ppoint[name])))
        assert row["prob_ci_low"] == pytest.approx(float(np.squeeze(pci[name][0])))
    assert out["encoders"]["gru"]["prob_improvement"] is None
    # the IQM itself is scipy's 25 %-trimmed mean of all runs x tasks
    stats = pytest.importorskip("scipy.stats")
    assert out["encoders"]["full"]["iqm"] == pytest.approx(stats.trim_mean(scores["full"].ravel(), 0.25))


def test_scale_divides_scores() -> None:
    recs = [{**r, "score": r["score"] * 100} for r in records()]
    a = agg.aggregate(recs, TASKS, "gru", scale=100.0, reps=50)["encoders"]["full"]["iqm"]
    b = agg.aggregate(records(), TASKS, "gru", reps=50)["encoders"]["full"]["iqm"]
    assert a == pytest.approx(b)
