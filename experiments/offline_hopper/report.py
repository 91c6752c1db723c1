"""Write docs/results/offline_hopper.md from the committed run records (``records/``).

The page: the dataset's statistics (``records/dataset.json``); per arm (DT, BC) the seeds, every seed's
normalized score, the mean return, the interquartile mean of the normalized scores with its 95 %
stratified-bootstrap CI (``rliable`` through :func:`rl_transformers.study.aggregate.iqm_intervals`); the exact
permutation test of DT > BC (:func:`rl_transformers.study.peer_report.exact_permutation_p`); the verdict on the
target (the DT's normalized score beats BC's with CIs apart, at least :data:`MIN_SEEDS` seeds), computed from
those numbers; the commits, machines and commands. Nothing but the records goes in, so the page is rebuilt byte
for byte from them (tests/experiments/test_offline_hopper.py; ``--check`` compares without writing).

    python -m experiments.offline_hopper.report
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

from rl_transformers.study.aggregate import iqm_intervals
from rl_transformers.study.peer_report import exact_permutation_p, load_records
from rl_transformers.utils.atomic import atomic_write_text
from rl_transformers.utils.tables import markdown_table

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PAGE = ROOT / "docs" / "results" / "offline_hopper.md"
PREAMBLE = HERE / "preamble.md"
RECORDS = HERE / "records"
ARMS = ("dt", "bc")
LABELS = {"dt": "DT (target 1,400)", "bc": "BC"}
MIN_SEEDS = 5
"""The target needs at least this many seeds per arm."""


def one_sided_p(dt: list[float], bc: list[float]) -> tuple[float, str]:
    """(p, how it is read) of the exact one-sided permutation test of mean(DT) > mean(BC).

    The library's test is two-sided. With equal group sizes, swapping the groups maps every split's difference
    d to −d, so the permutation distribution is symmetric and the one-sided p is exactly half the two-sided one
    when the observed difference is positive; otherwise it is at least 0.5. With unequal sizes the two-sided p
    is an upper bound of the one-sided one."""
    two_sided = exact_permutation_p(dt, bc)
    if statistics.fmean(dt) <= statistics.fmean(bc):
        return 0.5, "≥"
    if len(dt) == len(bc):
        return two_sided / 2, "="
    return two_sided, "≤"


def intervals(runs: dict[str, list[dict[str, Any]]]) -> dict[str, tuple[float, float, float]]:
    """{arm: (IQM, CI low, CI high)} of the seeds' normalized scores."""
    scores = {
        arm: np.array([[r["normalized_score"]] for r in rs], dtype=float) for arm, rs in runs.items() if rs
    }
    return iqm_intervals(scores)


def verdict(runs: dict[str, list[dict[str, Any]]], cis: dict[str, tuple[float, float, float]]) -> str:
    """Whether the DT's normalized score beats BC's with the CIs apart (DT's lower bound above BC's upper
    bound) on at least :data:`MIN_SEEDS` seeds per arm."""
    seeds = {arm: len(runs.get(arm, [])) for arm in ARMS}
    if min(seeds.values()) < MIN_SEEDS:
        have = ", ".join(f"{arm.upper()} {n}" for arm, n in seeds.items())
        return f"**not decided**: seeds per arm {have}; the target needs ≥ {MIN_SEEDS}"
    (dt_iqm, dt_lo, _), (bc_iqm, _, bc_hi) = cis["dt"], cis["bc"]
    if dt_lo > bc_hi:
        return f"**met**: DT's CI lower bound {dt_lo:.1f} is above BC's upper bound {bc_hi:.1f}"
    relation = "above" if dt_iqm > bc_iqm else "not above"
    return (
        f"**not met**: DT's IQM {dt_iqm:.1f} is {relation} BC's {bc_iqm:.1f}, and DT's CI lower bound "
        f"{dt_lo:.1f} is not above BC's upper bound {bc_hi:.1f}"
    )


def dataset_rows(dataset: dict[str, Any] | None) -> list[str]:
    headers = ["dataset", "episodes", "steps", "mean return", "min", "median", "max", "normalized mean"]
    if dataset is None:
        return ["No dataset record yet (`python -m experiments.offline_hopper.run --describe-dataset`)."]
    cells = [f"`{dataset['dataset']}`", f"{dataset['episodes']:,}", f"{dataset['steps']:,}"]
    cells += [f"{dataset[k]:,.1f}" for k in ("mean_return", "min_return", "median_return", "max_return")]
    cells.append(f"{dataset['normalized_mean']:.1f}")
    return markdown_table(headers, [cells], "lrrrrrrr")


