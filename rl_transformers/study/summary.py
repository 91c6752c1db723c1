"""The study's findings in words, generated from the same aggregates and records as the tables.

A hand-written conclusion goes stale the moment a run is added or re-run; this one is rebuilt with the report, so
it states only what the numbers below it show:

- :func:`aggregate_summary`: the encoder with the highest IQM, the encoders whose 95 % CI overlaps its CI (not
  separable from it at this number of runs), and which encoders beat or trail the reference (GRU online, `full`
  offline) by rliable's probability of improvement with the whole 95 % CI on one side of 0.5;
- :func:`task_leaders`: per task, the encoders with the highest mean score (ties at the table's two decimals);
- :func:`identical_runs`: encoders whose evaluation curves coincide bit for bit on every task and seed, so that
  rows that probably compute one policy are not read as separate findings. Coarse or saturated scores can make
  different policies coincide on few tasks, so this is a sign to check, not a proof.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

MAX_NAMES = 6  # longer lists are cut to this many names and "+ n more"


def _names(names: Sequence[str]) -> str:
    shown = [f"`{n}`" for n in names[:MAX_NAMES]]
    more = len(names) - len(shown)
    return ", ".join(shown) + (f" + {more} more" if more > 0 else "") if shown else "none"


def aggregate_summary(agg: dict[str, Any]) -> str:
    """One paragraph on an aggregate of :func:`~rl_transformers.study.aggregate.aggregate` (IQM, CIs, P(improvement)).

    "Beats the reference" needs the probability of improvement's 95 % CI entirely above 0.5, "trails" entirely
    below; everything else is not separated from the reference at this number of runs.
    """
    rows = agg["encoders"]
    if not rows:
        return "No encoder has a complete set of runs yet."
    ref = agg["reference"]
    ranked = sorted(rows, key=lambda n: (-rows[n]["iqm"], n))
    best = ranked[0]
    b = rows[best]
    overlap = [
        n for n in ranked[1:] if rows[n]["ci_high"] >= b["ci_low"] and rows[n]["ci_low"] <= b["ci_high"]
    ]
    others = [n for n in ranked if n != ref and rows[n]["prob_ci_low"] is not None]
    beats = [n for n in others if rows[n]["prob_ci_low"] > 0.5]
    trails = [n for n in others if rows[n]["prob_ci_high"] < 0.5]
    level = [n for n in others if n not in beats and n not in trails]
    text = (f"Highest IQM: `{best}` {b['iqm']:.3f} [{b['ci_low']:.3f}, {b['ci_high']:.3f}] of {len(rows)} "
            f"encoders. CI overlapping it ({len(overlap)}): {_names(overlap)}.")  # fmt: skip
    if ref in rows:
        text += (f" Against `{ref}` (probability of improvement, 95 % CI wholly above / below 0.5): better "
                 f"{len(beats)} ({_names(beats)}); worse {len(trails)}; not separated {len(level)} "
                 f"({_names(level)}).")  # fmt: skip
    return text


def task_leaders(records: Sequence[dict[str, Any]], algo: str, tasks: Sequence[str], digits: int = 2) -> str:
    """Per task: the encoders with the highest mean score over their seeds (equal at ``digits`` decimals)."""
    parts = []
    for task in tasks:
        by: dict[str, list[float]] = defaultdict(list)
        for r in records:
            if r["algo"] == algo and r["task"] == task and r["score"] is not None:
                by[r["encoder_name"]].append(float(r["score"]))
        if not by:
            continue
        means = {n: round(statistics.fmean(v), digits) for n, v in by.items()}
        top = max(means.values())
        leaders = sorted(n for n, m in means.items() if m == top)
        parts.append(f"{task} {top:.{digits}f} ({_names(leaders)})")
    return "Highest mean score per task: " + "; ".join(parts) + "." if parts else ""


def _run_signature(r: dict[str, Any]) -> tuple[Any, ...]:
    return (r["score"], r.get("final_return"), tuple(tuple(p) for p in r["curve"]))


def identical_runs(records: Sequence[dict[str, Any]], algo: str, tasks: Sequence[str]) -> str:
    """Groups of encoders whose runs of ``algo`` on ``tasks`` coincide: the same (task, seed) runs, and on each
    of them the same score, final return and evaluation curve (every evaluation, bit for bit). Records without
    a curve are left out."""
    runs: dict[str, dict[tuple[str, int], tuple[Any, ...]]] = defaultdict(dict)
    for r in records:
        if r["algo"] == algo and r["task"] in tasks and r["score"] is not None and r.get("curve"):
            runs[r["encoder_name"]][(r["task"], r["seed"])] = _run_signature(r)
    groups: dict[tuple[Any, ...], list[str]] = defaultdict(list)
    for name in sorted(runs):
        groups[tuple(sorted(runs[name].items()))].append(name)
    same = [g for g in groups.values() if len(g) > 1]
    if not same:
        return ""
    parts = [" = ".join(f"`{n}`" for n in g) + f" ({len(runs[g[0]])} runs)" for g in same]
    return (
        "Equal runs (the same evaluation curve, bit for bit, on every task and seed: probably one policy, see "
        "the notes): " + "; ".join(parts) + "."
    )
