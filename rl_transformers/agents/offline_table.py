"""The results table of a set of Decision Transformer / BC runs, rebuilt from their run directories.

``docs/results/offline.md`` reports, per (algorithm, dataset, target return), each seed's mean return over an
evaluation's episodes, the mean over seeds with a 95 % confidence interval (Student t over the seed means,
n − 1 degrees of freedom), the D4RL normalized score with the same interval, and Spearman's ρ between the
targets and the achieved returns when a run was evaluated at three or more targets. This module computes all
of it from what the runs wrote (read by :mod:`.offline_runs`), so a table is one command away from its runs:
``python scripts/offline_table.py runs/experiments/hopper``. Statistics come from ``scipy.stats`` (``t.ppf``,
``spearmanr``); nothing here re-derives them.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from rl_transformers.agents.offline_runs import OfflineRun
from rl_transformers.utils.extras import need

__all__ = ["Row", "render_markdown", "spearman_rows", "summarize", "to_json"]


@dataclass(frozen=True)
class Row:
    """One (algorithm, dataset, target) line of the table."""

    algo: str
    dataset: str
    variant: str
    target: float | None
    per_seed: dict[int, float]
    mean: float
    ci: float | None
    """Half-width of the 95 % t interval over the seed means (None with one seed)."""
    normalized: float | None
    normalized_ci: float | None


def _interval(values: Sequence[float]) -> float | None:
    need("scipy", "the table's confidence interval")
    from scipy import stats

    if len(values) < 2:
        return None
    sem = float(np.std(values, ddof=1)) / math.sqrt(len(values))
    return float(stats.t.ppf(0.975, len(values) - 1)) * sem


def summarize(runs: Sequence[OfflineRun]) -> list[Row]:
    """The table's rows: one per (algorithm, dataset, variant, target), targets in evaluation order."""
    groups: dict[tuple[str, str, str, float | None], dict[int, float]] = defaultdict(dict)
    refs: dict[tuple[str, str, str], tuple[float, float]] = {}
    for r in runs:
        if r.refs is not None:
            refs[(r.algo, r.dataset, r.variant)] = r.refs
        for target, returns in r.returns.items():
            groups[(r.algo, r.dataset, r.variant, target)][r.seed] = float(returns.mean())
    rows = []
    for (algo, dataset, variant, target), per_seed in groups.items():
        values = [per_seed[s] for s in sorted(per_seed)]
        mean, ci = float(np.mean(values)), _interval(values)
        ref = refs.get((algo, dataset, variant))
        scale = None if ref is None else 100.0 / (ref[1] - ref[0])
        rows.append(
            Row(
                algo=algo,
                dataset=dataset,
                variant=variant,
                target=target,
                per_seed=dict(sorted(per_seed.items())),
                mean=mean,
                ci=ci,
                normalized=None if ref is None or scale is None else (mean - ref[0]) * scale,
                normalized_ci=None if ci is None or scale is None else ci * scale,
            )
        )
    return rows


