"""Write docs/results/offline_tmaze_dt.md from the committed run records (``records/`` and ``tuning/``).

The page: per corridor the solved count (final success >= :data:`SOLVED`), the interquartile mean of the final
success rates with its 95 % stratified-bootstrap CI (``rliable`` through
:func:`rl_transformers.study.aggregate.iqm_intervals`), every seed's final success, return and curve; the
tuning evidence (old and new recipe on the tuning seeds); the commands, commits and machines. Nothing but the
records goes in, so the page is rebuilt byte for byte from them (tests/experiments/test_offline_tmaze_dt.py).

    python -m experiments.offline_tmaze_dt.report
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from experiments.offline_tmaze_dt.run import TEST_SEEDS
from rl_transformers.study.aggregate import iqm_intervals

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PAGE = ROOT / "docs" / "results" / "offline_tmaze_dt.md"
SOLVED = 0.9
"""A run solves its corridor when its final success rate is at least this (a policy that ignores the cue
succeeds in about half of the episodes: 0.44 or 0.56 on the 50 evaluation episodes)."""
CORRIDORS = tuple(TEST_SEEDS)
PREAMBLE = HERE / "preamble.md"


def load(folder: Path) -> dict[int, list[dict[str, Any]]]:
    """{corridor: records sorted by seed} of ``<folder>/L<L>/s<seed>.json``."""
    out: dict[int, list[dict[str, Any]]] = {}
    for path in sorted(folder.glob("L*/s*.json")):
        record = json.loads(path.read_text())
        out.setdefault(int(record["corridor"]), []).append(record)
    return {k: sorted(v, key=lambda r: r["seed"]) for k, v in sorted(out.items())}


def first_solved(record: dict[str, Any]) -> int | None:
    """The first evaluation step with success >= :data:`SOLVED` (None: never)."""
    return next((p["step"] for p in record["curve"] if p["success"] >= SOLVED), None)


def summary_rows(runs: dict[int, list[dict[str, Any]]]) -> list[str]:
    finals = {L: np.array([[r["final_success"]] for r in rs], dtype=float) for L, rs in runs.items()}
    intervals = iqm_intervals({str(L): x for L, x in finals.items() if len(x) > 0})
    lines = [
        "| corridor L | K (tokens) | updates | seeds run | solved | IQM success [95 % CI] | mean return "
        "| median wall (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for L in CORRIDORS:
        rs = runs.get(L, [])
        if not rs:
            lines.append(f"| {L} | {L + 1} ({3 * (L + 1)}) | – | 0 / {len(TEST_SEEDS[L])} | – | – | – | – |")
            continue
        iqm, lo, hi = intervals[str(L)]
        solved = sum(r["final_success"] >= SOLVED for r in rs)
        updates = rs[0]["settings"]["total_steps"]
        mean_return = statistics.fmean(r["final_return"] for r in rs)
        whole = [r["wall_s"] for r in rs if not r.get("resumed_at")]  # a resumed run's is its last stretch's
        wall = f"{statistics.median(whole):.0f}" if whole else "–"
        lines.append(
            f"| {L} | {L + 1} ({3 * (L + 1)}) | {updates} | {len(rs)} / {len(TEST_SEEDS[L])} | **{solved} / {len(rs)}** "
            f"| {iqm:.2f} [{lo:.2f}, {hi:.2f}] | {mean_return:.2f} | {wall} |"
        )
    return lines


def seed_rows(runs: dict[int, list[dict[str, Any]]]) -> list[str]:
    lines = [
        "| L | seed | final success | final return | first ≥ 0.9 at | success at each evaluation |",
        "|---|---|---|---|---|---|",
    ]
    for L, rs in runs.items():
        for r in rs:
            first = first_solved(r)
            curve = " ".join(f"{p['success']:.2f}" for p in r["curve"])
            lines.append(
                f"| {L} | {r['seed']} | {r['final_success']:.2f} | {r['final_return']:.2f} "
                f"| {'never' if first is None else first} | {curve} |"
            )
    return lines


def seed_ranges(seeds: list[int]) -> str:
    """``[100, 101, 102, 105]`` as ``100-102, 105``."""
    spans: list[list[int]] = []
    for seed in sorted(seeds):
        if spans and seed == spans[-1][1] + 1:
            spans[-1][1] = seed
        else:
            spans.append([seed, seed])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


Folders = dict[str, dict[int, list[dict[str, Any]]]]
"""{recipe folder name: :func:`load` of it}, in name order."""


def load_folders(root: Path) -> Folders:
    """Every recipe folder under ``root`` (``tuning/``, ``superseded/``, ``diagnosis/``), each read once."""
    folders = sorted(p for p in root.iterdir() if p.is_dir()) if root.exists() else []
    return {folder.name: load(folder) for folder in folders}


def count_rows(folders: Folders) -> list[str]:
    """Per recipe (folder) and corridor: the runs, their seeds, how many found the cue (success >= 0.9 at some
    evaluation), held it at the end, and which never found it."""
    lines = [
        "| recipe | L | runs | seeds | found the cue | held at the end | never found it (seeds) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, runs in folders.items():
        for L, rs in runs.items():
            never = [r["seed"] for r in rs if first_solved(r) is None]
            held = sum(r["final_success"] >= SOLVED for r in rs)
            lines.append(
                f"| `{name}` | {L} | {len(rs)} | {seed_ranges([r['seed'] for r in rs])} | {len(rs) - len(never)} "
                f"| {held} | {len(never)}{f' ({seed_ranges(never)})' if never else ''} |"
            )
    return lines


COMPARISONS = (("heads2", "cosine_800", 10),)
"""(recipe, against, corridor): tuning folders whose rates of failing the corridor are compared."""


def comparison_lines(folders: Folders) -> list[str]:
    """For each of :data:`COMPARISONS` with runs on both sides: how many runs end below :data:`SOLVED` (never
    found the cue, or found and lost it) and the one-sided Fisher exact p that the first recipe's rate is the
    lower (scipy)."""
    from scipy.stats import fisher_exact

    lines = []
    for name, against, L in COMPARISONS:
        a, b = folders.get(name, {}).get(L, []), folders.get(against, {}).get(L, [])
        if not a or not b:
            continue
        failed_a = sum(r["final_success"] < SOLVED for r in a)
        failed_b = sum(r["final_success"] < SOLVED for r in b)
        table = [[failed_a, len(a) - failed_a], [failed_b, len(b) - failed_b]]
        p = float(fisher_exact(table, alternative="less").pvalue)
        lines.append(
            f"- corridor {L}: `{name}` ends below {SOLVED} in {failed_a} of {len(a)} runs, `{against}` in "
            f"{failed_b} of {len(b)}; one-sided Fisher exact test that `{name}`'s rate is the lower: p = {p:.3f} "
            "(the only comparison made, so no correction)"
        )
    return lines


def tuning_rows(folders: Folders) -> list[str]:
    """Per recipe (folder of ``tuning/``, ``superseded/`` or ``diagnosis/``), corridor and seed: the success at every evaluation,
    and whether the run found the cue at some evaluation and held it at the end."""
    lines = [
        "| recipe | L | seed | success at each evaluation | found (≥ 0.9 once) | held at the end |",
        "|---|---|---|---|---|---|",
    ]
    for name, runs in folders.items():
        for L, rs in runs.items():
            for r in rs:
                curve = " ".join(f"{p['success']:.2f}" for p in r["curve"])
                found = "yes" if first_solved(r) is not None else "no"
                held = "yes" if r["final_success"] >= SOLVED else "no"
                lines.append(f"| `{name}` | {L} | {r['seed']} | {curve} | {found} | {held} |")
    return lines


def missing(runs: dict[int, list[dict[str, Any]]]) -> list[str]:
    out = []
    for L in CORRIDORS:
        have = {r["seed"] for r in runs.get(L, [])}
        lost = [s for s in TEST_SEEDS[L] if s not in have]
        if lost:
            out.append(f"- corridor {L}: seeds {', '.join(map(str, lost))} not run.")
    return out


def provenance(runs: dict[int, list[dict[str, Any]]]) -> list[str]:
    records = [r for rs in runs.values() for r in rs]
    commits = sorted({r["commit"] for r in records})
    machines = sorted({r["machine"] for r in records})
    dirty = sum(bool(r["dirty"]) for r in records)
    lines = [f"- commit{'s' if len(commits) > 1 else ''}: {', '.join(f'`{c[:12]}`' for c in commits)}"]
    lines.append(f"- run from a tree with uncommitted changes: {dirty} of {len(records)} records")
    resumed = [
        f"L{r['corridor']} seed {r['seed']} at {r['resumed_at']}" for r in records if r.get("resumed_at")
    ]
    if resumed:  # killed midway and resumed from a checkpoint
        lines.append(
            f"- resumed from a checkpoint after a stop: {'; '.join(resumed)} (their wall time, the last "
            "stretch's, is left out of the Result table's median)"
        )
    lines += [f"- machine: {m}" for m in machines]
    lines.append(
        "- one torch thread per run (`OMP_NUM_THREADS=1`, `--threads 1`); runs at once: the Machine paragraph"
    )
    if records:
        lines += ["", "Command of one run (the records hold each run's own):", "", "```bash"]
        lines += [records[0]["command"], "```"]
    return lines


EXTRA_SECTIONS = (
    ("superseded", "Superseded test runs (an earlier recipe)"),
    ("diagnosis", "Test seeds that never found the cue, re-run under other settings (diagnosis, not tests)"),
)
"""Folders of runs beside the test (``<folder>/<name>/L<L>/s<seed>.json``) and their sections' titles."""


