"""The study's results from its run directories: the screening stage's documents (:data:`RECORDS`,
:data:`AGGREGATE`, :data:`PAGE`) and plots.

:func:`write_report` writes, from the finished records of the study's jobs
(:func:`rl_transformers.study.records.results`),
:data:`RECORDS` (one record per run: algo, task, encoder (the override string), seed, score, final_return,
env_steps, steps_per_s, parameters, plus encoder_name, wall_s, preset, the evaluation curve, git_sha and machine:
the commit and the machine the run ran at, ``"unknown"`` for runs that predate those fields),
:data:`AGGREGATE` (per suite and encoder: IQM, CI low / high, probability of improvement over the
reference) and :data:`PAGE` (a generated summary - see ``summary`` -, method, budget, the machines and
commits the records name (not the machine rebuilding the page), code,
per-task and aggregate tables, plots under ``plots/``: performance profile, IQM with CIs, learning curves per
task, score vs steps/s).

This is the study's **screening** stage (every encoder untuned at one small budget). Its **confirmation**
stage writes ``encoders.{md,json}`` (:mod:`~experiments.encoder_study.report`).
"""

from __future__ import annotations

import json
import re
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rl_transformers.study import files
from rl_transformers.study.aggregate import REFERENCE, REPS, SCALE, aggregate
from rl_transformers.study.plots import measured_rates, plot_all
from rl_transformers.study.records import UNKNOWN
from rl_transformers.study.summary import aggregate_summary, identical_runs, task_leaders
from rl_transformers.utils.atomic import atomic_write_text
from rl_transformers.utils.tables import markdown_table

RECORDS, AGGREGATE, PAGE = files.SCREENING_RECORDS, files.SCREENING_AGGREGATE, files.SCREENING_PAGE
"""The screening stage's documents under ``--docs`` (:mod:`~rl_transformers.study.files`)."""
RECORD_FIELDS = ("algo", "task", "encoder", "seed", "score", "final_return", "env_steps", "steps_per_s",
                 "parameters")  # fmt: skip
LOCAL_FIELDS = ("restored_from", "status")
"""Fields of a run directory's result.json that say where that copy came from, not what the run was: left out
of the published records, so that a checkout that restored its records rebuilds the same file."""
AGGREGATE_FIELDS = ("iqm", "ci_low", "ci_high", "prob_improvement")


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
    rows = []
    for enc in encoders:
        runs = [r for t in tasks for r in by.get((enc, t), [])]
        if not runs:
            continue
        cells = [_cell([r["score"] for r in by.get((enc, t), []) if r["score"] is not None]) for t in tasks]
        rates = measured_rates(runs)
        params = sorted({int(r["parameters"]) for r in runs})
        ptext = f"{params[0]:,}" if len(params) == 1 else f"{params[0]:,}–{params[-1]:,}"
        rows.append([enc, *cells, f"{statistics.fmean(rates):.0f}", ptext])
    return "\n".join(markdown_table(["encoder", *tasks, rate, "parameters"], rows)) + "\n"


def budget_table(records: Sequence[dict[str, Any]], algo: str, tasks: list[str]) -> str:
    """Does the reference learn each task within its budget? Per task, over the reference's finished seeds: the
    mean first evaluation, the mean score and their difference (the gain), beside the memory-less MLP's score."""
    ref = REFERENCE[algo]
    rows = []
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
        rows.append([task, f"{first:.2f}", f"{score:.2f}", f"{score - first:+.2f}", mtext, len(runs)])
    headers = ["task", f"{ref} first evaluation", f"{ref} score", f"{ref} gain", "mlp score", f"{ref} seeds"]
    return "\n".join(markdown_table(headers, rows)) + "\n"


def aggregate_table(agg: dict[str, Any]) -> str:
    ref = agg["reference"]
    rows: list[list[str]] = []
    for name, r in sorted(agg["encoders"].items(), key=lambda kv: -kv[1]["iqm"]):
        p = "–" if r["prob_improvement"] is None else f"{r['prob_improvement']:.2f}"
        pci = "–" if r["prob_ci_low"] is None else f"[{r['prob_ci_low']:.2f}, {r['prob_ci_high']:.2f}]"
        ci = f"[{r['ci_low']:.3f}, {r['ci_high']:.3f}]"
        rows.append([name, f"{r['iqm']:.3f}", ci, p, pci, f"{r['n_seeds']} × {r['n_tasks']}"])
    rows += [
        [name, "–", "–", "–", "–", f"incomplete: {why}"] for name, why in sorted(agg["incomplete"].items())
    ]
    headers = ["encoder", "IQM", "95 % CI", f"P(improvement over {ref})", "95 % CI", "seeds × tasks"]
    return "\n".join(markdown_table(headers, rows)) + "\n"


