"""The memory probe's documents: ``memory_probe.json`` (every row and cell), ``memory_probe.md`` (tables) and
``plots/memory_probe.png`` (accuracy vs k, one line per encoder, one panel per context bound).

Built only from the per-cell result files (:mod:`experiments.memory_probe.grid`), so a rebuild of a
finished or partial grid always says the same thing. A table cell is the mean accuracy over seeds after the
fixed number of updates, with the median updates to the success accuracy over the seeds that reached it
(and how many did); "stopped" marks the k a row did not run because it failed at a smaller k.
"""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path
from typing import Any

from experiments.memory_probe.grid import (
    CURVE_STRIDE,
    ProbeConfig,
    Row,
    cells_of,
    finished_results,
    load_cell,
    repeat_of,
    succeeded,
)
from rl_transformers.utils.atomic import atomic_write_json, atomic_write_text
from rl_transformers.utils.tables import markdown_table


def row_summary(cfg: ProbeConfig, row: Row, rows: list[Row] | None = None) -> dict[str, Any]:
    """Per k: status (done / partial / pending / stopped), knob value, accuracies, updates to success, rate.
    Where the row repeats an earlier one of ``rows`` at k (:func:`~experiments.memory_probe.grid.repeat_of`)
    the entry holds that row's cells and names it (``repeat_of``); ``repeats``: the row it repeats at every k
    it ran, if one."""
    by_k: dict[str, Any] = {}
    stopped_at: int | None = None
    sources: list[str | None] = []
    for k in cfg.ks:
        cells = cells_of(row, k, cfg.seeds)
        entry: dict[str, Any] = {"knob_value": cells[0].value}
        if stopped_at is not None:
            by_k[str(k)] = {**entry, "status": "stopped"}
            continue
        same = repeat_of(cfg, row, rows, k) if rows else None
        if same is not None:
            entry["repeat_of"] = same.name
        results = finished_results(cfg, same or row, k)
        if not results:
            by_k[str(k)] = {**entry, "status": "pending"}
            continue
        sources.append(same.name if same is not None else None)
        reached = [r["updates_to_success"] for r in results if r["updates_to_success"] is not None]
        by_k[str(k)] = {
            **entry,
            "status": "done" if len(results) == len(cells) else "partial",
            "seeds": [r["seed"] for r in results],
            "accuracy": [r["accuracy"] for r in results],
            "accuracy_mean": statistics.fmean(r["accuracy"] for r in results),
            "updates_to_success": [r["updates_to_success"] for r in results],
            "median_updates_to_success": statistics.median(reached) if reached else None,
            "updates_per_s": statistics.fmean(r["updates_per_s"] for r in results),
        }
        if len(results) == len(cells) and not succeeded(results):
            stopped_at = k
    return {
        "encoder": row.encoder.name,
        "family": row.encoder.family,
        "bound": row.bound,
        "knob": row.knob.name if row.knob is not None else None,
        "knob_default": row.knob.default if row.knob is not None else None,
        "spec": row.encoder.spec,
        "stopped_at": stopped_at,
        "repeats": sources[0] if sources and len(set(sources)) == 1 else None,
        "by_k": by_k,
    }


def cell_records(cfg: ProbeConfig, rows: list[Row]) -> list[dict[str, Any]]:
    """Every finished cell once (cells shared by two rows appear once), curves thinned."""
    seen: set[Path] = set()
    out = []
    for row in rows:
        for k in cfg.ks:
            for cell in cells_of(row, k, cfg.seeds):
                path = cell.path(cfg.out)
                result = None if path in seen else load_cell(cell, cfg.out, cfg.settings)
                seen.add(path)
                if result is None:
                    continue
                keep = {key: v for key, v in result.items() if key not in ("curve", "settings")}
                out.append({**keep, "curve_every_10": result["curve"][::CURVE_STRIDE]})
    return out


