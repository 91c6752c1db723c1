"""The other two parts of the study's main page, read from their committed documents as data: the
screening stage (its aggregate, :data:`~rl_transformers.study.files.SCREENING_AGGREGATE`) and the
memory probe (``memory_probe.json``, :mod:`~experiments.memory_probe.grid`). Nothing here runs or re-computes:
a missing or malformed file gives a line saying so, never an exception, so the page always rebuilds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rl_transformers.study import files
from rl_transformers.utils.tables import markdown_table

PROBE = "memory_probe.json"
SUCCESS = 0.95
"""The probe's success threshold (accuracy), as in probe.py."""


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def screening_lines(docs: Path) -> list[str]:
    """The screening stage in a few lines: its online IQM leaders and how many encoders fell below GRU."""
    lines = ["## Stage 1: screening (untuned, one small budget)", ""]
    aggs = _read(Path(docs) / files.SCREENING_AGGREGATE)
    online = aggs.get("online") if isinstance(aggs, dict) else None
    if not isinstance(online, dict) or not isinstance(online.get("encoders"), dict):
        return [
            *lines,
            f"Not available: `{files.SCREENING_AGGREGATE}` is missing or not the screening aggregate.",
        ]
    rows = {n: e for n, e in online["encoders"].items() if isinstance(e, dict) and "iqm" in e}
    ranked = sorted(rows, key=lambda n: -rows[n]["iqm"])
    ref = online.get("reference")
    below = [
        n
        for n, e in rows.items()
        if n != ref and e.get("prob_ci_high") is not None and e["prob_ci_high"] < 0.5
    ]
    above = [
        n for n, e in rows.items() if n != ref and e.get("prob_ci_low") is not None and e["prob_ci_low"] > 0.5
    ]
    top = "; ".join(
        f"`{n}` {rows[n]['iqm']:.2f} [{rows[n]['ci_low']:.2f}, {rows[n]['ci_high']:.2f}]" for n in ranked[:3]
    )
    tasks = online.get("tasks") or []
    return [
        *lines,
        f"The screening stage ([{files.SCREENING_PAGE}]({files.SCREENING_PAGE})): {len(rows)} PPO encoders with "
        f"PPO's defaults, no tuning, the learning rate annealed to zero over a 197k-step budget, on "
        f"{len(tasks)} tasks ({', '.join(tasks)}), 3 seeds. Highest IQM [95 % CI]: {top}. Against `{ref}` "
        f"(probability of improvement, CI wholly below / above 0.5): {len(below)} worse, {len(above)} better, "
        f"{len(rows) - 1 - len(below) - len(above)} not separated. It chose the confirmation rows and showed "
        "why a confirmation stage was needed: one untuned recipe decided the ranking.",
    ]  # fmt: skip


def _reach(row: dict[str, Any]) -> tuple[int | None, int | None]:
    """(largest k at which some seed reached SUCCESS, the first k after it that was run), from a probe row."""
    best, failed = None, None
    for k, cell in sorted(((int(k), c) for k, c in (row.get("by_k") or {}).items()), key=lambda kc: kc[0]):
        if not isinstance(cell, dict) or cell.get("status") != "done":
            continue
        if any(u is not None for u in cell.get("updates_to_success") or []):
            best = k
        elif failed is None:
            failed = k
    return best, failed


def probe_lines(docs: Path) -> list[str]:
    """The memory probe in one table: per encoder, the longest recall it learned at each context bound."""
    lines = ["## The memory probe", ""]
    probe = _read(Path(docs) / PROBE)
    if not isinstance(probe, dict) or not isinstance(probe.get("rows"), list):
        return [*lines, f"Not available: `{PROBE}` is missing or not the probe's results."]
    lines += [
        "What each encoder *can* remember, apart from PPO ([memory_probe.md](memory_probe.md)): trained by "
        f"cross-entropy through its policy's own acting and training path to output the symbol seen k steps "
        f"ago, k in {probe.get('ks')}, seeds {probe.get('seeds')}. A cell: the longest k at which a seed reached "
        f"{SUCCESS:.0%} accuracy (– none), then the first k at which none did. `default`: the context knob as "
        "the study runs it; `cover`: raised to k + 1.",
        "",
    ]
    by_encoder: dict[str, dict[str, Any]] = {}
    for row in probe["rows"]:
        if isinstance(row, dict) and isinstance(row.get("encoder"), str):
            by_encoder.setdefault(row["encoder"], {})[str(row.get("bound"))] = row
    rows = []
    for name, bounds in by_encoder.items():
        cells = []
        for bound in ("default", "cover"):
            row = bounds.get(bound)
            if row is None:
                cells.append("– (no reach knob)")
                continue
            same = row.get("repeats")
            if isinstance(same, str):
                cells.append(f"= `{same.split(' [')[0]}` (the same model)")
                continue
            best, failed = _reach(row)
            cells.append(f"{best if best is not None else '–'}" + (f" (fails at {failed})" if failed else ""))
        knob = next((r.get("knob") for r in bounds.values() if r.get("knob")), None) or "–"
        rows.append([f"`{name}`", knob, cells[0], cells[1]])
    return [*lines, *markdown_table(["encoder", "knob", "default bound", "cover bound"], rows)]
