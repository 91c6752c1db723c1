"""The results page of a side-by-side comparison (``scripts/compare_peer.py``), generated from its records.

Per arm: every seed's final greedy mean return, the seeds at or above the task's solved threshold, the
interquartile mean with a 95 % stratified-bootstrap interval (``rliable``, Agarwal et al. 2021, arXiv
2108.13264; one task, so the strata are the seeds), the parameter count and env steps per CPU-second. Each
other arm is compared with a reference arm by an exact two-sided permutation test of the difference in means
(every split of the pooled seeds; Holm's correction over the comparisons made), so "X differs from Y" is read
off a test that can tell, not off overlapping means. The page and the README block are pure functions of the
records: a clone at any path rebuilds them byte for byte.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass
from math import comb
from pathlib import Path
from typing import Any

import numpy as np

from rl_transformers.study.aggregate import iqm_intervals
from rl_transformers.utils.tables import markdown_table


@dataclass(frozen=True)
class ArmSummary:
    arm: str
    seeds: list[int]
    means: list[float]
    parameters: int | None
    steps_per_cpu_s: float
    iqm: tuple[float, float, float]
    commits: list[str]


PROVENANCE = "provenance.json"
"""Per-arm file with ``git_sha`` / ``machine`` / ``command`` for records written before records carried them
(written by hand from the worktree each batch ran in; a record's own fields win)."""


def load_records(records: Path) -> dict[str, list[dict[str, Any]]]:
    """{arm: its records sorted by seed} of ``records/<arm>/s<seed>.json`` (``<arm>/provenance.json`` fills
    what a record lacks)."""
    arms: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(records.glob("*/s*.json")):
        extra = path.parent / PROVENANCE
        base = json.loads(extra.read_text(encoding="utf-8")) if extra.exists() else {}
        record = base | json.loads(path.read_text(encoding="utf-8"))
        arms.setdefault(path.parent.name, []).append(record)
    return {arm: sorted(rs, key=lambda r: int(r["seed"])) for arm, rs in sorted(arms.items())}


def exact_permutation_p(a: list[float], b: list[float]) -> float:
    """Two-sided p of the difference in means over every split of the pooled values into groups of
    len(a) and len(b) (the observed split included); ties count as at least as extreme.

    Equal values are interchangeable, so the splits are counted by how many of each distinct value go to ``a``
    (a product of binomial coefficients) rather than enumerated one by one: exact, and fast when seeds tie
    (many runs at a task's maximum), where C(40, 20) splits could not be listed."""
    n, m = len(a), len(b)
    total, observed = float(np.sum([*a, *b])), abs(float(np.mean(a)) - float(np.mean(b)))
    states: dict[tuple[int, float], int] = {(0, 0.0): 1}  # (values taken into a, their sum) -> splits
    for value, count in Counter(float(x) for x in [*a, *b]).items():
        grown: dict[tuple[int, float], int] = defaultdict(int)
        for (k, s), ways in states.items():
            for take in range(min(count, n - k) + 1):
                grown[(k + take, round(s + take * value, 9))] += ways * comb(count, take)
        states = grown
    # the sums are rounded to 1e-9 at each of the n + m steps: a split as extreme as the observed one may read
    # up to about (n + m) * 1e-9 below it (returns with many decimals, as POPGym's, showed it)
    tolerance = 1e-9 * (n + m) + 1e-12 * abs(total)
    extreme = sum(
        ways
        for (k, s), ways in states.items()
        if k == n and abs(s / n - (total - s) / m) >= observed - tolerance
    )
    return extreme / comb(n + m, n)


def holm(pvalues: dict[str, float]) -> dict[str, float]:
    """Holm-Bonferroni adjusted p-values (monotone, capped at 1)."""
    order = sorted(pvalues, key=lambda k: pvalues[k])
    m, running, out = len(order), 0.0, {}
    for i, key in enumerate(order):
        running = max(running, min(1.0, (m - i) * pvalues[key]))
        out[key] = running
    return out


def summarise(arms: dict[str, list[dict[str, Any]]]) -> dict[str, ArmSummary]:
    scores = {arm: np.array([[float(np.mean(r["returns"]))] for r in rs]) for arm, rs in arms.items()}
    intervals = iqm_intervals(scores)
    out = {}
    for arm, rs in arms.items():
        # a resumed run's CPU seconds cover its last stretch, ``cpu_steps`` env steps
        rate = float(
            np.mean([r.get("cpu_steps", r["total_timesteps"]) / max(r["cpu_seconds"], 1e-9) for r in rs])
        )
        out[arm] = ArmSummary(
            arm,
            [int(r["seed"]) for r in rs],
            [float(np.mean(r["returns"])) for r in rs],
            rs[0].get("parameters"),
            rate,
            intervals[arm],
            sorted({str(r.get("git_sha", "?"))[:7] for r in rs}),
        )
    return out


def return_digits(summaries: dict[str, ArmSummary]) -> int:
    """Decimals that show the returns: 0 where some seed's mean reaches 10 in size (CartPole's 0-500), else 2
    (POPGym's and T-Maze's scores in [-1, 1], which whole numbers would round to -0 / 1)."""
    means = [abs(m) for s in summaries.values() for m in s.means]
    return 0 if means and max(means) >= 10 else 2


def table(
    summaries: dict[str, ArmSummary],
    solved: float,
    reference: str | None,
    compact: bool = False,
    digits: int | None = None,
) -> list[str]:
    """Markdown rows: one per arm, plus the permutation test against ``reference`` where it has records;
    ``compact`` (the README's copy) leaves out parameters, the per-seed values, speed and code. Returns have
    ``digits`` decimals (the IQM and its interval one more), by default :func:`return_digits`'s."""
    digits = return_digits(summaries) if digits is None else digits
    tests = {}
    if reference in summaries:
        ref = summaries[reference].means
        raw = {a: exact_permutation_p(s.means, ref) for a, s in summaries.items() if a != reference}
        tests = holm(raw)
    cols = ["arm"] + (["seeds"] if compact else ["parameters", "seeds", "final greedy return per seed"])
    cols += [f"solved (≥ {solved:g})", "IQM [95 % CI]"] + ([f"vs {reference}: Holm p"] if tests else [])
    cols += [] if compact else ["env steps / CPU-s", "code"]
    rows = []
    for arm, s in summaries.items():
        cells = [arm] + ([] if compact else [str(s.parameters if s.parameters is not None else "?")])
        cells += [str(len(s.seeds))] + ([] if compact else [" / ".join(f"{m:.{digits}f}" for m in s.means)])
        cells += [f"{sum(m >= solved for m in s.means)} of {len(s.means)}"]
        cells += ["{0:.{3}f} [{1:.{3}f}, {2:.{3}f}]".format(*s.iqm, digits + 1)]
        cells += [f"{tests[arm]:.3g}" if arm in tests else "–"] if tests else []
        cells += [] if compact else [f"{s.steps_per_cpu_s:.0f}", ", ".join(s.commits)]
        rows.append(cells)
    return markdown_table(cols, rows)


def render(
    records: Path, solved: float, reference: str | None, preamble: str, digits: int | None = None
) -> str:
    """The page: ``preamble`` (the experiment's own text: task, command, machine) and the table."""
    summaries = summarise(load_records(records))
    return preamble.rstrip() + "\n\n" + "\n".join(table(summaries, solved, reference, digits=digits)) + "\n"


def replace_block(text: str, name: str, block: str) -> str:
    """``text`` with the lines between ``<!-- name:start -->`` and ``<!-- name:end -->`` set to ``block``."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    if start not in text or end not in text:
        raise ValueError(f"no {start} ... {end} block")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{block.rstrip()}\n{end}{tail}"