def render(
    records: Path = HERE / "records",
    tuning: Path = HERE / "tuning",
    preamble: Path = PREAMBLE,
    extra: Path = HERE,
) -> str:
    runs = load(records)
    parts = [preamble.read_text().rstrip("\n"), "", "## Result", ""]
    parts += summary_rows(runs)
    gaps = missing(runs)
    if gaps:
        parts += ["", "Not run:", "", *gaps]
    parts += ["", "## Every seed", "", *seed_rows(runs)]
    tuned = load_folders(tuning)
    parts += ["", "## Recipe evidence (tuning seeds, not the test seeds)", "", *count_rows(tuned)]
    compared = comparison_lines(tuned)
    if compared:
        parts += ["", *compared]
    parts += ["", "<details><summary>Every tuning run</summary>", "", *tuning_rows(tuned), "", "</details>"]
    for folder, title in EXTRA_SECTIONS:
        if (extra / folder).exists():
            parts += ["", f"## {title}", "", *tuning_rows(load_folders(extra / folder))]
    parts += ["", "## Provenance", "", *provenance(runs)]
    return "\n".join(parts) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--page", type=Path, default=PAGE)
    args = parser.parse_args()
    args.page.write_text(render())
    print(f"wrote {args.page}")


if __name__ == "__main__":
    main()