def arm_rows(runs: dict[str, list[dict[str, Any]]], cis: dict[str, tuple[float, float, float]]) -> list[str]:
    headers = ["arm", "seeds", "normalized score per seed", "mean return", "IQM normalized [95 % CI]"]
    rows = []
    for arm in ARMS:
        rs = runs.get(arm, [])
        if not rs:
            rows.append([LABELS[arm], "0", "–", "–", "–"])
            continue
        per_seed = " / ".join(f"{r['normalized_score']:.1f}" for r in rs)
        mean_return = statistics.fmean(r["mean_return"] for r in rs)
        iqm, lo, hi = cis[arm]
        seeds = ", ".join(str(r["seed"]) for r in rs)
        rows.append(
            [
                LABELS[arm],
                f"{len(rs)} ({seeds})",
                per_seed,
                f"{mean_return:,.1f}",
                f"{iqm:.1f} [{lo:.1f}, {hi:.1f}]",
            ]
        )
    return markdown_table(headers, rows, "llrrr")


def result(runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The arm table, the permutation test and the verdict."""
    cis = intervals(runs)
    lines = arm_rows(runs, cis)
    if all(runs.get(arm) for arm in ARMS):
        dt, bc = ([r["normalized_score"] for r in runs[arm]] for arm in ARMS)
        p, relation = one_sided_p(dt, bc)
        lines += [
            "",
            f"Exact one-sided permutation test of DT > BC (mean normalized score): p {relation} {p:.3g}.",
        ]
    lines += [
        "",
        f"**Target** (DT's normalized score beats BC's with CIs apart, ≥ {MIN_SEEDS} seeds): {verdict(runs, cis)}.",
    ]
    return lines


def provenance(runs: dict[str, list[dict[str, Any]]], dataset: dict[str, Any] | None) -> list[str]:
    records = [r for arm in ARMS for r in runs.get(arm, [])]
    lines = []
    for arm in ARMS:
        commits = sorted({r["commit"][:12] for r in runs.get(arm, [])})
        if commits:
            lines.append(f"- {LABELS[arm]} commit{'s' if len(commits) > 1 else ''}: `{'`, `'.join(commits)}`")
    dirty = sum(bool(r["dirty"]) for r in records)
    lines.append(f"- records from a tree with uncommitted changes: {dirty} of {len(records)}")
    lines += [f"- machine: {m}" for m in sorted({r["machine"] for r in records})]
    if records:
        walls = [r["wall_s"] for r in records]
        lines.append(f"- wall time per run: {min(walls):.0f}-{max(walls):.0f} s (one torch thread)")
    lines += ["", "```bash"]
    if dataset is not None:
        lines.append(f"OMP_NUM_THREADS=1 {dataset['build_command']}")
    lines.append("python -m experiments.offline_hopper.run --describe-dataset")
    lines += [f"python -m experiments.offline_hopper.run --arms {arm}" for arm in ARMS]
    lines += ["python -m experiments.offline_hopper.report", "```"]
    for arm in ARMS:
        if runs.get(arm):
            lines += ["", f"Command of one {LABELS[arm]} run (each record holds its own):", "", "```bash"]
            lines += [runs[arm][0]["command"], "```"]
    return lines


def render(records: Path = RECORDS, preamble: Path = PREAMBLE) -> str:
    runs = load_records(records)
    dataset_file = records / "dataset.json"
    dataset = json.loads(dataset_file.read_text()) if dataset_file.exists() else None
    parts = [preamble.read_text().rstrip("\n"), "", "## Dataset", "", *dataset_rows(dataset)]
    parts += ["", "## Result", "", *result(runs)]
    parts += ["", "## Provenance", "", *provenance(runs, dataset)]
    return "\n".join(parts) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--page", type=Path, default=PAGE)
    parser.add_argument("--check", action="store_true", help="exit 1 when the page differs from the records'")
    args = parser.parse_args()
    text = render()
    if args.check:
        same = args.page.exists() and args.page.read_text() == text
        print(f"{args.page} is {'up to date' if same else 'out of date'}")
        sys.exit(0 if same else 1)
    atomic_write_text(args.page, text)
    print(f"wrote {args.page}")


if __name__ == "__main__":
    main()
