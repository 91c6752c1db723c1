"""The study's plots: IQM with CIs, performance profiles, score vs speed, and learning curves per task.

Learning curves are small multiples: one panel per encoder family (the ``family`` of the study's rows:
``default``, ``attention``, ``memory``, ``depth``), a family of more than :data:`PANEL_SIZE` rows split into
several panels, and the references (GRU, LSTM and MLP online; the DT's ``full`` attention offline) drawn in every
panel in black and grey, so each panel compares a few encoders with the same yardsticks. Within a panel no two
lines share a colour, and line styles alternate too (for print); legends sit outside the axes.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rl_transformers.study.aggregate import REFERENCE, REPS, SCALE, performance_profiles, score_matrices

PANEL_SIZE = 6
"""At most this many encoders per panel (besides the references)."""
REFERENCES = {"ppo": ("gru", "lstm", "mlp"), "dt": ("full",)}
"""Drawn in every panel of a task of that algorithm."""
REFERENCE_STYLE = {"gru": ("black", "-", 2.0), "lstm": ("0.35", "--", 1.6), "mlp": ("0.6", ":", 1.6),
                   "full": ("black", "-", 2.0)}  # fmt: skip
COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive",
           "tab:cyan")  # fmt: skip
"""Panel members' colours (tab10 without its grey, which the references use)."""
STYLES = ("-", "--", "-.")


