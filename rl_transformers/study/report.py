"""The study's results from its run directories: encoders.json, encoders_aggregate.json, encoders.md, plots.

:func:`collect` reads every ``result.json`` under ``<out>/<preset>``; :func:`write_report` writes
``encoders.json`` (one record per run: algo, task, encoder (the override string), seed, score, final_return,
env_steps, steps_per_s, parameters, plus encoder_name, wall_s, preset, the evaluation curve and, for runs
since the field was added, git_sha: the commit the run ran at),
``encoders_aggregate.json`` (per suite and encoder: IQM, CI low / high, probability of improvement over the
reference) and ``encoders.md`` (a generated summary - see ``summary`` -, method, budget, machine, code,
per-task and aggregate tables, plots under ``plots/``: performance profile, IQM with CIs, learning curves per
task, score vs steps/s).
"""

from __future__ import annotations

import json
import platform
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rl_transformers.study.aggregate import REPS, aggregate, performance_profiles, score_matrices
from rl_transformers.study.summary import aggregate_summary, identical_runs, task_leaders
from rl_transformers.utils.atomic import atomic_write_text

RECORD_FIELDS = ("algo", "task", "encoder", "seed", "score", "final_return", "env_steps", "steps_per_s",
                 "parameters")  # fmt: skip
AGGREGATE_FIELDS = ("iqm", "ci_low", "ci_high", "prob_improvement")
REFERENCE = {"ppo": "gru", "dt": "full"}
SCALE = {"ppo": 1.0, "dt": 100.0}


def collect(out: Path, preset: str) -> list[dict[str, Any]]:
    """Every finished run's record under ``<out>/<preset>``, sorted."""
    records = []
    for path in sorted((Path(out) / preset).rglob("result.json")):
        records.append(json.loads(path.read_text()))
    return sorted(records, key=lambda r: (r["algo"], r["task"], r["encoder_name"], r["seed"]))


def build_aggregates(
    records: Sequence[dict[str, Any]], tasks: dict[str, list[str]], reps: int | None = None
) -> dict[str, Any]:
    """{"online": ..., "offline": ...} aggregates (see :func:`~rl_transformers.study.aggregate.aggregate`)."""
    out = {}
    for algo, suite in (("ppo", "online"), ("dt", "offline")):
        rows = [r for r in records if r["algo"] == algo]
        if rows and tasks.get(algo):
            out[suite] = aggregate(rows, tasks[algo], REFERENCE[algo], SCALE[algo], reps or REPS)
    return out


def aggregate_tasks(records: Sequence[dict[str, Any]], ctx: dict[str, Any]) -> dict[str, list[str]]:
    """The tasks each aggregate covers: with ``ctx["planned"]`` (runs planned per task) only the tasks whose every
    planned run finished - so a partial study aggregates its complete tasks, not a mix of seeds - else all."""
    planned = ctx.get("planned")
    if not planned:
        return dict(ctx["tasks"])
    done: dict[str, int] = defaultdict(int)
    for r in records:
        done[r["task"]] += 1
    return {algo: [t for t in names if done[t] >= planned.get(t, 0)] for algo, names in ctx["tasks"].items()}


def _rates(runs: Sequence[dict[str, Any]]) -> list[float]:
    """The recorded speeds of ``runs`` (env steps/s online, updates/s offline), missing ones left out."""
    return [float(x) for r in runs if (x := r.get("steps_per_s") or r.get("updates_per_s"))]


def _cell(values: list[float]) -> str:
    if not values:
        return "–"
    mean = statistics.fmean(values)
    if len(values) == 1:
        return f"{mean:.2f} (n=1)"
    return f"{mean:.2f} ± {statistics.stdev(values):.2f}"


def task_table(records: Sequence[dict[str, Any]], algo: str, tasks: list[str], encoders: list[str]) -> str:
    """Encoder x task: mean ± std over seeds of the score (n = finished seeds), then steps/s and parameters."""
    by: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        if r["algo"] == algo:
            by[(r["encoder_name"], r["task"])].append(r)
    rate = "steps/s" if algo == "ppo" else "updates/s"
    head = f"| encoder | {' | '.join(tasks)} | {rate} | parameters |"
    lines = [head, "|---" * (len(tasks) + 3) + "|"]
    for enc in encoders:
        runs = [r for t in tasks for r in by.get((enc, t), [])]
        if not runs:
            continue
        cells = [_cell([r["score"] for r in by.get((enc, t), []) if r["score"] is not None]) for t in tasks]
        rates = _rates(runs)
        params = sorted({int(r["parameters"]) for r in runs})
        ptext = f"{params[0]:,}" if len(params) == 1 else f"{params[0]:,}–{params[-1]:,}"
        lines.append(f"| {enc} | {' | '.join(cells)} | {statistics.fmean(rates):.0f} | {ptext} |")
    return "\n".join(lines) + "\n"


