"""The confirmation stage's documents: :data:`RECORDS` (one record per finished run, restore-able) and :data:`PAGE`
(tuning results, the verdict per ladder (:mod:`~experiments.encoder_study.verdict`), rliable
aggregates per task family, untuned vs tuned per task).

Built only from the records and the tuning results, so a rebuild says the same thing byte for byte. Scores of a
run: the **final MMER** (its last evaluation, ``final_return``) and the **normalized AUC** (:func:`~rl_transformers.
study.aggregate.normalized_auc` of its evaluation curve over the rung's budget, random = 0, max = 1). A task on
which every (encoder, variant) cell's mean final score is within :data:`SEPARATION` of the random score, or every
one within it of the maximum, **did not separate**: it is marked and left out of its family's aggregate. A
family's aggregate is the interquartile mean with a 95 % stratified-bootstrap interval (``rliable``; Agarwal et
al. 2021, arXiv 2108.13264) over seeds x separating tasks of the family, of the normalized final score (clipped
to [0, 1], the AUC's scale) and of the normalized AUC, per encoder and variant, over the seeds finished on every
such task.
"""

from __future__ import annotations

import itertools
import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from experiments.encoder_study import candidates as cc
from experiments.encoder_study import plan as cp
from experiments.encoder_study.sections import probe_lines, screening_lines
from experiments.encoder_study.sizes import parameter_lines
from experiments.encoder_study.verdict import verdict_lines
from rl_transformers.study import files
from rl_transformers.study.aggregate import iqm_intervals, normalized_auc
from rl_transformers.study.encoders import Encoder
from rl_transformers.study.report import code_text, machines_text, public
from rl_transformers.utils.atomic import atomic_write_json, atomic_write_text
from rl_transformers.utils.tables import markdown_table

REPS = 2000
RECORDS, PAGE, TUNING = files.RECORDS, files.PAGE, files.TUNING
"""The confirmation stage's documents under ``--docs`` (:mod:`~rl_transformers.study.files`)."""
SEPARATION = 0.05
"""A task separates unless every cell's mean final score is within this of the random score, or of the max."""


def final(record: dict[str, Any]) -> float:
    return float(record["final_return"])


def auc(record: dict[str, Any]) -> float:
    r = cp.rung(record["task"])
    return normalized_auc(record.get("curve") or [], r.budget, r.low, r.high)


def cells(found: Sequence[dict[str, Any]]) -> dict[tuple[str, str, str], list[dict[str, Any]]]:
    """Records by (task, encoder name, variant), sorted by seed."""
    out: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in sorted(found, key=lambda r: r["seed"]):
        if r.get("final_return") is not None:
            out[(r["task"], r["encoder_name"], r["preset"])].append(r)
    return out


def separation(found: Sequence[dict[str, Any]]) -> dict[str, str | None]:
    """{task: why it did not separate, or None when it did (or has no record yet)}: every (encoder, variant)
    mean final score within :data:`SEPARATION` of the random score or of the maximum (the "did not separate" rule), or, where a
    memoryless policy beats random (``Rung.memoryless``: T-Maze), none more than that above it."""
    by_cell = cells(found)
    return {r.name: _unseparated(r, _means(by_cell, r.name)) for r in cp.RUNGS}


def _means(
    by_cell: dict[tuple[str, str, str], list[dict[str, Any]]], task: str, seeds: int = 0
) -> list[float]:
    """Mean final score of each cell of ``task`` with at least ``seeds`` records."""
    return [statistics.fmean(final(x) for x in recs) for (t, _, _), recs in by_cell.items()
            if t == task and len(recs) >= seeds]  # fmt: skip


def _unseparated(r: cp.Rung, means: list[float]) -> str | None:
    """Why cells with these means did not separate, or None when they did (or there are none)."""
    if means and all(abs(m - r.low) <= SEPARATION for m in means):
        return f"every encoder within {SEPARATION} of the random score {r.low:g}"
    if means and all(abs(m - r.high) <= SEPARATION for m in means):
        return f"every encoder within {SEPARATION} of the maximum {r.high:g}"
    if means and r.memoryless is not None and all(m <= r.memoryless + SEPARATION for m in means):
        return (f"no encoder more than {SEPARATION} above the best memoryless score {r.memoryless:g}: "
                "nothing was remembered")  # fmt: skip
    return None