def _save(fig: Any, path: Path, dpi: int) -> str:
    """Lay out, write and close ``fig``; returns the file name (the Markdown links it)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path.name


def plot_all(records: Sequence[dict[str, Any]], aggs: dict[str, Any], tasks: dict[str, list[str]],
             plots: Path, agg_tasks: dict[str, list[str]] | None = None,
             families: dict[str, str] | None = None) -> list[str]:  # fmt: skip
    """Write the plots; returns their file names (``agg_tasks``: the tasks the aggregates cover, default all;
    ``families``: {encoder: family} for the learning curves' panels)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots.mkdir(parents=True, exist_ok=True)
    made = []
    for algo, suite in (("ppo", "online"), ("dt", "offline")):
        if suite not in aggs or not aggs[suite]["encoders"]:
            continue
        rows = [r for r in records if r["algo"] == algo]
        scores, _ = score_matrices(rows, (agg_tasks or tasks)[algo], SCALE[algo])
        agg = aggs[suite]["encoders"]
        order = sorted(agg, key=lambda k: agg[k]["iqm"])
        fig, ax = plt.subplots(figsize=(7, 0.28 * len(order) + 1.2))
        ys = np.arange(len(order))
        iqm = np.array([agg[k]["iqm"] for k in order])
        err = np.array(
            [
                [agg[k]["iqm"] - agg[k]["ci_low"] for k in order],
                [agg[k]["ci_high"] - agg[k]["iqm"] for k in order],
            ]
        )
        ax.errorbar(iqm, ys, xerr=err, fmt="o", ms=4, capsize=3)
        ax.set_yticks(ys, order, fontsize=8)
        ax.set_xlabel("IQM of the score (95 % stratified bootstrap CI, rliable)")
        ax.grid(True, alpha=0.3)
        made.append(_save(fig, plots / f"iqm_{suite}.png", dpi=110))

        lo = min(float(m.min()) for m in scores.values())
        hi = max(float(m.max()) for m in scores.values())
        taus = np.linspace(min(lo, -1.0 if algo == "ppo" else 0.0), max(hi, 1.0), 81)
        prof, prof_ci = performance_profiles(scores, taus, reps=min(REPS, 200))
        fig, ax = plt.subplots(figsize=(8, 5))
        for k in sorted(prof, key=lambda k: -agg[k]["iqm"]):
            style = "-" if k in (REFERENCE[algo], "gtrxl") else "--"
            (line,) = ax.plot(taus, prof[k], style, lw=1.2, label=k)
            ax.fill_between(taus, prof_ci[k][0], prof_ci[k][1], color=line.get_color(), alpha=0.1)
        ax.set_xlabel("score τ" + (" (normalized / 100)" if algo == "dt" else ""))
        ax.set_ylabel("fraction of runs with score > τ")
        ax.legend(fontsize=6, ncol=2)
        ax.grid(True, alpha=0.3)
        made.append(_save(fig, plots / f"profile_{suite}.png", dpi=110))

        fig, ax = plt.subplots(figsize=(7, 5))
        for k in agg:
            rates = measured_rates([r for r in rows if r["encoder_name"] == k])
            if rates:
                ax.scatter(statistics.fmean(rates), agg[k]["iqm"], s=14)
                ax.annotate(k, (statistics.fmean(rates), agg[k]["iqm"]), fontsize=6)
        ax.set_xscale("log")
        ax.set_xlabel("env steps / s" if algo == "ppo" else "updates / s")
        ax.set_ylabel("IQM score")
        ax.grid(True, alpha=0.3)
        made.append(_save(fig, plots / f"score_vs_speed_{suite}.png", dpi=110))

    for task in sorted({r["task"] for r in records}):
        made.append(plot_curves(records, task, families or {}, plots))
    return made


def safe_name(text: str) -> str:
    """``text`` as one file-name component (anything but letters, digits, ``-_.`` becomes ``_``; no leading dot):
    a plot's name built from a record field never leaves the plots directory."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text).lstrip(".") or "_"


def measured_rates(runs: Sequence[dict[str, Any]]) -> list[float]:
    """The recorded speeds of ``runs`` (env steps/s online, updates/s offline), missing ones left out."""
    return [float(x) for r in runs if (x := r.get("steps_per_s") or r.get("updates_per_s"))]


def panels(
    names: Sequence[str], families: dict[str, str], references: Sequence[str]
) -> list[tuple[str, list[str]]]:
    """(title, encoders) of each panel: the non-reference encoders grouped by family (families in the order of
    ``families``' values, unknown ones last under "other"; names sorted), families over :data:`PANEL_SIZE` split
    evenly into parts."""
    order = {family: i for i, family in enumerate(dict.fromkeys(families.values()))}
    by: dict[str, list[str]] = {}
    for name in sorted(names, key=lambda n: (order.get(families.get(n, "other"), len(order)), n)):
        if name not in references:
            by.setdefault(families.get(name, "other"), []).append(name)
    out = []
    for family, members in by.items():
        parts = -(-len(members) // PANEL_SIZE)
        base, extra = divmod(len(members), parts)  # the first `extra` parts hold one more
        start = 0
        for i in range(parts):
            size = base + (i < extra)
            title = family if parts == 1 else f"{family} ({i + 1}/{parts})"
            out.append((title, members[start : start + size]))
            start += size
    return out


def panel_styles(members: Sequence[str]) -> dict[str, tuple[str, str, float]]:
    """(colour, line style, width) per panel member: colours unique within the panel, styles alternating."""
    if len(members) > len(COLOURS):
        raise ValueError(f"a panel holds at most {len(COLOURS)} encoders, got {len(members)}")
    return {name: (COLOURS[i], STYLES[i % len(STYLES)], 1.3) for i, name in enumerate(members)}


def mean_curve(curves: Sequence[Sequence[Sequence[float]]]) -> tuple[list[float], list[float]]:
    """Steps and the mean over runs of the evaluations at each step."""
    steps = sorted({p[0] for curve in curves for p in curve})
    values = [statistics.fmean(p[1] for curve in curves for p in curve if p[0] == s) for s in steps]
    return steps, values


def plot_curves(records: Sequence[dict[str, Any]], task: str, families: dict[str, str], plots: Path) -> str:
    """The small multiples of one task's learning curves (mean over seeds); returns the file name."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    by: dict[str, list[list[list[float]]]] = defaultdict(list)
    algo = "ppo"
    for r in records:
        if r["task"] == task and r.get("curve"):
            by[r["encoder_name"]].append(r["curve"])
            algo = r["algo"]
    refs = [n for n in REFERENCES.get(algo, ()) if n in by]
    groups = panels(sorted(by), families, refs) or [("references", [])]
    cols = 2
    rows = -(-len(groups) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(13, 3.1 * rows), sharex=True, sharey=True, squeeze=False)
    for ax, (title, members) in zip(axes.flat, groups, strict=False):
        for name in refs:
            colour, style, width = REFERENCE_STYLE.get(name, ("black", "-", 2.0))
            ax.plot(*mean_curve(by[name]), style, color=colour, lw=width, label=f"{name} (n={len(by[name])})")
        for name, (colour, style, width) in panel_styles(members).items():
            ax.plot(*mean_curve(by[name]), style, color=colour, lw=width, label=f"{name} (n={len(by[name])})")
        ax.set_title(title, fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    for ax in axes.flat[len(groups) :]:
        ax.set_visible(False)
    for col in range(cols):  # the x axis under the lowest panel of each column
        shown = [ax for ax in axes[:, col] if ax.get_visible()]
        if shown:
            shown[-1].xaxis.set_tick_params(labelbottom=True)
            shown[-1].set_xlabel("env steps" if algo == "ppo" else "updates")
            shown[-1].xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x / 1000:g}k" if x else "0"))
    for ax in axes[:, 0]:
        ax.set_ylabel("greedy evaluation" if algo == "ppo" else "normalized score")
    fig.suptitle(f"{task}: mean over seeds; references in black / grey in every panel", fontsize=11)
    return _save(fig, plots / f"curves_{safe_name(task)}.png", dpi=100)
