"""The offline memory table's documents: ``offline_memory.json`` (one record per run), ``offline_memory.md`` and
``plots/offline_memory.png`` (success vs corridor length, one line per row) / ``plots/offline_memory_speed.png``
(updates/s vs context tokens).

Built only from the finished records, so a rebuild says the same thing. A cell of the success table is the
interquartile mean over seeds with its 95 % stratified-bootstrap interval from ``rliable`` (Agarwal et al. 2021,
arXiv 2108.13264; :func:`~rl_transformers.study.aggregate.iqm_intervals`) where every seed finished, else the
mean of the seeds that did, marked with their count.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rl_transformers.study import offline_memory as om
from rl_transformers.study.aggregate import iqm_intervals
from rl_transformers.study.report import code_text, machines_text, public
from rl_transformers.utils.atomic import atomic_write_json, atomic_write_text
from rl_transformers.utils.tables import markdown_table

REPS = 2000


def success_of(record: dict[str, Any]) -> float | None:
    value = record.get("success")
    return float(value) if isinstance(value, int | float) else None


def first_found(record: dict[str, Any]) -> float | None:
    """The first evaluation (in updates) whose success reached :data:`SOLVED`, or None: a memoryless policy
    cannot reach it (at most the larger cue share, 0.56), so it marks a run that found the cue at some point."""
    for update, value in record.get("success_curve") or []:
        if value >= SOLVED:
            return float(update)
    return None


def cells(found: Sequence[dict[str, Any]]) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """Records by (row name, corridor length)."""
    out: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in found:
        out.setdefault((r["encoder_name"], int(r["task"].removeprefix("TMaze"))), []).append(r)
    return out


def table_data(found: Sequence[dict[str, Any]], table: Sequence[om.Row]) -> dict[str, Any]:
    """Per row and length: seeds, success values, IQM and CI (all seeds done), mean, updates/s, parameters."""
    by_cell = cells(found)
    data: dict[str, Any] = {}
    for length in om.LENGTHS:
        complete = {
            row.name: np.array([[success_of(r)] for r in by_cell[(row.name, length)]], dtype=np.float64)
            for row in table
            if len(by_cell.get((row.name, length), [])) == len(om.SEEDS)
            and all(success_of(r) is not None for r in by_cell[(row.name, length)])
        }
        intervals = iqm_intervals(complete, reps=REPS)
        for row in table:
            recs = sorted(by_cell.get((row.name, length), []), key=lambda r: r["seed"])
            values = [v for r in recs if (v := success_of(r)) is not None]
            entry: dict[str, Any] = {
                "seeds": [r["seed"] for r in recs],
                "success": values,
                "first_found": [first_found(r) for r in recs],
            }
            if values:
                entry["mean"] = statistics.fmean(values)
                entry["updates_per_s"] = statistics.median(float(r["updates_per_s"]) for r in recs)
                entry["parameters"] = recs[0].get("parameters")
                entry["context_len"] = row.dt_args(length)["context_len"]
            if row.name in intervals:
                entry["iqm"], entry["ci_low"], entry["ci_high"] = intervals[row.name]
            data.setdefault(row.name, {})[str(length)] = entry
    return data


SOLVED = 0.9
"""A run with at least this success rate counts as solved (the cell's ``n/3 solved``)."""


def cell_text(entry: dict[str, Any]) -> str:
    """IQM [CI] when every seed finished, else the mean of those that did; then how many seeds solved it."""
    if "mean" not in entry:
        return "–"
    solved = f"{sum(v >= SOLVED for v in entry['success'])}/{len(entry['success'])} solved"
    if "iqm" in entry:
        return f"{entry['iqm']:.2f} [{entry['ci_low']:.2f}, {entry['ci_high']:.2f}] · {solved}"
    return f"{entry['mean']:.2f} · {solved} ({len(entry['success'])} of {len(om.SEEDS)} seeds)"


def found_text(entry: dict[str, Any]) -> str:
    """How many seeds found the cue at some evaluation, the median first update, and how many kept it."""
    if "mean" not in entry:
        return "–"
    firsts = [f for f in entry["first_found"] if f is not None]
    kept = sum(v >= SOLVED for v in entry["success"])
    text = f"{len(firsts)}/{len(entry['success'])}"
    if firsts:
        text += f" · first at {statistics.median(firsts):,.0f} · kept {kept}/{len(firsts)}"
    return text


def found_table(table: Sequence[om.Row], data: dict[str, Any]) -> list[str]:
    """Per row and length: seeds that found the cue at some evaluation (see :func:`first_found`)."""
    return length_table(table, data, found_text, family=False)


def memoryless_scores(episodes: int, seed: int = 1_000_000) -> tuple[float, float]:
    """Success of the two policies that ignore the cue (always north, always south) on the evaluation episodes
    (the DT trainer resets episode i with ``eval_seed + i``; the cue is the first observation's sign)."""
    import gymnasium as gym

    import envs  # noqa: F401  (registers rlt/ ids)

    env = gym.make("rlt/TMaze-v0", corridor_length=1)  # the cue draw does not depend on the corridor length
    north = sum(float(env.reset(seed=seed + i)[0][0]) > 0 for i in range(episodes))
    env.close()
    return north / episodes, (episodes - north) / episodes


def success_table(table: Sequence[om.Row], data: dict[str, Any]) -> list[str]:
    """The success table's lines: one row per table row, one column per corridor length."""
    return length_table(table, data, cell_text, family=True)


def length_table(
    table: Sequence[om.Row], data: dict[str, Any], cell: Callable[[dict[str, Any]], str], family: bool
) -> list[str]:
    """A Markdown table with one row per table row (and its family) and ``cell`` of each corridor length."""
    headers = ["row", *(["family"] if family else []), *(f"L = {n}" for n in om.LENGTHS)]
    rows = [
        [
            f"`{row.name}`",
            *([row.family] if family else []),
            *(cell(data[row.name][str(n)]) for n in om.LENGTHS),
        ]
        for row in table
    ]
    return markdown_table(headers, rows)


def speed_cells(row: om.Row, data: dict[str, Any]) -> list[str]:
    """A row's context K at each corridor length, then its median updates/s there ("–": no finished run)."""
    ks = [str(row.dt_args(n)["context_len"]) for n in om.LENGTHS]
    entries = [data[row.name][str(n)] for n in om.LENGTHS]
    return ks + [f"{e['updates_per_s']:.2f}" if "updates_per_s" in e else "–" for e in entries]


def markdown(found: Sequence[dict[str, Any]], table: Sequence[om.Row], data: dict[str, Any], command: str,
             plots: list[str]) -> str:  # fmt: skip
    expected = len(table) * len(om.LENGTHS) * len(om.SEEDS)
    north, south = memoryless_scores(om.RECIPE["eval_episodes"])
    status = "Complete" if len(found) >= expected else f"PARTIAL: {len(found)} of {expected} runs finished"
    lines = [
        "# Offline memory: the Decision Transformer on T-Maze corridors",
        "",
        f"**{status}.** Generated by `{command}` from the run records (`offline_memory.json`; method: "
        "`rl_transformers/study/offline_memory.py`). Runs: `python -m experiments.offline_memory.run` (resumable; "
        "`--dry-run` prints the cost).",
        "",
        f"Data: `{om.DATASET_COMMAND}` (500 episodes per corridor length L, 80 % oracle, 20 % uniform random). "
        f"The cue of t = 0 decides the arm at t = L; a policy that ignores it succeeds in {north:.2f} (always "
        f"north) or {south:.2f} (always south) of the evaluation episodes. "
        f"A cell: IQM [CI] and how many seeds solved it (success ≥ {SOLVED}). Score: the **success rate** of "
        f"{om.RECIPE['eval_episodes']} greedy episodes at target return 1 after the whole budget "
        f"({', '.join(f'{om.BUDGET[n]:,} updates at L = {n}' for n in om.LENGTHS)}), seeds {list(om.SEEDS)}. "
        "A cell is the interquartile mean over the seeds with its 95 % stratified-bootstrap CI (`rliable`), or "
        "the mean of the seeds finished so far. Same recipe for every row: "
        + ", ".join(f"`{k}` {v}" for k, v in om.RECIPE.items())
        + ", backbone dropout 0; d = 64, 2 layers, 1 head (the study's DT, parameter-matched to `full`).",
        "",
        "Rows: **attention** — every causal attention with its default options and K = L + 1 (the whole "
        f"episode, 3(L + 1) tokens); **memory** — `full` with K_s = ⌈(L + 1)/{om.SEGMENTS}⌉ and "
        f"{om.SEGMENTS} segments, the memory carried across them in training and rollout (RATE, Cherepanov et "
        "al. 2023, arXiv 2306.09459); **floor** — `full` with K = K_s and no memory: the cue is out of its "
        "context at the junction. Windowed attentions whose layers × window is shorter than 3(L + 1) tokens "
        'cannot reach the cue (docs/offline_memory.md, "Reach with default options"): the table shows where '
        "each row stops working.",
        "",
        *[f"![{p}](plots/{p})" for p in plots],
        "",
        "## Success rate",
        "",
        *success_table(table, data),
        "",
        "## Found the cue at some evaluation",
        "",
        f"Seeds whose success reached {SOLVED} at any of the 4 evaluations (a policy that ignores the cue cannot: "
        f"at most {max(north, south):.2f}), the median update of the first such evaluation, and how many of them "
        "still held it at the end (the table above). A row that finds the cue and loses it can carry it; the "
        "recipe's constant learning rate after warm-up does not keep it there.",
        "",
        *found_table(table, data),
    ]
    lines += [
        "",
        "## Speed per context",
        "",
        "Updates/s of each run (median over its seeds; evaluations included; one torch thread, measured while "
        "another run shared the machine: indicative, comparable only within a column). The side-by-side "
        'measurement on an idle machine is in benchmarks/README.md ("DT at long context").',
        "",
        *markdown_table(
            ["row", *(f"K at L = {n}" for n in om.LENGTHS), *(f"L = {n}" for n in om.LENGTHS)],
            [[f"`{row.name}`", *speed_cells(row, data)] for row in table],
        ),
    ]
    lines += ["", "## Provenance", "", machines_text(found), "", code_text(found), ""]
    return "\n".join(lines)


def plot(data: dict[str, Any], table: Sequence[om.Row], plots_dir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots_dir.mkdir(parents=True, exist_ok=True)
    names = []
    styles = {"attention": "-", "memory": "--", "floor": ":"}
    for fname, key, xlabel, ylabel in (
        ("offline_memory.png", "mean", "corridor length L", "success rate (mean over seeds)"),
        ("offline_memory_speed.png", "updates_per_s", "context K (steps)", "updates/s (indicative)"),
    ):
        fig, ax = plt.subplots(figsize=(8, 5))
        drawn = False
        for row in table:
            pts = [
                (row.dt_args(n)["context_len"] if key == "updates_per_s" else n, e[key])
                for n in om.LENGTHS
                if key in (e := data[row.name][str(n)])
            ]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.plot(xs, ys, styles[row.family], marker="o", label=row.name, linewidth=1)
                drawn = True
        ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if drawn:
            ax.legend(fontsize=6, ncol=3)
        fig.tight_layout()
        tmp = plots_dir / f".{fname}.tmp.png"
        fig.savefig(tmp, dpi=80, metadata={"Software": None})
        plt.close(fig)
        tmp.replace(plots_dir / fname)
        names.append(fname)
    return names


def write_report(found: Sequence[dict[str, Any]], table: Sequence[om.Row], docs: Path, command: str) -> None:
    docs.mkdir(parents=True, exist_ok=True)
    data = table_data(found, table)
    plots = plot(data, table, docs / "plots")
    atomic_write_json(docs / "offline_memory.json", [public(r) for r in found], indent=1)
    atomic_write_text(docs / "offline_memory.md", markdown(found, table, data, command, plots))


def study_section(docs: Path) -> list[str]:
    """The encoder study's summary of the offline memory table in ``docs`` (its main offline tasks): success per
    row and corridor length from the committed records; empty when the table has no record yet."""
    from rl_transformers.study.records import read_committed

    path = Path(docs) / "offline_memory.json"
    if not path.exists():
        return []
    found = read_committed(path)
    if not found:
        return []
    table = om.rows()
    data = table_data(found, table)
    lines = [
        "### Main tasks: offline memory (T-Maze corridors)",
        "",
        f"Success rate at target return 1 ({len(found)} runs; IQM [95 % CI] over seeds, or the mean of the seeds "
        "finished so far); method, speed per context and plots: [offline_memory.md](offline_memory.md). "
        "CartPole and Pendulum below are the control rows: they need no memory.",
        "",
        *success_table(table, data),
        "",
        "Seeds that found the cue at some evaluation (success ≥ 0.9, which a memoryless policy cannot reach), "
        "and how many of them kept it to the end:",
        "",
        *found_table(table, data),
    ]
    return [*lines, "", "### Control tasks", ""]