def settled_rungs(found: Sequence[dict[str, Any]], per_rung: int) -> frozenset[str]:
    """Rungs whose :func:`separation` no further run can change: all ``per_rung`` runs finished, or the cells
    that have all their seeds already separate it (each "did not separate" rule needs *every* cell inside one
    band, so cells outside it stay outside whatever the other cells score)."""
    by_cell, seeds = cells(found), len(cp.SEEDS)

    def settled(r: cp.Rung) -> bool:
        if sum(len(v) for (t, _, _), v in by_cell.items() if t == r.name) >= per_rung:
            return True
        complete = _means(by_cell, r.name, seeds)
        return bool(complete) and _unseparated(r, complete) is None

    return frozenset(r.name for r in cp.RUNGS if settled(r))


def protocol_runs_per_rung(rows: int, candidates: int) -> int:
    """Runs of one rung when every row is tuned (both variants) plus the untuned-only candidates: the size
    the report counts against and the stop rule waits for (a rung is not judged before its tuned runs exist)."""
    return len(cp.SEEDS) * (rows * len(cp.VARIANTS) + candidates)


def stopped_rungs(found: Sequence[dict[str, Any]], planned: dict[str, int]) -> dict[str, str]:
    """The ladder's stop rule (the memory probe's, applied to the rungs): {rung: why} for every rung
    of a family that comes after a rung that did not separate once all its ``planned`` runs finished. A longer
    memory of the same task is harder in every respect, so it cannot separate where the shorter one did not, and
    its runs would cost the most of all (RepeatPreviousHard, TMaze400)."""
    split, done = separation(found), Counter(r["task"] for r in found)
    out: dict[str, str] = {}
    for family in cp.ladder_families():
        rungs = cp.memory_rungs(family)
        for shorter, longer in itertools.pairwise(rungs):
            if shorter.name in out:
                out[longer.name] = out[shorter.name]
            elif split[shorter.name] and done[shorter.name] >= planned.get(shorter.name, 0) > 0:
                out[longer.name] = (
                    f"{shorter.name} (memory {shorter.memory}) did not separate with all its runs"
                )
    return out


def family_aggregates(found: Sequence[dict[str, Any]], reps: int | None = None) -> dict[str, Any]:
    """Per family: the separating tasks with records, and per metric {"<encoder> (<variant>)": (IQM, low, high)}."""
    by_cell, split = cells(found), separation(found)
    out: dict[str, Any] = {}
    for family in dict.fromkeys(r.family for r in cp.RUNGS):
        tasks = [r.name for r in cp.RUNGS if r.family == family and split[r.name] is None
                 and any(t == r.name for t, _, _ in by_cell)]  # fmt: skip
        entry: dict[str, Any] = {"tasks": tasks, "final": {}, "auc": {}}
        rows = sorted({(n, v) for t, n, v in by_cell if t in tasks})
        for metric, score in (("final", lambda x: cp.rung(x["task"]).normalized(final(x))), ("auc", auc)):
            matrices = {}
            for name, variant in rows:
                per_task = [{x["seed"]: score(x) for x in by_cell.get((t, name, variant), [])} for t in tasks]
                seeds = sorted(set.intersection(*(set(p) for p in per_task))) if per_task else []
                if seeds:
                    matrices[f"{name} ({variant})"] = np.array([[p[s] for p in per_task] for s in seeds])
            entry[metric] = iqm_intervals(matrices, reps=reps or REPS)
        out[family] = entry
    return out


PLATEAU = 0.05
"""The plateau rule: a budget is enough when the last quarter adds less than this to the mean evaluation."""


def last_quarter_gain(record: dict[str, Any]) -> float | None:
    """The last evaluation minus the last one at or before 3/4 of the budget (None without both)."""
    curve, budget = record.get("curve") or [], cp.rung(record["task"]).budget
    before = [v for step, v in curve if step <= 0.75 * budget]
    return float(curve[-1][1]) - float(before[-1]) if curve and before else None