def build(cfg: ProbeConfig, rows: list[Row], command: str, peers: list[Row] | None = None) -> dict[str, Any]:
    """The report of ``rows``; repeated cells are looked for among ``peers`` (default ``rows``)."""
    return {
        "note": cfg.note,
        "command": command,
        "settings": dataclasses.asdict(cfg.settings),
        "ks": list(cfg.ks),
        "seeds": list(cfg.seeds),
        "bounds": list(cfg.bounds),
        "rows": [row_summary(cfg, row, rows if peers is None else peers) for row in rows],
        "cells": cell_records(cfg, rows),
    }


def _entry(e: dict[str, Any], n_seeds: int) -> str:
    if e["status"] in ("stopped", "pending"):
        return e["status"]
    reached = [u for u in e["updates_to_success"] if u is not None]
    median = e["median_updates_to_success"]
    when = f" ({median:g}; {len(reached)}/{len(e['accuracy'])})" if median is not None else ""
    partial = f" [{len(e['accuracy'])}/{n_seeds} seeds]" if e["status"] == "partial" else ""
    same = f" = {e['repeat_of'].split(' [')[0]}" if e.get("repeat_of") else ""
    return f"{e['accuracy_mean']:.2f}{when}{partial}{same}"


def status(report: dict[str, Any]) -> str:
    """One sentence on how complete the grid is, from the rows alone (so a note never has to say it): an
    encoder is complete when each of its rows has every k finished or stopped; rows that recalled the largest k
    were stopped by the grid, not by a failure, and are named."""
    rows, last = report["rows"], str(report["ks"][-1])
    encoders = list(dict.fromkeys(r["encoder"] for r in rows))
    first_open = {
        e: min((int(k) for r in rows if r["encoder"] == e for k, x in r["by_k"].items()
                if x["status"] in ("pending", "partial")), default=None)
        for e in encoders
    }  # fmt: skip
    todo = [e for e in encoders if first_open[e] is not None]
    if todo:
        waiting = ", ".join(f"{e} (from k = {first_open[e]})" for e in todo)
        return (f"**Status**: partial: {len(encoders) - len(todo)} of {len(encoders)} encoders complete; still to "
                f"run: {waiting}.")  # fmt: skip
    through = [f"{r['encoder']} [{r['bound']}]" for r in rows
               if r["stopped_at"] is None and r["by_k"][last]["status"] == "done"]  # fmt: skip
    tail = (f"still recalling at k = {last}, where the grid ends: {', '.join(through)}." if through
            else f"every row stopped by k = {last}.")  # fmt: skip
    return (
        f"**Status**: complete: all {len(encoders)} encoders, each row run up to its first failing k; {tail}"
    )


