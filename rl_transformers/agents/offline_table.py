"""The results table of a set of Decision Transformer / BC runs, rebuilt from their run directories.

``docs/results/offline.md`` reports, per (algorithm, dataset, target return), each seed's mean return over the
final evaluation's episodes, the mean over seeds with a 95 % confidence interval (Student t over the seed
means, n − 1 degrees of freedom), the D4RL normalized score with the same interval, and Spearman's ρ between
the targets and the achieved returns when a run was evaluated at three or more targets. This module computes
all of it from what the runs wrote, so a table is one command away from its runs
(``python scripts/offline_table.py runs/experiments/hopper``):

- ``config.json``: algorithm, dataset and seed;
- ``eval/step_<n>.json``: every episode's return per target (the newest step, or ``step=`` for another);
- ``checkpoints/*.pt`` (read with ``weights_only=True``): the dataset's reference scores;
- ``system_info.json``: the commit, machine and command of each invocation ("not recorded" for runs older
  than that file).

Statistics come from ``scipy.stats`` (``t.ppf``, ``spearmanr``); nothing here re-derives them.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rl_transformers.utils.checkpoint import latest_checkpoint, read_checkpoint
from rl_transformers.utils.errors import UserError
from rl_transformers.utils.provenance import read_invocations

__all__ = ["OfflineRun", "Row", "collect_runs", "render_markdown", "spearman_rows", "summarize"]

OFFLINE_ALGOS = ("dt", "bc")
_STEP_FILE = re.compile(r"^step_(\d+)\.json$")


@dataclass(frozen=True)
class OfflineRun:
    """What one DT / BC run directory says about its evaluation at ``step``."""

    run_dir: Path
    algo: str
    dataset: str
    seed: int
    step: int
    returns: dict[float | None, np.ndarray]
    """Episode returns per target (None: BC, which takes no target)."""
    refs: tuple[float, float] | None
    """(ref_min, ref_max) of the dataset, None when it has none."""
    invocations: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Row:
    """One (algorithm, dataset, target) line of the table."""

    algo: str
    dataset: str
    target: float | None
    per_seed: dict[int, float]
    mean: float
    ci: float | None
    """Half-width of the 95 % t interval over the seed means (None with one seed)."""
    normalized: float | None
    normalized_ci: float | None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserError(f"{path}: cannot read it as JSON ({err})") from None


def _eval_file(run_dir: Path, step: int | None) -> tuple[int, Path]:
    files = {
        int(m.group(1)): p for p in (run_dir / "eval").glob("step_*.json") if (m := _STEP_FILE.match(p.name))
    }
    if not files:
        raise UserError(f"{run_dir}: no eval/step_<n>.json (did the run evaluate? see --eval-every)")
    if step is None:
        step = max(files)
    if step not in files:
        raise UserError(f"{run_dir}: no evaluation at step {step}; it has steps {sorted(files)}")
    return step, files[step]


def _refs(run_dir: Path) -> tuple[float, float] | None:
    ckpt_path = latest_checkpoint(run_dir)
    if ckpt_path is None:
        return None
    info = read_checkpoint(ckpt_path).get("dataset") or {}
    lo, hi = info.get("ref_min_score"), info.get("ref_max_score")
    return None if lo is None or hi is None else (float(lo), float(hi))


def read_run(run_dir: str | Path, step: int | None = None) -> OfflineRun:
    """One DT / BC run directory (``step``: its evaluation to read, default the newest)."""
    run_dir = Path(run_dir)
    config = _read_json(run_dir / "config.json")
    algo = config.get("algo")
    if algo not in OFFLINE_ALGOS:
        raise UserError(f"{run_dir}: algo {algo!r} is not an offline run (expected one of {OFFLINE_ALGOS})")
    step, path = _eval_file(run_dir, step)
    data = _read_json(path)
    try:
        returns = {
            (None if e["target"] is None else float(e["target"])): np.asarray(e["returns"], dtype=np.float64)
            for e in data["episodes"]
        }
    except (KeyError, TypeError, ValueError) as err:
        raise UserError(f"{path}: not an evaluation file ({err!r})") from None
    return OfflineRun(
        run_dir=run_dir,
        algo=algo,
        dataset=str(config.get("dataset")),
        seed=int(config["seed"]),
        step=step,
        returns=returns,
        refs=_refs(run_dir),
        invocations=read_invocations(run_dir),
    )


def collect_runs(paths: Iterable[str | Path], step: int | None = None) -> list[OfflineRun]:
    """Every DT / BC run directory at or under ``paths`` (a directory with ``config.json`` and ``eval/``),
    sorted by (algorithm, dataset, seed). Two runs of the same (algorithm, dataset, seed) are an error naming
    both (pass the one you mean)."""
    found: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise UserError(f"{p}: no such run directory")
        candidates = (
            [p] if (p / "config.json").is_file() else sorted(c.parent for c in p.rglob("config.json"))
        )
        found += [c for c in candidates if (c / "eval").is_dir()]
    runs = []
    for run_dir in sorted(set(found)):
        config = _read_json(run_dir / "config.json")
        if config.get("algo") in OFFLINE_ALGOS:
            runs.append(read_run(run_dir, step))
    if not runs:
        raise UserError(f"no DT / BC run with an eval/ directory under {[str(p) for p in paths]}")
    seen: dict[tuple[str, str, int], Path] = {}
    for r in runs:
        key = (r.algo, r.dataset, r.seed)
        if key in seen:
            raise UserError(
                f"two {r.algo} runs of {r.dataset} with seed {r.seed}: {seen[key]} and {r.run_dir}"
            )
        seen[key] = r.run_dir
    return sorted(runs, key=lambda r: (r.algo, r.dataset, r.seed))


def _interval(values: Sequence[float]) -> float | None:
    from scipy import stats

    if len(values) < 2:
        return None
    sem = float(np.std(values, ddof=1)) / math.sqrt(len(values))
    return float(stats.t.ppf(0.975, len(values) - 1)) * sem


def summarize(runs: Sequence[OfflineRun]) -> list[Row]:
    """The table's rows: one per (algorithm, dataset, target), targets in each run's evaluation order."""
    groups: dict[tuple[str, str, float | None], dict[int, float]] = defaultdict(dict)
    refs: dict[tuple[str, str], tuple[float, float] | None] = {}
    for r in runs:
        refs[(r.algo, r.dataset)] = r.refs
        for target, returns in r.returns.items():
            groups[(r.algo, r.dataset, target)][r.seed] = float(returns.mean())
    rows = []
    for (algo, dataset, target), per_seed in groups.items():
        values = [per_seed[s] for s in sorted(per_seed)]
        mean, ci = float(np.mean(values)), _interval(values)
        ref = refs[(algo, dataset)]
        scale = None if ref is None else 100.0 / (ref[1] - ref[0])
        rows.append(
            Row(
                algo=algo,
                dataset=dataset,
                target=target,
                per_seed=dict(sorted(per_seed.items())),
                mean=mean,
                ci=ci,
                normalized=None if ref is None or scale is None else (mean - ref[0]) * scale,
                normalized_ci=None if ci is None or scale is None else ci * scale,
            )
        )
    return rows


def spearman_rows(rows: Sequence[Row], runs: Sequence[OfflineRun]) -> dict[tuple[str, str], dict[str, Any]]:
    """Spearman ρ between targets and achieved mean returns, for each (algorithm, dataset) evaluated at three
    or more targets: on the seed means (``"mean"``) and per seed (``"per_seed"``)."""
    from scipy import stats

    out: dict[tuple[str, str], dict[str, Any]] = {}
    by: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for row in rows:
        if row.target is not None:
            by[(row.algo, row.dataset)].append(row)
    for key, group in by.items():
        if len(group) < 3:
            continue
        targets = [row.target for row in group]
        rho = float(stats.spearmanr(targets, [row.mean for row in group]).statistic)
        per_seed = {}
        for run in runs:
            if (run.algo, run.dataset) == key and len(run.returns) >= 3:
                ts = list(run.returns)
                achieved = [float(run.returns[t].mean()) for t in ts]
                per_seed[run.seed] = float(stats.spearmanr(ts, achieved).statistic)
        out[key] = {"mean": rho, "per_seed": dict(sorted(per_seed.items()))}
    return out


def _num(x: float | None, digits: int = 1) -> str:
    if x is None:
        return "—"
    text = f"{x:,.{digits}f}"
    return text.replace("-", "−")


def _pm(mean: float | None, ci: float | None) -> str:
    return _num(mean) if ci is None else f"{_num(mean)} ± {_num(ci)}"


def provenance_text(runs: Sequence[OfflineRun]) -> str:
    """Commits, machines and torch versions of the runs' first invocations (or how many did not record)."""
    firsts = [r.invocations[0] for r in runs if r.invocations]
    missing = len(runs) - len(firsts)
    commits = sorted({str(i.get("git_sha")) for i in firsts})
    machines = sorted(
        {f"{i.get('device_name')}, {i.get('cores')} cores, torch {i.get('torch_version')}" for i in firsts}
    )
    parts = []
    if commits:
        parts.append(
            "commit " + ", ".join(f"`{c[:7]}{'-dirty' if c.endswith('-dirty') else ''}`" for c in commits)
        )
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
            f"{row.algo.upper()} {row.dataset}",
            "—" if row.target is None else _num(row.target),
            *(_num(row.per_seed.get(s)) for s in seeds),
            _pm(row.mean, row.ci),
            _pm(row.normalized, row.normalized_ci),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    rhos = spearman_rows(rows, runs)
    for (algo, dataset), rho in rhos.items():
        seeds_text = " / ".join(f"{v:.2f}" for v in rho["per_seed"].values())
        text += f"\nSpearman ρ ({algo.upper()} {dataset}, targets vs achieved): **{rho['mean']:.2f}** on the "
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
            {"algo": a, "dataset": d, **{k: v for k, v in rho.items() if k != "per_seed"}}
            | {"per_seed": {str(s): v for s, v in rho["per_seed"].items()}}
            for (a, d), rho in spearman_rows(rows, runs).items()
        ],
        "runs": [
            {
                "run_dir": str(r.run_dir),
                "algo": r.algo,
                "dataset": r.dataset,
                "seed": r.seed,
                "step": r.step,
                "git_sha": r.invocations[0].get("git_sha") if r.invocations else None,
            }
            for r in runs
        ],
    }
