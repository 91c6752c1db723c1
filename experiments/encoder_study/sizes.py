"""The encoder study page's parameter section: every row's parameter count, per variant, against the reference.

Parameter matching (:mod:`rl_transformers.policies.sizing`) sizes every untuned row to the untuned GTrXL within
:data:`~rl_transformers.policies.sizing.TOLERANCE`; tuning can change a capacity knob (the RNNs' hidden size),
and the study's tuning searched it over half to twice its value (``plan.TUNING_SPACE``), so a tuned row may leave
the tolerance. The section reads the counts from the records themselves (each run records its ``parameters``) and
names every encoder row whose count on some task lies outside the tolerance of the reference on that task: the
comparisons of such a row are not on equal terms, and the page and the README say so.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from experiments.encoder_study import plan as cp
from rl_transformers.policies.sizing import TOLERANCE
from rl_transformers.study.encoders import Encoder
from rl_transformers.utils.tables import markdown_table

SIZE_REFERENCE = "gtrxl"
"""The row every other is sized to (untuned)."""
UNEQUAL = "**Unequal sizes**"
"""The label of the line naming the rows outside the tolerance (the README headline copies it)."""


def ratios(found: Sequence[dict[str, Any]]) -> dict[tuple[str, str], list[float]]:
    """(encoder, preset) -> each record's parameter count over the untuned reference's median on its task."""
    ref: dict[str, list[int]] = defaultdict(list)
    for r in found:
        if r["encoder_name"] == SIZE_REFERENCE and r["preset"] == cp.UNTUNED and r.get("parameters"):
            ref[r["task"]].append(r["parameters"])
    out: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in found:
        if r.get("parameters") and ref.get(r["task"]):
            out[(r["encoder_name"], r["preset"])].append(r["parameters"] / statistics.median(ref[r["task"]]))
    return out


def _counts(found: Sequence[dict[str, Any]], name: str, preset: str) -> str:
    values = sorted({r["parameters"] for r in found if r["encoder_name"] == name and r["preset"] == preset
                     and r.get("parameters")})  # fmt: skip
    if not values:
        return "–"
    return f"{values[0]:,}" if len(values) == 1 else f"{values[0]:,}–{values[-1]:,}"


def _ratio(values: list[float]) -> str:
    if not values:
        return "–"
    low, high = min(values), max(values)
    return f"{low:.2f}" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}–{high:.2f}"


def unequal_rows(found: Sequence[dict[str, Any]], table: Sequence[Encoder]) -> list[str]:
    """``name (variant, x ratio)`` of every encoder row (candidates excluded: settings, never matched) with a
    record outside the tolerance of the reference on its task."""
    by_row = ratios(found)
    out = []
    for e in table:
        for preset in (cp.UNTUNED, cp.TUNED):
            values = by_row.get((e.name, preset), [])
            if values and not all(abs(v - 1) <= TOLERANCE for v in values):
                out.append(f"`{e.name}` ({'tuned' if preset == cp.TUNED else 'untuned'}, {_ratio(values)}×)")
    return out


def parameter_lines(found: Sequence[dict[str, Any]], table: Sequence[Encoder],
                    candidates: Sequence[Encoder] = ()) -> list[str]:  # fmt: skip
    """The page's "Parameters" section: counts and ratios per row and variant, and the :data:`UNEQUAL` line."""
    by_row = ratios(found)
    rows = []
    for e in [*table, *candidates]:
        rows.append([f"`{e.name}`", _counts(found, e.name, cp.UNTUNED), _ratio(by_row.get((e.name, cp.UNTUNED), [])),
                     _counts(found, e.name, cp.TUNED), _ratio(by_row.get((e.name, cp.TUNED), []))])  # fmt: skip
    lines = [
        "## Parameters",
        "",
        f"Each row's parameter count over the study's tasks (from the records), and its ratio to the untuned "
        f"`{SIZE_REFERENCE}` on the same task. Untuned rows are sized to `{SIZE_REFERENCE}` within {TOLERANCE:.0%}; the "
        "tuning searched a capacity knob (the RNNs' hidden size) over half to twice its value, so a tuned row may "
        "leave that tolerance. Candidate defaults are settings, never sized.",
        "",
        *markdown_table(["row", "untuned", "ratio", "tuned", "ratio"], rows),
    ]
    unequal = unequal_rows(found, table)
    if unequal:
        against = [u for u in unequal if u.startswith(f"`{cp.REFERENCE}` (tuned")]
        why = (f" Every tuned comparison of the verdict is against the tuned `{cp.REFERENCE}`, one of them: read the "
               "tuned lines with that in mind." if against else "")  # fmt: skip
        lines += ["", f"{UNEQUAL}: {', '.join(unequal)} lie outside {TOLERANCE:.0%} of `{SIZE_REFERENCE}`'s parameters, "
                  f"so their comparisons are not on equal terms.{why} Tuning now keeps a width within the "
                  "tolerance by default (`scripts/tune.py --space.param-tolerance`); this study's tuning predates "
                  "that."]  # fmt: skip
    return lines


__all__ = ["SIZE_REFERENCE", "UNEQUAL", "parameter_lines", "ratios", "unequal_rows"]
