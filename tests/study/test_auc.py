"""The normalized area under the evaluation curve (sample efficiency): closed forms on hand-made curves, the step-0 and
budget conventions, clipping, errors, and the aggregate over a record key other than the final score."""

from __future__ import annotations

import numpy as np
import pytest

from rl_transformers.study import aggregate as agg
from rl_transformers.study.aggregate import normalized_auc

LOW, HIGH = -1.0, 1.0  # POPGym's MMER scale


@pytest.mark.parametrize("n", [1, 4, 12])
def test_linear_ramp_is_one_half(n: int) -> None:
    budget = 196_608
    curve = [(budget * k / n, LOW + (HIGH - LOW) * k / n) for k in range(1, n + 1)]
    assert normalized_auc(curve, budget, LOW, HIGH) == pytest.approx(0.5, rel=1e-12)


def test_step_function_has_its_exact_area() -> None:
    """Random until step t, maximum from t on (two points at t): area (B - t) / B."""
    budget, t = 100.0, 37.0
    curve = [(t, LOW), (t, HIGH), (budget, HIGH)]
    assert normalized_auc(curve, budget, LOW, HIGH) == pytest.approx((budget - t) / budget, rel=1e-12)
    assert normalized_auc([(0, HIGH)], budget, LOW, HIGH) == 1.0  # the maximum from step 0, held to B
    assert normalized_auc([(budget, LOW)], budget, LOW, HIGH) == 0.0


def test_evaluations_between_steps_use_the_trapezoid() -> None:
    """Evaluations every 3 of 12 steps: -1, -1, 1, 1 -> 0 on [0, 6], a ramp on [6, 9], 1 on [9, 12]."""
    curve = [(3, -1.0), (6, -1.0), (9, 1.0), (12, 1.0)]
    assert normalized_auc(curve, 12, LOW, HIGH) == pytest.approx((1.5 + 3.0) / 12, rel=1e-12)


def test_matches_numpy_on_random_curves() -> None:
    """Against np.interp + the trapezoid rule on a fine grid that contains every knot (piecewise linear: exact)."""
    rng = np.random.default_rng(7)
    for _ in range(20):
        budget = 1000.0
        steps = np.sort(rng.choice(np.arange(1, 1001), size=rng.integers(1, 8), replace=False)).astype(float)
        values = rng.uniform(-1.5, 1.5, size=steps.size)  # some outside [low, high]: clipped
        knots_s = np.concatenate([[0.0], steps, [budget]])
        knots_v = np.concatenate([[LOW], values, [values[-1]]])
        norm = np.clip((knots_v - LOW) / (HIGH - LOW), 0, 1)
        # where nothing is clipped, also the integral of the interpolant itself on a fine grid
        grid = np.union1d(np.linspace(0, budget, 200_001), knots_s)
        dense = np.clip((np.interp(grid, knots_s, knots_v) - LOW) / (HIGH - LOW), 0, 1)
        reference_clipped = np.trapezoid(dense, grid) / budget
        reference_knots = (
            np.trapezoid(norm, knots_s) / budget
        )  # the documented formula: normalize, then trapezoid
        got = normalized_auc(list(zip(steps, values, strict=True)), budget, LOW, HIGH)
        assert got == pytest.approx(reference_knots, rel=1e-12, abs=1e-15)
        if np.all((values >= LOW) & (values <= HIGH)):
            assert got == pytest.approx(reference_clipped, abs=1e-6)
        assert 0.0 <= got <= 1.0


def test_step_zero_conventions() -> None:
    budget = 10.0
    # default: (0, low) first; start overrides it; a point at step 0 is used as given
    assert normalized_auc([(10, HIGH)], budget, LOW, HIGH) == pytest.approx(0.5)
    assert normalized_auc([(10, HIGH)], budget, LOW, HIGH, start=0.0) == pytest.approx(0.75)
    assert normalized_auc([(0, HIGH), (10, HIGH)], budget, LOW, HIGH) == pytest.approx(1.0)
    # the last evaluation is held to the budget: maximum at 5 of 10 -> ramp 2.5 + held 5
    assert normalized_auc([(5, HIGH)], budget, LOW, HIGH) == pytest.approx(0.75)
    # unsorted input is sorted by step
    assert normalized_auc([(10, HIGH), (5, LOW)], budget, LOW, HIGH) == pytest.approx(0.25)


@pytest.mark.parametrize(
    "curve,budget,low,high,match",
    [
        ([(11, 0.0)], 10, LOW, HIGH, "outside steps"),
        ([(-1, 0.0)], 10, LOW, HIGH, "outside steps"),
        ([(5, float("nan"))], 10, LOW, HIGH, "not finite"),
        ([(5, 0.0)], 0, LOW, HIGH, "budget must be"),
        ([(5, 0.0)], 10, 1.0, 1.0, "high > low"),
    ],
    ids=["beyond-budget", "negative-step", "nan", "zero-budget", "empty-range"],
)
def test_bad_inputs_are_refused(curve: list, budget: float, low: float, high: float, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        normalized_auc(curve, budget, low, high)


def test_aggregate_over_the_auc_key() -> None:
    """Records carrying an ``auc`` next to their score aggregate on it exactly as if it were the score."""
    pytest.importorskip("rliable")
    rng = np.random.default_rng(1)
    records = []
    for name in ("gru", "full"):
        for seed in range(3):
            for task in ("a", "b"):
                curve = [(s, float(rng.uniform(-1, 1))) for s in (4, 8, 12)]
                auc = normalized_auc(curve, 12, LOW, HIGH)
                records.append({"task": task, "encoder_name": name, "seed": seed, "score": 0.0, "auc": auc})
    scores, _ = agg.score_matrices(records, ["a", "b"], key="auc")
    assert scores["full"][2, 1] == next(
        r["auc"] for r in records if (r["encoder_name"], r["seed"], r["task"]) == ("full", 2, "b")
    )
    as_score = [{**r, "score": r["auc"]} for r in records]
    assert agg.aggregate(records, ["a", "b"], "gru", reps=200, key="auc") == agg.aggregate(
        as_score, ["a", "b"], "gru", reps=200
    )
    assert agg.aggregate(records, ["a", "b"], "gru", reps=200)["encoders"]["full"]["iqm"] == 0.0
