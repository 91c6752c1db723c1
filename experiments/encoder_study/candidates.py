"""The candidate-default decision: does a candidate default (:data:`~experiments.encoder_study.plan.CANDIDATES`) replace
GTrXL's default? Each candidate is compared on every rung with the setting it would replace, the untuned `gtrxl`,
by P(candidate > GTrXL) of the normalized final score with its 95 % stratified-bootstrap interval (``rliable``;
``study.aggregate.improvement_over``), as the verdict compares encoders with GRU.

**The rule, fixed on 2026-11-27 before RepeatPrevious Medium / Hard and TMaze400 had any run** (and with one
of three seeds of the noisy rung), so the longer rungs' results did not choose it: a candidate *qualifies* when, on every rung that separated and was not stopped, its interval does not
lie wholly below 0.5 (it is nowhere worse than the default), and on at least one such rung it lies wholly above
0.5 (it is somewhere better). If several qualify, the one above on more rungs wins, then the higher mean P.
A qualifying candidate then faces the condition for a default change: the README's PPO results
(T-Maze, CartPoleNoVel) re-run with it; the page says whether the library default follows it (:func:`applied`).
The decision waits until both cells of every such rung have all their seeds and until whether each rung
separated is settled (:func:`~experiments.encoder_study.report.settled_rungs`: all its runs finished, or
cells with all their seeds already separate it, which no further run can undo): until then it is "pending". A
rung that did not separate (every cell at random, at the maximum or memoryless) is left out, as in the verdict:
a tie there says nothing.
"""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np

from experiments.encoder_study import plan as cp
from experiments.encoder_study.verdict import Comparison, cell, side
from rl_transformers.study.aggregate import improvement_over
from rl_transformers.utils.tables import markdown_table

DEFAULT = "gtrxl"
"""The row whose default the candidates would replace (compared untuned)."""


def candidate_comparisons(
    by_cell: dict[tuple[str, str, str], list[dict[str, Any]]], reps: int
) -> dict[str, dict[str, Comparison]]:
    """{rung: {candidate: Comparison against the untuned GTrXL}} for the rungs where both have runs."""
    out: dict[str, dict[str, Comparison]] = {}
    names = [DEFAULT, *(e.name for e in cp.CANDIDATES)]
    for r in cp.RUNGS:
        scores = {
            name: np.array([[r.normalized(float(x["final_return"]))] for x in recs])
            for name in names
            if (recs := by_cell.get((r.name, name, cp.UNTUNED)))
        }
        found = improvement_over(scores, DEFAULT, reps=reps)
        if found:
            out[r.name] = {k: (*p, len(scores[k])) for k, p in found.items()}
    return out


def decision(
    comps: dict[str, dict[str, Comparison]],
    by_cell: dict[tuple[str, str, str], list[dict[str, Any]]],
    unseparated: frozenset[str],
    stopped: frozenset[str],
    settled: frozenset[str],
) -> str:
    """The rule of this module's docstring as one sentence. ``settled``: the rungs whose separation no further
    run can change (:func:`~experiments.encoder_study.report.settled_rungs`)."""
    seeds = len(cp.SEEDS)
    live = [r.name for r in cp.RUNGS if r.name not in stopped]
    waiting = [
        t for t in live
        if any(len(by_cell.get((t, n, cp.UNTUNED), [])) < seeds for n in (DEFAULT, *cp.CANDIDATE_NAMES))
    ]  # fmt: skip
    if waiting:
        return f"**Decision**: pending ({len(waiting)} of {len(live)} rungs still running: {', '.join(waiting)})."
    unsettled = [t for t in live if t not in settled]
    if unsettled:
        return (f"**Decision**: pending (the other rows' runs of {', '.join(unsettled)} decide whether "
                f"{'it' if len(unsettled) == 1 else 'they'} separated).")  # fmt: skip
    rungs = [t for t in live if t not in unseparated]
    qualified: list[tuple[int, float, str]] = []
    for e in cp.CANDIDATES:
        found = [comps[t][e.name] for t in rungs if e.name in comps.get(t, {})]
        sides = [side(c) for c in found]
        if "below" not in sides and "above" in sides:
            qualified.append((sides.count("above"), statistics.fmean(c[0] for c in found), e.name))
    if not qualified:
        return (f"**Decision**: no candidate qualifies on the {len(rungs)} separating rungs: GTrXL's default "
                "stays.")  # fmt: skip
    above, mean_p, name = max(qualified)
    spec = next(e.spec for e in cp.CANDIDATES if e.name == name)
    text = (f"**Decision**: `{name}` qualifies (above the default on {above} of {len(rungs)} separating rungs, "
            f"nowhere below; mean P {mean_p:.2f}): `{spec}`")  # fmt: skip
    return text + (" is GTrXL's default." if applied(spec) else NOT_APPLIED)


NOT_APPLIED = (", not GTrXL's own default (below it on CartPoleNoVel at PPO's defaults: encoder_study.md), the "
               "recipes' default (default_recipe.md).")  # fmt: skip
"""Said while the library default is not the qualifying candidate: the rule changes a default only after the
README's T-Maze and CartPoleNoVel results are re-run with it, and that check (2026-11-28) found ``rope`` far below
``xl_relative`` on CartPoleNoVel at the library's PPO defaults. Under that task's recipe (8 envs, observation and
reward scaling) it solved 10 of 10 seeds, and it became the transformer's default in ppo_recipes.yml."""


def applied(spec: str) -> bool:
    """Whether the library's default policy is the study's base with ``spec`` applied."""
    from rl_transformers.policies.gtrxl import PolicyConfig
    from rl_transformers.study.encoders import policy_config

    return bool(policy_config(spec) == PolicyConfig())


def note(rung: str, unseparated: frozenset[str], stopped: frozenset[str]) -> str:
    return " (stopped)" if rung in stopped else " (did not separate)" if rung in unseparated else ""


def candidate_lines(
    by_cell: dict[tuple[str, str, str], list[dict[str, Any]]],
    reps: int,
    unseparated: frozenset[str] = frozenset(),
    stopped: frozenset[str] = frozenset(),
    settled: frozenset[str] = frozenset(),
) -> list[str]:
    """The page's section: the rule, one row per candidate (a column per rung), the decision."""
    if not cp.CANDIDATES:
        return []
    comps = candidate_comparisons(by_cell, reps)
    lines = [
        "## Candidate defaults against GTrXL's default",
        "",
        "P(candidate > the untuned `gtrxl`) of the normalized final score, [95 % CI], per rung. A "
        "candidate qualifies when, on every rung that separated and was not stopped, it is nowhere below and at "
        "least once **above** (the interval wholly above 0.5); several: the most rungs above, then the higher "
        "mean P. Fixed on 2026-11-27, before the longer rungs ran; method: "
        "`experiments/encoder_study/candidates.py`.",
        "",
        decision(comps, by_cell, unseparated, stopped, settled),
        "",
    ]
    seeds = len(cp.SEEDS)
    headers = ["candidate", *(r.name + note(r.name, unseparated, stopped) for r in cp.RUNGS)]
    rows = [
        [f"`{e.name}` (`{e.spec}`)", *(cell(comps.get(r.name, {}).get(e.name), seeds) for r in cp.RUNGS)]
        for e in cp.CANDIDATES
    ]
    return [*lines, *markdown_table(headers, rows)]