def code_text(records: Sequence[dict[str, Any]]) -> str:
    """Which code ran the records: their commits (``git_sha``, recorded by the worker at the start of each
    run, ``-dirty`` when the checkout had uncommitted changes) and how many records predate that field."""
    shas = [r.get("git_sha") or UNKNOWN for r in records]
    counts: dict[str, int] = defaultdict(int)
    for sha in shas:
        if sha != UNKNOWN:
            counts[sha] += 1
    missing = sum(1 for sha in shas if sha == UNKNOWN)
    if not counts:
        return f"Code: none of the {len(records)} records carries its commit (the field came later)."
    listed = ", ".join(f"`{sha[:7]}{'-dirty' if sha.endswith('-dirty') else ''}` ({n})"
                       for sha, n in sorted(counts.items(), key=lambda kv: -kv[1]))  # fmt: skip
    return (
        f"Code: records carry the git commit they ran at (`git_sha`): {listed}; {missing} older records "
        f"predate the field (`git_sha` `{UNKNOWN}`; the notes below list the code changes that made runs be "
        "discarded and re-run)."
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


_MARKDOWN = re.compile(r"([\\`*_\[\]<>|&])")


def md_text(text: str) -> str:
    """``text`` from a record as plain text in Markdown: every character that could start markup, a link, an
    HTML tag or an entity, or end a table cell is backslash-escaped (``<img onerror=...>`` shows as written)."""
    return _MARKDOWN.sub(r"\\\1", " ".join(str(text).split()))


def machines_text(records: Sequence[dict[str, Any]]) -> str:
    """Which machines ran the records (``machine``, recorded by the worker: CPU model, cores, Python and torch),
    and how many records predate that field (machine unknown). Each run used one torch thread."""
    counts: dict[str, int] = defaultdict(int)
    for r in records:
        counts[r.get("machine") or UNKNOWN] += 1
    unknown = counts.pop(UNKNOWN, 0)
    listed = "; ".join(
        f"{md_text(m)} ({n})" for m, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    )
    if not counts:
        return (f"Machine: `{UNKNOWN}` for all {len(records)} records (they predate the `machine` field); one "
                "torch thread per run.")  # fmt: skip
    older = f"; {unknown} records predate the field (machine `{UNKNOWN}`)" if unknown else ""
    return f"Machines (recorded by each run, one torch thread per run): {listed}{older}."


# -- the documents ------------------------------------------------------------------------------------------
def write_report(
    records: Sequence[dict[str, Any]],
    docs: Path,
    context: dict[str, Any],
) -> dict[str, Any]:
    """:data:`RECORDS`, :data:`AGGREGATE`, :data:`PAGE` and plots/ under ``docs``.

    ``context``: ``tasks`` {algo: [task names]}, ``task_notes`` {task: (tag, budget text, score text)},
    ``encoders`` {algo: [(name, spec, family, note)]}, ``excluded`` {algo: [(name, reason)]},
    ``expected`` {algo: number of runs planned}, ``command`` (the rebuild command), ``preset``.
    """
    docs = Path(docs)
    tasks = context["tasks"]
    atomic_write_text(docs / RECORDS, json.dumps([public(r) for r in records], indent=1) + "\n")
    covered = aggregate_tasks(records, context)
    aggs = build_aggregates(records, covered, context.get("reps"))
    atomic_write_text(docs / AGGREGATE, json.dumps(aggs, indent=1) + "\n")
    families = {name: family for rows in context["encoders"].values() for name, _, family, _ in rows}
    plots = plot_all(records, aggs, tasks, docs / "plots", covered, families) if records else []
    atomic_write_text(docs / PAGE, markdown(records, aggs, context, plots))
    return aggs


def public(record: dict[str, Any]) -> dict[str, Any]:
    """A record as the records files publish it: the documented fields first, then the rest, without the local
    fields (:data:`LOCAL_FIELDS`); ``git_sha`` and ``machine`` say ``"unknown"`` where the run did not record
    them."""
    out = {k: record.get(k) for k in RECORD_FIELDS}
    out.update({k: v for k, v in record.items() if k not in RECORD_FIELDS and k not in LOCAL_FIELDS})
    for k in ("git_sha", "machine"):
        out[k] = out.get(k) or UNKNOWN
    return out


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
    if callable(ctx.get("caveat")):
        lines += [ctx["caveat"](records), ""]
    lines += ["Rebuild these files from the run directories (resumes the study first unless `--report-only`):", "",
              "```bash", ctx["command"], "```", ""]  # fmt: skip
    lines += summary_section(records, aggs, ctx)
    lines += [
        "## Method",
        "",
        ctx.get("method", ""),
        "",
        machines_text(records),
        "",
        code_text(records),
        "",
        cost_text(records),
        "",
    ]
    suite_rows = [[t, algo, *ctx["task_notes"][t]] for algo in ("ppo", "dt") for t in tasks_of(ctx, algo)]
    lines += [
        "## Suite and budget",
        "",
        *markdown_table(["task", "algo", "tag", "budget", "score"], suite_rows),
    ]
    lines.append("")
    for algo, suite in (("ppo", "online"), ("dt", "offline")):
        encs = [e[0] for e in ctx["encoders"].get(algo, [])]
        if not encs:
            continue
        lines += [f"## {suite.capitalize()} ({algo.upper()})", ""]
        if algo == "dt" and ctx.get("offline_memory"):
            lines += ctx["offline_memory"]
        enc_rows = [
            [name, f"`{spec or '(default)'}`", family, note]
            for name, spec, family, note in ctx["encoders"][algo]
        ]
        enc_rows += [[name, "–", "excluded", reason] for name, reason in ctx["excluded"].get(algo, [])]
        lines += [
            "### Encoders",
            "",
            *markdown_table(["encoder", "override string", "family", "note"], enc_rows),
        ]
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
    text = ctx["notes"](records, aggs, ctx) if callable(ctx.get("notes")) else ctx.get("notes")
    if text:
        lines += ["## Notes and limits", "", text, ""]
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
