"""Aggregate statistics across tasks with ``rliable`` (Agarwal et al. 2021, arXiv 2108.13264).

Scores are arranged per encoder as a (runs, tasks) matrix: run i of every task is seed i (the seeds that
every task of the suite has finished for that encoder; encoders missing a task are left out of the
aggregate and listed as incomplete). ``rliable`` computes everything: the interquartile mean
(``metrics.aggregate_iqm``) with stratified bootstrap 95 % CIs (``library.get_interval_estimates``, percentile
method), performance profiles (``library.create_performance_profile``) and the probability of improvement of
each encoder over the reference (GRU online; the DT's default ``full`` attention offline) with its CI
(``metrics.probability_of_improvement``). Nothing is re-implemented here. Bootstraps are seeded through
NumPy's global RNG (``np.random.seed``): with arch 7.2 rliable's ``random_state`` argument does not make
them reproducible. Offline normalized scores are
divided by 100 first, so both suites are on comparable scales (1 = the target).
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

REPS = 2000
"""Bootstrap replications (rliable's default for profiles; 50,000 for intervals is too slow for 27 rows)."""
SEED = 0
REFERENCE = {"ppo": "gru", "dt": "full"}
"""The encoder each suite's probability of improvement is measured against."""
SCALE = {"ppo": 1.0, "dt": 100.0}
"""Scores are divided by this before aggregating (DT normalized scores: 1 = the target)."""


def normalized_auc(
    curve: Sequence[Sequence[float]], budget: float, low: float, high: float, start: float | None = None
) -> float:
    """Normalized area under an evaluation curve (sample efficiency), in [0, 1].

    ``curve`` holds (env step, score) points with steps in [0, budget]. Each score is normalized by the task's
    random score ``low`` and maximum ``high`` and clipped, ``n(v) = min(1, max(0, (v - low) / (high - low)))``.
    Conventions: unless the curve has a point at step 0, the point ``(0, start)`` is put first, with ``start =
    low`` by default (the untrained policy is taken to score the random score); the last score is held to the
    budget B. With the points (s_0 = 0, n_0), ..., (s_m = B, n_m) in step order, the trapezoid rule gives

        AUC = (1 / B) * sum_{i < m} (s_{i+1} - s_i) * (n_i + n_{i+1}) / 2

    so 1 = the maximum score from step 0 on, 0 = never above the random score, and a linear ramp from random to
    the maximum over the budget is 1/2. Two points at the same step (kept in the given order) make a vertical
    jump: a step function's exact area.
    """
    if not (math.isfinite(budget) and budget > 0):
        raise ValueError(f"budget must be a finite number > 0, got {budget!r}")
    if not (math.isfinite(low) and math.isfinite(high) and high > low):
        raise ValueError(f"need finite scores with high > low, got low={low!r}, high={high!r}")
    points = sorted(((float(s), float(v)) for s, v in curve), key=lambda p: p[0])
    bad = [p for p in points if not (0 <= p[0] <= budget and math.isfinite(p[1]))]
    if bad:
        raise ValueError(f"curve point {bad[0]} is outside steps [0, {budget}] or not finite")
    if not points or points[0][0] > 0:
        points.insert(0, (0.0, low if start is None else float(start)))
    if points[-1][0] < budget:
        points.append((float(budget), points[-1][1]))
    norm = [(s, min(1.0, max(0.0, (v - low) / (high - low)))) for s, v in points]
    area = sum((s1 - s0) * (n0 + n1) / 2 for (s0, n0), (s1, n1) in itertools.pairwise(norm))
    return area / budget


def score_matrices(
    records: Sequence[dict[str, Any]], tasks: Sequence[str], scale: float = 1.0, key: str = "score"
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """{encoder name: (n_seeds, n_tasks)} of each record's ``key`` (the final score, or e.g. a normalized AUC
    added by the caller) over the seeds complete on every task; {name: why left out}."""
    by: dict[str, dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for r in records:
        if r.get(key) is not None and r["task"] in tasks:
            by[r["encoder_name"]][r["task"]][int(r["seed"])] = float(r[key]) / scale
    out, incomplete = {}, {}
    for name, per_task in by.items():
        missing = [t for t in tasks if t not in per_task]
        if missing:
            incomplete[name] = f"no finished run on {missing}"
            continue
        seeds = sorted(set.intersection(*(set(per_task[t]) for t in tasks)))
        if not seeds:
            incomplete[name] = "no seed finished on every task"
            continue
        out[name] = np.array([[per_task[t][s] for t in tasks] for s in seeds], dtype=np.float64)
    return out, incomplete


def iqm_intervals(scores: dict[str, np.ndarray], reps: int = REPS, seed: int = SEED) -> dict[str, tuple]:
    """{name: (IQM, CI low, CI high)} via rliable's stratified bootstrap."""
    from rliable import library as rly
    from rliable import metrics

    if not scores:
        return {}
    np.random.seed(seed)  # rliable 1.2 + arch 7.2 ignore random_state reproducibly; the global RNG works
    point, ci = rly.get_interval_estimates(
        scores,
        lambda x: np.array([metrics.aggregate_iqm(x)]),
        reps=reps,
    )
    return {k: (float(point[k][0]), float(ci[k][0][0]), float(ci[k][1][0])) for k in scores}


def improvement_over(
    scores: dict[str, np.ndarray], reference: str, reps: int = REPS, seed: int = SEED
) -> dict[str, tuple]:
    """{name: (P(name > reference), CI low, CI high)} via rliable; empty without the reference."""
    from rliable import library as rly
    from rliable import metrics

    if reference not in scores:
        return {}
    pairs = {k: (v, scores[reference]) for k, v in scores.items() if k != reference}
    if not pairs:
        return {}
    np.random.seed(seed)
    point, ci = rly.get_interval_estimates(pairs, metrics.probability_of_improvement, reps=reps)
    return {
        k: (float(np.squeeze(point[k])), float(np.squeeze(ci[k][0])), float(np.squeeze(ci[k][1])))
        for k in pairs
    }


def performance_profiles(
    scores: dict[str, np.ndarray], taus: np.ndarray, reps: int = REPS, seed: int = SEED
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """rliable's score-distribution profiles (fraction of runs with score > tau) with bootstrap CIs."""
    from rliable import library as rly

    np.random.seed(seed)  # create_performance_profile takes no random_state
    return rly.create_performance_profile(scores, taus, reps=reps)


def aggregate(
    records: Sequence[dict[str, Any]],
    tasks: Sequence[str],
    reference: str,
    scale: float = 1.0,
    reps: int = REPS,
    key: str = "score",
) -> dict[str, Any]:
    """Per encoder: IQM, CI, probability of improvement over ``reference``, seeds; plus the incomplete ones
    (of the records' ``key``: see :func:`score_matrices`)."""
    scores, incomplete = score_matrices(records, tasks, scale, key)
    iqm = iqm_intervals(scores, reps)
    prob = improvement_over(scores, reference, reps)
    rows = {}
    for name, matrix in scores.items():
        low_high = prob.get(name)
        rows[name] = {
            "iqm": iqm[name][0],
            "ci_low": iqm[name][1],
            "ci_high": iqm[name][2],
            "prob_improvement": None if low_high is None else low_high[0],
            "prob_ci_low": None if low_high is None else low_high[1],
            "prob_ci_high": None if low_high is None else low_high[2],
            "n_seeds": int(matrix.shape[0]),
            "n_tasks": int(matrix.shape[1]),
        }
    return {"reference": reference, "tasks": list(tasks), "scale": scale, "encoders": rows,
            "incomplete": incomplete}  # fmt: skip