def plateau_text(r: cp.Rung, by_cell: dict[tuple[str, str, str], list[dict[str, Any]]]) -> str:
    """Whether GRU and the best tuned encoder had plateaued: their mean last-quarter gain (:data:`PLATEAU`)."""
    tuned = {n: statistics.fmean(final(x) for x in recs) for (t, n, v), recs in by_cell.items()
             if t == r.name and v == cp.TUNED}  # fmt: skip
    rows = [(cp.REFERENCE, v) for v in cp.VARIANTS] + (
        [(max(tuned, key=tuned.__getitem__), cp.TUNED)] if tuned else []
    )
    parts = []
    for name, variant in dict.fromkeys(rows):
        gains = [
            g for x in by_cell.get((r.name, name, variant), []) if (g := last_quarter_gain(x)) is not None
        ]
        if gains:
            gain = statistics.fmean(gains)
            parts.append(
                f"`{name}` {variant.removeprefix('v2-')} {gain:+.2f}{'' if gain < PLATEAU else ' (still rising)'}"
            )
    return f" Last-quarter gain (plateau below +{PLATEAU}): {'; '.join(parts)}." if parts else ""


def _cell(values: list[float], seeds: int) -> str:
    if not values:
        return "–"
    more = "" if len(values) >= seeds else f" ({len(values)}/{seeds})"
    return f"{statistics.fmean(values):.2f}{more}"


def tuning_lines(table: Sequence[Encoder], tuned: dict[str, Any]) -> list[str]:
    s = cp.tuning_settings()
    lines = [
        "## Tuning",
        "",
        f"Every encoder: {cp.TRIALS} trials of Optuna's TPE sampler with the median pruner on {s['task']} "
        f"({s['budget']:,} env steps per trial, evaluations every {s['eval_every']:,}, no pruning before "
        f"{s['pruner_warmup_steps']:,}), objective "
        f"`{s['objective']}` (the mean of a trial's evaluations), tuning seeds disjoint from the test seeds, "
        "search space: learning rate, entropy coefficient, training window `seq_len` and the encoder's context "
        "knob (`scripts/tune.py` defaults). Commands: `python -m experiments.encoder_study.run --stage tune`. "
        "Results tuned under earlier settings are kept in the tuning file's `previous` list, never used here "
        '(docs/encoder_study.md, "Why Easy").',
        "",
    ]
    low = cp.rung(s["task"]).low
    silent: list[str] = []
    rows: list[list[Any]] = []
    for e in table:
        t = tuned.get(e.name, "not tuned yet")
        if not isinstance(t, cp.Tuned):
            rows.append([f"`{e.name}`", t, "–", "–", "–", "–", "–"])
            continue
        knob = ", ".join(f"{k} {v}" for k, v in t.params.items() if k not in t.ppo) or "–"
        value = t.entry.get("value")
        score = f"{value:.3f}" if isinstance(value, int | float) else "–"
        status = f"tuned ({t.entry.get('finished_trials')} trials)"
        if no_tuning_signal(value, low):
            status += ", **no signal**"
            silent.append(f"`{e.name}`")
        ppo = t.ppo
        rows.append([f"`{e.name}`", status, f"{ppo['learning_rate']:.2e}", f"{ppo['ent_coef']:.2e}", ppo["seq_len"],
                     knob, score])  # fmt: skip
    headers = ["encoder", "status", "learning rate", "ent_coef", "seq_len", "knob", "trial score"]
    lines += markdown_table(headers, rows)
    if silent:
        lines += ["", f"**No signal**: the best of the trials of {', '.join(silent)} scored within {SEPARATION} of "
                  f"the random score {low:g} on {s['task']}, so every trial stayed at chance and their \"best\" "
                  "parameters are one draw of the search space, not a tuned recipe. Read those rows' tuned columns "
                  "as \"tuning found nothing on the tuning task\", not as the encoder's tuned performance."]  # fmt: skip
    return lines


