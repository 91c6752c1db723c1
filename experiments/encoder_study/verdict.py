"""The study's verdict: per task family, at which memory length an encoder overtakes GRU, if any.

For each rung of a family with a memory length (``Rung.memory``, in increasing order) and each variant, every
encoder is compared with GRU of the **same variant**: tuned against tuned (the same tuning budget, the fair
comparison) and untuned against untuned (the defaults). The statistic is the probability of improvement
P(X > GRU) of the normalized final score (clipped to [0, 1]) over the seeds of the rung, with its 95 %
stratified-bootstrap interval (``rliable``, Agarwal et al. 2021, arXiv 2108.13264; ``study.aggregate.
improvement_over``). X is **above** GRU at a rung when the interval lies wholly above 0.5, **below** when wholly
below it, and not separated otherwise. With 3 seeds an interval excludes 0.5 only when the two sets of runs
barely overlap, so "not separated" is the common, honest outcome of a close pair.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from experiments.encoder_study import plan as cp
from experiments.encoder_study.plan import ladder_families, memory_rungs
from rl_transformers.study.aggregate import improvement_over
from rl_transformers.utils.tables import markdown_table

Comparison = tuple[float, float, float, int]
"""(P(X > GRU), CI low, CI high, seeds of the pair: the fewer of X's and GRU's)."""


def side(c: Comparison) -> str:
    """The side of 0.5 the interval lies on: "above", "below", or "" when it contains 0.5."""
    return "above" if c[1] > 0.5 else "below" if c[2] < 0.5 else ""


def comparisons(
    by_cell: dict[tuple[str, str, str], list[dict[str, Any]]], reps: int
) -> dict[str, dict[str, dict[str, dict[str, Comparison]]]]:
    """{family: {variant: {task: {encoder: Comparison}}}}; a task appears once GRU of that variant and one
    other encoder have finished runs on it."""
    out: dict[str, dict[str, dict[str, dict[str, Comparison]]]] = {}
    for family in ladder_families():
        out[family] = {}
        for variant in cp.VARIANTS:
            per_task: dict[str, dict[str, Comparison]] = {}
            for r in memory_rungs(family):
                scores = {
                    name: np.array([[r.normalized(float(x["final_return"]))] for x in recs])
                    for (t, name, v), recs in by_cell.items()
                    if t == r.name and v == variant and recs
                }
                found = improvement_over(scores, cp.REFERENCE, reps=reps)
                if found:  # seeds of a comparison: the fewer of the pair's
                    n_ref = len(scores[cp.REFERENCE])
                    per_task[r.name] = {k: (*p, min(len(scores[k]), n_ref)) for k, p in found.items()}
            out[family][variant] = per_task
    return out


def cell(c: Comparison | None, seeds: int) -> str:
    if c is None:
        return "–"
    more = "" if c[3] >= seeds else f" ({c[3]}/{seeds})"
    mark = {"above": " **above**", "below": " below", "": ""}[side(c)]
    return f"{c[0]:.2f} [{c[1]:.2f}, {c[2]:.2f}]{mark}{more}"


def summary(
    family: str,
    variant: str,
    per_task: dict[str, dict[str, Comparison]],
    unseparated: frozenset[str] = frozenset(),
    stopped: frozenset[str] = frozenset(),
) -> str:
    """One sentence: per rung with results, the encoders above GRU (or none), and the rungs still pending; a rung
    in ``unseparated`` (it did not separate: no ranking on it says anything about memory) or in ``stopped`` (not
    run: the ladder's stop rule) is named as such."""
    parts, pending = [], []
    for r in memory_rungs(family):
        if r.name in stopped:
            parts.append(f"memory {r.memory}: stopped (a shorter memory did not separate)")
            continue
        if r.name not in per_task:
            pending.append(f"{r.memory}")
            continue
        if r.name in unseparated:
            parts.append(f"memory {r.memory}: did not separate")
            continue
        above = [f"`{n}`" for n, c in per_task[r.name].items() if side(c) == "above"]
        below = sum(side(c) == "below" for c in per_task[r.name].values())
        fewest = min(c[3] for c in per_task[r.name].values())
        running = f" ({fewest} of {len(cp.SEEDS)} seeds so far, not final)" if fewest < len(cp.SEEDS) else ""
        parts.append(
            f"memory {r.memory}{running}: {', '.join(above) if above else 'none'} above GRU, "
            f"{below} of {len(per_task[r.name])} below"
        )
    label = variant.removeprefix("v2-")
    text = f"**{label.capitalize()}**: " + ("; ".join(parts) if parts else "no rung with results yet")
    return text + (f" (memory {', '.join(pending)}: not run yet)." if pending else ".")


def verdict_lines(
    by_cell: dict[tuple[str, str, str], list[dict[str, Any]]],
    encoders: Sequence[str],
    reps: int,
    unseparated: frozenset[str] = frozenset(),
    stopped: frozenset[str] = frozenset(),
) -> list[str]:
    """The report's verdict section (markdown lines)."""
    seeds = len(cp.SEEDS)
    lines = [
        "## Verdict: at which memory length does an encoder overtake GRU?",
        "",
        "Per rung of each ladder (shortest memory first): P(encoder > GRU) of the normalized final score, "
        "[95 % CI] by `rliable`'s stratified bootstrap over seeds, each variant against GRU of the same "
        "variant (tuned vs tuned is the fair comparison: the same tuning budget). **above**: the interval lies "
        "wholly above 0.5; below: wholly below; otherwise not separated. A rung that did not separate (see the "
        "per-task tables) says nothing about memory: it is marked and left out of the summary lines. Method: "
        "`experiments/encoder_study/verdict.py`.",
    ]
    for family, variants in comparisons(by_cell, reps).items():
        rungs = memory_rungs(family)
        lines += ["", f"### {family}", ""]
        lines += [summary(family, v, variants[v], unseparated, stopped) for v in reversed(cp.VARIANTS)]
        headers = [
            "encoder",
            "variant",
            *(f"memory {r.memory}" + (" (did not separate)" if r.name in unseparated else "") for r in rungs),
        ]
        rows = []
        for name in encoders:
            if name == cp.REFERENCE:
                continue
            for v in reversed(cp.VARIANTS):
                if v == cp.TUNED and name in cp.CANDIDATE_NAMES:
                    continue  # candidate defaults run untuned only
                row = [cell(variants[v].get(r.name, {}).get(name), seeds) for r in rungs]
                rows.append([f"`{name}`", v.removeprefix("v2-"), *row])
        lines += ["", *markdown_table(headers, rows)]
    return lines