def markdown(report: dict[str, Any]) -> str:
    s = report["settings"]
    ks, n_seeds = report["ks"], len(report["seeds"])
    lines = ["# Memory probe", ""]
    if report["note"]:
        lines += [f"**{report['note']}**", ""]
    if report["rows"]:
        lines += [status(report), ""]
    lines += [
        f"Generated by `{report['command']}` from the per-cell results (method: `experiments/memory_probe/probe.py`).",
        "",
        f"Each encoder, through its policy's own acting and training path (training windows of {s['seq_len']} "
        f"steps, state carried across windows and updates, the policy's cache bound), is trained by "
        f"cross-entropy to output the symbol it saw k steps ago ({s['n_symbols']} symbols, chance "
        f"{1 / s['n_symbols']:.3f}; {s['n_streams']} streams with episode resets; {s['windows']} windows per "
        f"update; Adam {s['learning_rate']:g}). A cell is the mean greedy accuracy over seeds "
        f"{report['seeds']} after {s['updates']} updates, then in brackets the median updates to "
        f"{s['success']:.0%} over the seeds that reached it and how many did. A row stops after the first k "
        "where no seed reaches it. Bound `default`: the encoder's context knob as the study runs it; `cover`: "
        "raised to k + 1 where smaller. Updates/s are measured on whatever machine ran the cells (one thread) "
        "and compare encoders only within one run.",
        "",
        "![accuracy vs k](plots/memory_probe.png)",
        "",
    ]
    for bound in report["bounds"]:
        rows = [r for r in report["rows"] if r["bound"] == bound]
        if not rows:
            continue
        table = []
        for r in rows:
            knob = f"{r['knob']}={r['knob_default']}" if r["knob"] else "–"
            if bound == "cover" and r["knob"]:
                knob = f"{r['knob']} ≥ k + 1"
            rates = [e["updates_per_s"] for e in r["by_k"].values() if "updates_per_s" in e]
            rate = f"{statistics.fmean(rates):.2f}" if rates else "–"
            cells = [_entry(r["by_k"][str(k)], n_seeds) for k in ks]
            name = f"{r['encoder']} (= {r['repeats'].split(' [')[0]})" if r.get("repeats") else r["encoder"]
            table.append([name, knob, *cells, rate])
        headers = ["encoder", "knob", *(f"k={k}" for k in ks), "updates/s"]
        lines += [f"## Context bound: {bound}", "", *markdown_table(headers, table), ""]
    same = sorted({(r["encoder"], e["repeat_of"].split(" [")[0]) for r in report["rows"] for e in r["by_k"].values()
                   if e.get("repeat_of")})  # fmt: skip
    if same:
        pairs = ", ".join(f"{a} = {b}" for a, b in same)
        lines += [f"**Repeated cells** ({pairs}): a cell marked `= X` gave, on its first seed, exactly X's cell at "
                  "that k (every 10th update's accuracy, the final one, updates to success, parameters): the same model "
                  "under two names "
                  "there. Its other seeds were not run; the cell shows X's (a repeated row is marked, not re-run).", ""]  # fmt: skip
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rl_transformers.utils.atomic import atomic_file

    bounds = [b for b in report["bounds"] if any(r["bound"] == b for r in report["rows"])]
    names = list(dict.fromkeys(r["encoder"] for r in report["rows"]))
    cmap = plt.get_cmap("tab10")
    # one style per encoder in every panel: 10 colours x 3 line styles tell up to 30 encoders apart
    style = {name: {"color": cmap(i % 10), "linestyle": ("-", "--", "-.")[i // 10 % 3], "marker": "osD"[i // 10 % 3]}
             for i, name in enumerate(names)}  # fmt: skip
    fig, axes = plt.subplots(1, len(bounds), figsize=(5.5 * len(bounds), 4.5), squeeze=False, sharey=True)
    for ax, bound in zip(axes[0], bounds):
        for r in (r for r in report["rows"] if r["bound"] == bound):
            points = [(int(k), e["accuracy_mean"]) for k, e in r["by_k"].items() if "accuracy_mean" in e]
            if points:
                ax.plot(*zip(*points), label=r["encoder"], markersize=4, **style[r["encoder"]])
        ax.axhline(1 / report["settings"]["n_symbols"], color="grey", linestyle=":", label="chance")
        ax.set_xscale("log", base=2)
        ax.set_xticks(report["ks"], [str(k) for k in report["ks"]])
        ax.set_xlabel("k (steps back)")
        ax.set_title(f"context bound: {bound}")
    axes[0][0].set_ylabel(f"accuracy after {report['settings']['updates']} updates")
    legend: dict[str, Any] = {}  # one entry per encoder, from whichever panel drew it
    for ax in axes[0]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    handles, labels = list(legend.values()), list(legend)
    fig.tight_layout()
    fig.legend(
        handles, labels, fontsize=7, ncol=1 + len(labels) // 18, loc="center left", bbox_to_anchor=(1, 0.5)
    )
    with atomic_file(path, suffix=".png") as tmp:
        fig.savefig(tmp, format="png", dpi=90, bbox_inches="tight")  # the legend sits right of the panels
    plt.close(fig)


def write(report: dict[str, Any], docs: Path) -> list[Path]:
    """memory_probe.{json,md} and plots/memory_probe.png under ``docs``."""
    docs = Path(docs)
    paths = [docs / "memory_probe.json", docs / "memory_probe.md", docs / "plots" / "memory_probe.png"]
    atomic_write_json(paths[0], report)
    atomic_write_text(paths[1], markdown(report))
    plot(report, paths[2])
    return paths


__all__ = ["build", "markdown", "plot", "row_summary", "status", "write"]