def candidate_lines(candidates: Sequence[Encoder]) -> list[str]:
    """The candidate defaults, below the tuning table (they are never tuned)."""
    if not candidates:
        return []
    lines = ["", "**Candidate defaults** (untuned only, not parameter-matched: settings of GTrXL that "
             "could become its default, compared on the ladder with the untuned `gtrxl` they would replace):", ""]  # fmt: skip
    return lines + [f"- `{e.name}` (`{e.spec}`): {e.note}" for e in candidates]


def no_tuning_signal(value: Any, low: float) -> bool:
    """Whether a tuning study's best trial score ``value`` is within :data:`SEPARATION` of the tuning task's
    random score ``low`` (the same rule as a task that did not separate): nothing was learned in any trial."""
    return isinstance(value, int | float) and abs(float(value) - low) <= SEPARATION


VARIANT_COLUMNS = ["encoder", "final untuned", "final tuned", "AUC untuned", "AUC tuned"]
"""Columns of the per-task and per-family tables: final score and AUC, untuned then tuned."""


def task_lines(found: Sequence[dict[str, Any]], table: Sequence[Encoder], tuned: dict[str, Any],
               stopped: dict[str, str] | None = None) -> list[str]:  # fmt: skip
    by_cell, split = cells(found), separation(found)
    seeds = len(cp.SEEDS)
    lines = ["## Untuned vs tuned, per task", "",
             "A cell: the mean over the seeds finished (their count while fewer than "
             f"{seeds}). Final: the last evaluation's MMER / return; AUC: normalized area under the evaluation "
             "curve (0 = random, 1 = the maximum from the first step)."]  # fmt: skip
    stopped = stopped or {}
    for r in cp.RUNGS:
        mark = (
            f" — **did not separate** ({split[r.name]}): left out of the aggregate" if split[r.name] else ""
        )
        if r.name in stopped:
            mark = f" — **stopped** ({stopped[r.name]}): not run, by the ladder's stop rule"
        lines += ["", f"### {r.name}{mark}", "",
                  f"{r.family}, memory {r.memory or '–'} steps; budget {r.budget:,} env steps (cap), evaluations every "
                  f"{r.eval_every:,}; random {r.low:g}, max {r.high:g}.{plateau_text(r, by_cell)}", ""]  # fmt: skip
        rows = []
        for e in table:
            row = []
            for fn in (final, auc):
                for v in cp.VARIANTS:
                    recs = by_cell.get((r.name, e.name, v), [])
                    untuned_only = v == cp.TUNED and not isinstance(tuned.get(e.name), cp.Tuned)
                    why = "untuned only" if e.name in cp.CANDIDATE_NAMES else "not tuned yet"
                    row.append(why if untuned_only and not recs else _cell([fn(x) for x in recs], seeds))
            rows.append([f"`{e.name}`", *row])
        lines += markdown_table(VARIANT_COLUMNS, rows)
    return lines


def aggregate_lines(aggs: dict[str, Any], table: Sequence[Encoder]) -> list[str]:
    lines = ["## Per task family (rliable)", "",
             "IQM [95 % CI] over seeds x the family's separating tasks, of the normalized final score and the "
             "normalized AUC; an (encoder, variant) enters with the seeds finished on every such task."]  # fmt: skip
    for family, entry in aggs.items():
        lines += ["", f"### {family}", ""]
        if not entry["tasks"]:
            lines.append("No separating task with finished runs yet.")
            continue
        lines += [f"Tasks: {', '.join(entry['tasks'])}.", ""]
        rows = []
        for e in table:
            row = []
            for metric in ("final", "auc"):
                for v in cp.VARIANTS:
                    x = entry[metric].get(f"{e.name} ({v})")
                    row.append("–" if x is None else f"{x[0]:.2f} [{x[1]:.2f}, {x[2]:.2f}]")
            rows.append([f"`{e.name}`", *row])
        lines += markdown_table(VARIANT_COLUMNS, rows)
    return lines