def budget_table(records: Sequence[dict[str, Any]], algo: str, tasks: list[str]) -> str:
    """Does the reference learn each task within its budget? Per task, over the reference's finished seeds: the
    mean first evaluation, the mean score and their difference (the gain), beside the memory-less MLP's score."""
    ref = REFERENCE[algo]
    lines = [f"| task | {ref} first evaluation | {ref} score | {ref} gain | mlp score | {ref} seeds |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for task in tasks:
        runs = [r for r in records if r["algo"] == algo and r["task"] == task and r["encoder_name"] == ref]
        runs = [r for r in runs if r.get("curve") and r["score"] is not None]
        if not runs:
            continue
        first = statistics.fmean(r["curve"][0][1] for r in runs)
        score = statistics.fmean(r["score"] for r in runs)
        mlp = [r["score"] for r in records if r["algo"] == algo and r["task"] == task
               and r["encoder_name"] == "mlp" and r["score"] is not None]  # fmt: skip
        mtext = f"{statistics.fmean(mlp):.2f}" if mlp else "–"
        lines.append(f"| {task} | {first:.2f} | {score:.2f} | {score - first:+.2f} | {mtext} | {len(runs)} |")
    return "\n".join(lines) + "\n"


def aggregate_table(agg: dict[str, Any]) -> str:
    ref = agg["reference"]
    lines = [f"| encoder | IQM | 95 % CI | P(improvement over {ref}) | 95 % CI | seeds × tasks |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    rows = sorted(agg["encoders"].items(), key=lambda kv: -kv[1]["iqm"])
    for name, r in rows:
        p = "–" if r["prob_improvement"] is None else f"{r['prob_improvement']:.2f}"
        pci = "–" if r["prob_ci_low"] is None else f"[{r['prob_ci_low']:.2f}, {r['prob_ci_high']:.2f}]"
        lines.append(f"| {name} | {r['iqm']:.3f} | [{r['ci_low']:.3f}, {r['ci_high']:.3f}] | {p} | {pci} | "
                     f"{r['n_seeds']} × {r['n_tasks']} |")  # fmt: skip
    for name, why in sorted(agg["incomplete"].items()):
        lines.append(f"| {name} | – | – | – | – | incomplete: {why} |")
    return "\n".join(lines) + "\n"


def code_text(records: Sequence[dict[str, Any]]) -> str:
    """Which code ran the records: their commits (``git_sha``, recorded by the worker at the start of each
    run, ``-dirty`` when the checkout had uncommitted changes) and how many records predate that field."""
    shas = [r.get("git_sha") for r in records]
    counts: dict[str, int] = defaultdict(int)
    for sha in shas:
        if sha:
            counts[sha] += 1
    missing = sum(1 for sha in shas if not sha)
    if not counts:
        return f"Code: none of the {len(records)} records carries its commit (the field came later)."
    listed = ", ".join(f"`{sha[:7]}{'-dirty' if sha.endswith('-dirty') else ''}` ({n})"
                       for sha, n in sorted(counts.items(), key=lambda kv: -kv[1]))  # fmt: skip
    return (
        f"Code: records carry the git commit they ran at (`git_sha`): {listed}; {missing} older records "
        "predate the field (the notes below list the code changes that made runs be discarded and re-run)."
    )


def cost_text(records: Sequence[dict[str, Any]]) -> str:
    """What the finished runs cost: the sum of their wall-clock times, per suite and in all (core-hours: each
    run has one core)."""
    hours = {
        a: sum(float(r.get("wall_s") or 0.0) for r in records if r["algo"] == a) / 3600 for a in ("ppo", "dt")
    }
    n = {a: sum(1 for r in records if r["algo"] == a) for a in ("ppo", "dt")}
    return (f"Cost: the {len(records)} finished runs took {sum(hours.values()):.1f} core-hours (the sum of their "
            f"wall-clock times; online {n['ppo']} runs, {hours['ppo']:.1f} h; offline {n['dt']} runs, "
            f"{hours['dt']:.1f} h). `--dry-run` estimates what is left from the measured rates.")  # fmt: skip


def machine() -> str:
    """CPU model, usable cores, Python and torch versions of this machine (the study's runs use 1 thread)."""
    import torch

    from rl_transformers.utils.provenance import device_name
    from rl_transformers.utils.training import available_cores

    return (
        f"{device_name(torch.device('cpu'))}, {available_cores()} cores, Python {platform.python_version()}, "
        f"torch {torch.__version__}, 1 thread per run"
    )


# -- plots ----------------------------------------------------------------------------------------------------
def _save(fig: Any, path: Path, dpi: int) -> str:
    """Lay out, write and close ``fig``; returns the file name (the Markdown links it)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path.name


def plot_all(records: Sequence[dict[str, Any]], aggs: dict[str, Any], tasks: dict[str, list[str]],
             plots: Path, agg_tasks: dict[str, list[str]] | None = None) -> list[str]:  # fmt: skip
    """Write the plots; returns their file names (``agg_tasks``: the tasks the aggregates cover, default all)."""
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
            rates = _rates([r for r in rows if r["encoder_name"] == k])
            if rates:
                ax.scatter(statistics.fmean(rates), agg[k]["iqm"], s=14)
                ax.annotate(k, (statistics.fmean(rates), agg[k]["iqm"]), fontsize=6)
        ax.set_xscale("log")
        ax.set_xlabel("env steps / s" if algo == "ppo" else "updates / s")
        ax.set_ylabel("IQM score")
        ax.grid(True, alpha=0.3)
        made.append(_save(fig, plots / f"score_vs_speed_{suite}.png", dpi=110))

    for task in sorted({r["task"] for r in records}):
        fig, ax = plt.subplots(figsize=(8, 5))
        by: dict[str, list[list[list[float]]]] = defaultdict(list)
        for r in records:
            if r["task"] == task and r.get("curve"):
                by[r["encoder_name"]].append(r["curve"])
        # one colour per encoder (tab20 + Dark2: 28), so no two legend entries look alike
        palette = [plt.get_cmap("tab20")(i) for i in range(20)] + [plt.get_cmap("Dark2")(i) for i in range(8)]
        for i, (k, curves) in enumerate(sorted(by.items())):
            steps = sorted({c[0] for curve in curves for c in curve})
            mean = [
                statistics.fmean(v for s2, v in (p for curve in curves for p in curve) if s2 == s)
                for s in steps
            ]
            style = "-" if k in ("gru", "gtrxl", "full") else "--"
            ax.plot(
                steps, mean, style, lw=1.1, color=palette[i % len(palette)], label=f"{k} (n={len(curves)})"
            )
        ax.set_xlabel(
            "env steps" if any(r["algo"] == "ppo" and r["task"] == task for r in records) else "updates"
        )
        ax.set_ylabel("greedy evaluation (mean over seeds)")
        ax.set_title(task)
        ax.legend(fontsize=6, ncol=2)
        ax.grid(True, alpha=0.3)
        made.append(_save(fig, plots / f"curves_{task}.png", dpi=100))
    return made


# -- the documents ------------------------------------------------------------------------------------------
def write_report(
    records: Sequence[dict[str, Any]],
    docs: Path,
    context: dict[str, Any],
) -> dict[str, Any]:
    """encoders.json, encoders_aggregate.json, encoders.md and plots/ under ``docs``.

    ``context``: ``tasks`` {algo: [task names]}, ``task_notes`` {task: (tag, budget text, score text)},
    ``encoders`` {algo: [(name, spec, family, note)]}, ``excluded`` {algo: [(name, reason)]},
    ``expected`` {algo: number of runs planned}, ``command`` (the rebuild command), ``preset``.
    """
    docs = Path(docs)
    tasks = context["tasks"]
    public = [{**{k: r.get(k) for k in RECORD_FIELDS}, **{k: v for k, v in r.items() if k not in RECORD_FIELDS}}
              for r in records]  # fmt: skip
    atomic_write_text(docs / "encoders.json", json.dumps(public, indent=1) + "\n")
    covered = aggregate_tasks(records, context)
    aggs = build_aggregates(records, covered, context.get("reps"))
    atomic_write_text(docs / "encoders_aggregate.json", json.dumps(aggs, indent=1) + "\n")
    plots = plot_all(records, aggs, tasks, docs / "plots", covered) if records else []
    atomic_write_text(docs / "encoders.md", markdown(records, aggs, context, plots))
    return aggs


def markdown(
    records: Sequence[dict[str, Any]], aggs: dict[str, Any], ctx: dict[str, Any], plots: list[str]
) -> str:
    n_done = {a: sum(1 for r in records if r["algo"] == a) for a in ("ppo", "dt")}
    partial = any(n_done[a] < ctx["expected"].get(a, 0) for a in ("ppo", "dt"))
    lines = ["# Encoder study: attention variants as policy encoders (PPO online, DT offline)", ""]
    status = "PARTIAL RESULTS" if partial else "Complete"
    lines += [f"> **{status}** (preset `{ctx['preset']}`): online {n_done['ppo']} / {ctx['expected'].get('ppo', 0)} "
              f"runs, offline {n_done['dt']} / {ctx['expected'].get('dt', 0)} runs finished. "
              "Rows with fewer seeds or tasks than planned are labelled by their n; the aggregate covers only the "
              "tasks whose every planned run finished.", ""]  # fmt: skip
    if partial and ctx.get("planned"):
        done = {t: sum(1 for r in records if r["task"] == t) for t in ctx["planned"]}
        lines += ["Finished runs per task: " + ", ".join(f"{t} {done[t]} / {n}" for t, n in ctx["planned"].items())
                  + ".", ""]  # fmt: skip
    lines += ["Rebuild these files from the run directories (resumes the study first unless `--report-only`):", "",
              "```bash", ctx["command"], "```", ""]  # fmt: skip
    lines += summary_section(records, aggs, ctx)
    lines += [
        "## Method",
        "",
        ctx.get("method", ""),
        "",
        f"Machine: {machine()}.",
        "",
        code_text(records),
        "",
        cost_text(records),
        "",
    ]
    lines += ["## Suite and budget", "", "| task | algo | tag | budget | score |", "|---|---|---|---|---|"]
    for algo in ("ppo", "dt"):
        for t in tasks_of(ctx, algo):
            tag, budget, score = ctx["task_notes"][t]
            lines.append(f"| {t} | {algo} | {tag} | {budget} | {score} |")
    lines.append("")
    for algo, suite in (("ppo", "online"), ("dt", "offline")):
        encs = [e[0] for e in ctx["encoders"].get(algo, [])]
        if not encs:
            continue
        lines += [f"## {suite.capitalize()} ({algo.upper()})", "", "### Encoders", "",
                  "| encoder | override string | family | note |", "|---|---|---|---|"]  # fmt: skip
        for name, spec, family, note in ctx["encoders"][algo]:
            lines.append(f"| {name} | `{spec or '(default)'}` | {family} | {note} |")
        for name, reason in ctx["excluded"].get(algo, []):
            lines.append(f"| {name} | – | excluded | {reason} |")
        if algo == "ppo":
            lines += ["", f"### Budget check: does {REFERENCE[algo]} learn each task in its budget?", "",
                      budget_table(records, algo, tasks_of(ctx, algo)).rstrip("\n")]  # fmt: skip
        lines += ["", "### Per task (score: mean ± std over seeds)", "",
                  task_table(records, algo, tasks_of(ctx, algo), encs)]  # fmt: skip
        if suite in aggs:
            covered = aggregate_tasks(records, ctx).get(algo, [])
            lines += ["### Aggregate (rliable: IQM, stratified bootstrap 95 % CI, probability of improvement)", "",
                      f"Over {len(covered)} of {len(tasks_of(ctx, algo))} tasks (those with every planned run "
                      f"finished): {', '.join(covered)}."
                      + (" Scores are the normalized scores / 100 (1 = the target return)." if algo == "dt" else ""),
                      "", aggregate_table(aggs[suite])]  # fmt: skip
        for p in plots:
            if p.endswith(f"_{suite}.png"):
                lines.append(f"![{p}](plots/{p})")
        lines.append("")
    curves = [p for p in plots if p.startswith("curves_")]
    if curves:
        lines += ["## Learning curves", ""] + [f"![{p}](plots/{p})" for p in curves] + [""]
    if ctx.get("notes"):
        lines += ["## Notes and limits", "", ctx["notes"], ""]
    return "\n".join(lines)


def summary_section(
    records: Sequence[dict[str, Any]], aggs: dict[str, Any], ctx: dict[str, Any]
) -> list[str]:
    """The "## Summary" lines: per suite, what its aggregate and per-task tables show (see ``summary``)."""
    lines = ["## Summary", ""]
    for algo, suite in (("ppo", "online"), ("dt", "offline")):
        if suite not in aggs:
            continue
        covered = aggs[suite]["tasks"]  # the tasks the aggregate was built over
        lines += [
            f"- **{suite.capitalize()} ({algo.upper()})**, over {len(covered)} of {len(tasks_of(ctx, algo))} "
            f"tasks: {aggregate_summary(aggs[suite])} {task_leaders(records, algo, covered)} "
            f"{identical_runs(records, algo, covered)}".rstrip()
        ]
    return [*lines, ""] if len(lines) > 2 else []


def tasks_of(ctx: dict[str, Any], algo: str) -> list[str]:
    return list(ctx["tasks"].get(algo, []))