def _rho(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's ρ of x and y (``scipy.stats.spearmanr``); None when it is undefined (a constant side)."""
    need("scipy", "Spearman's rho")
    from scipy import stats

    if len(set(x)) < 2 or len(set(y)) < 2:
        return None
    return float(stats.spearmanr(x, y).statistic)


def spearman_rows(
    rows: Sequence[Row], runs: Sequence[OfflineRun]
) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Spearman ρ between targets and achieved mean returns, for each (algorithm, dataset, variant) evaluated
    at three or more targets: on the seed means (``"mean"``) and per seed (``"per_seed"``); None where ρ is
    undefined (every achieved return equal)."""
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    by: dict[tuple[str, str, str], list[Row]] = defaultdict(list)
    for row in rows:
        if row.target is not None:
            by[(row.algo, row.dataset, row.variant)].append(row)
    for key, group in by.items():
        if len(group) < 3:
            continue
        rho = _rho([cast(float, row.target) for row in group], [row.mean for row in group])
        per_seed = {}
        for run in runs:
            if (run.algo, run.dataset, run.variant) == key and len(run.returns) >= 3:
                ts = [t for t in run.returns if t is not None]
                per_seed[run.seed] = _rho(ts, [float(run.returns[t].mean()) for t in ts])
        out[key] = {"mean": rho, "per_seed": dict(sorted(per_seed.items()))}
    return out


def _num(x: float | None, digits: int = 1) -> str:
    if x is None:
        return "—"
    text = f"{x:,.{digits}f}"
    return text.replace("-", "−")


def _rho_text(rho: float | None) -> str:
    return "undefined" if rho is None else f"{rho:.2f}"


def _pm(mean: float | None, ci: float | None) -> str:
    return _num(mean) if ci is None else f"{_num(mean)} ± {_num(ci)}"


def provenance_text(runs: Sequence[OfflineRun]) -> str:
    """The commits (of every invocation, resumes included), machines and torch versions the runs recorded,
    and how many runs recorded none."""
    records = [i for r in runs for i in r.invocations]
    missing = sum(1 for r in runs if not r.invocations)
    commits = sorted({str(i.get("git_sha") or "not a git checkout") for i in records})
    machines = sorted(
        {f"{i.get('device_name')}, {i.get('cores')} cores, torch {i.get('torch_version')}" for i in records}
    )
    parts = []
    if records:

        def short(c: str) -> str:
            return c if c == "not a git checkout" else c[:7] + ("-dirty" if c.endswith("-dirty") else "")

        parts.append("commit " + ", ".join(f"`{short(c)}`" for c in commits))
        parts.append("machine " + "; ".join(machines))
    if missing:
        parts.append(
            f"{missing} of {len(runs)} runs predate system_info.json: commit and machine not recorded"
        )
    return "; ".join(parts)


def render_markdown(runs: Sequence[OfflineRun], command: str | None = None) -> str:
    """The table (one row per algorithm, dataset and target; a column per seed), then ρ and provenance."""
    rows = summarize(runs)
    seeds = sorted({s for row in rows for s in row.per_seed})
    head = ["run", "target", *(f"seed {s}" for s in seeds), "mean ± 95 % CI", "normalized"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
    for row in rows:
        cells = [
            f"{row.algo.upper()} {row.dataset}" + (f" ({row.variant})" if row.variant else ""),
            "—" if row.target is None else _num(row.target),
            *(_num(row.per_seed.get(s)) for s in seeds),
            _pm(row.mean, row.ci),
            _pm(row.normalized, row.normalized_ci),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    rhos = spearman_rows(rows, runs)
    for (algo, dataset, variant), rho in rhos.items():
        seeds_text = " / ".join(_rho_text(v) for v in rho["per_seed"].values())
        name = f"{algo.upper()} {dataset}" + (f" ({variant})" if variant else "")
        text += f"\nSpearman ρ ({name}, targets vs achieved): **{_rho_text(rho['mean'])}** on the "
        text += f"seed means; per seed {seeds_text}.\n"
    steps = sorted({r.step for r in runs})
    episodes = sorted({len(v) for r in runs for v in r.returns.values()})
    text += (
        f"\n{len(runs)} runs; evaluation at step {', '.join(map(str, steps))}, "
        f"{', '.join(map(str, episodes))} episodes per target; {provenance_text(runs)}.\n"
    )
    if command:
        text += f"\n```bash\n{command}\n```\n"
    return text


def to_json(runs: Sequence[OfflineRun]) -> dict[str, Any]:
    """The rows, ρ values and per-run provenance as plain JSON data."""
    rows = summarize(runs)
    return {
        "rows": [row.__dict__ | {"per_seed": {str(k): v for k, v in row.per_seed.items()}} for row in rows],
        "spearman": [
            {"algo": a, "dataset": d, "variant": v, "mean": rho["mean"]}
            | {"per_seed": {str(s): x for s, x in rho["per_seed"].items()}}
            for (a, d, v), rho in spearman_rows(rows, runs).items()
        ],
        "runs": [
            {
                "run_dir": str(r.run_dir),
                "algo": r.algo,
                "dataset": r.dataset,
                "variant": r.variant,
                "seed": r.seed,
                "step": r.step,
                "git_sha": sorted({str(i.get("git_sha")) for i in r.invocations}) or None,
            }
            for r in runs
        ],
    }