def markdown(found: Sequence[dict[str, Any]], table: Sequence[Encoder], tuned: dict[str, Any], command: str,
             aggs: dict[str, Any], stages: Sequence[str] = (), candidates: Sequence[Encoder] = ()) -> str:  # fmt: skip
    """The page; ``stages``: the screening and probe sections (:mod:`~experiments.encoder_study.sections`);
    ``candidates``: untuned-only rows after the encoders (:data:`~experiments.encoder_study.plan.CANDIDATES`)."""
    n_tuned = sum(isinstance(tuned.get(e.name), cp.Tuned) for e in table)
    per_rung = protocol_runs_per_rung(len(table), len(candidates))
    stopped = stopped_rungs(found, {r.name: per_rung for r in cp.RUNGS})
    expected = (len(cp.RUNGS) - len(stopped)) * per_rung
    rows = [*table, *candidates]
    complete = len(found) >= expected and n_tuned == len(table)
    by_cell, unseparated = cells(found), frozenset(t for t, why in separation(found).items() if why)
    settled = settled_rungs(found, per_rung) if n_tuned == len(table) else frozenset()
    shown = (  # the candidate-default decision, when the candidate defaults are in the study
        [*cc.candidate_lines(by_cell, REPS, unseparated, frozenset(stopped), settled), ""]
        if candidates
        else []
    )
    status = ("Complete" if complete else f"PARTIAL: {len(found)} of {expected} runs finished; {n_tuned} of "
              f"{len(table)} encoders tuned")  # fmt: skip
    lines = [
        "# Encoder study: attention variants as PPO policy encoders",
        "",
        f"**{status}.** Generated by `{command}` from the run records (`{RECORDS}`) and the tuning results "
        f"(`{TUNING}`); method: `experiments/encoder_study/plan.py`, design and cost: "
        "[encoder_study.md](../encoder_study.md). Runs: `python -m experiments.encoder_study.run` (resumable; "
        "`--dry-run` prints the cost).",
        "",
        "Two stages and a probe: the **screening** stage (every encoder untuned at one small budget, "
        "summarized below), the **confirmation** stage (this page's runs: 11 encoders tuned "
        "with the same budget and untuned, on a memory-length ladder) and the **memory probe** (what each "
        "encoder can remember under a supervised loss, below). The verdict comes first.",
        "",
        f"Protocol: {len(table)} encoders (the study's parameter-matched rows; sizes of the tuned rows: see "
        "Parameters) x {len(cp.RUNGS)} tasks x 2 variants "
        f"(`{cp.UNTUNED}`: defaults; `{cp.TUNED}`: the tuning study's best parameters, a reach knob below a rung's "
        f"memory k raised to k + 1) x seeds {list(cp.SEEDS)}. "
        f"Every run and every tuning trial anneals the learning rate over the same {cp.ANNEAL_HORIZON:,} env steps, "
        "whatever its budget (`--ppo.anneal-horizon`), so budgets do not change the schedule. PPO otherwise at "
        "its defaults (32 envs x 64 steps); 16 greedy evaluation episodes every budget / 16 steps.",
        "",
        *verdict_lines(by_cell, [e.name for e in rows], REPS, unseparated, frozenset(stopped)),
        "",
        *shown,
        *aggregate_lines(aggs, rows),
        "",
        *tuning_lines(table, tuned),
        *candidate_lines(candidates),
        "",
        *parameter_lines(found, table, candidates),
        "",
        *task_lines(found, rows, tuned, stopped),
        "",
        *stages,
        "",
        "## Provenance",
        "",
        machines_text(found),
        "",
        code_text(found),
        "",
    ]
    return "\n".join(lines)


def write_report(found: Sequence[dict[str, Any]], table: Sequence[Encoder], tuned: dict[str, Any], docs: Path,
                 command: str, candidates: Sequence[Encoder] = ()) -> None:  # fmt: skip
    docs.mkdir(parents=True, exist_ok=True)
    aggs = family_aggregates(found)
    atomic_write_json(docs / RECORDS, [public(r) for r in found], indent=1)
    stages = [*screening_lines(docs), "", *probe_lines(docs)]
    atomic_write_text(docs / PAGE, markdown(found, table, tuned, command, aggs, stages, candidates))
