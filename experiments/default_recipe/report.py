"""Write docs/results/default_recipe.md from committed run records: the transformer's default recipe beside each
task's entry as it stood before the default, the default alone on a task without an entry, the candidate that
was ruled out, and the screen on tuning seeds.

Each table compares arms on the same seeds: every seed's final greedy score, the seeds solved, the
interquartile mean with its 95 % stratified-bootstrap CI, and the exact two-sided permutation test of the
difference in means against the section's reference arm (:mod:`rl_transformers.study.peer_report`),
Holm-corrected over the tasks of the section. The records stay where their experiments keep them (the sections
below name the folders, relative to ``experiments/``); nothing but them and ``preamble.md`` goes in, so a clone
at any path rebuilds the page byte for byte (tests/experiments/test_default_recipe.py).

    python -m experiments.default_recipe.report
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl_transformers.study.peer_report import (
    ArmSummary,
    exact_permutation_p,
    holm,
    load_records,
    summarise,
    table,
)
from rl_transformers.utils.atomic import atomic_write_text
from rl_transformers.utils.tables import markdown_table

HERE = Path(__file__).resolve().parent
EXPERIMENTS = HERE.parent
PAGE = HERE.parents[1] / "docs" / "results" / "default_recipe.md"
SEEDS = 10
"""Seeds per arm for a claim; a table with fewer says so."""
ROPE = {"policy.backbone.position": "rope"}
SCALING = {"policy.norm_obs": True, "ppo.norm_reward": True}


@dataclass(frozen=True)
class Task:
    title: str
    solved: float
    arms: dict[str, str]
    """label -> records folder of one arm (relative to ``experiments/``); the first is the reference."""
    change: dict[str, Any] = field(default_factory=dict)
    """Flattened config values that the second arm sets and the first lacks; nothing else may differ."""
    paired: bool = True
    """Every arm runs only seeds of the reference arm (a test); False for a screen, whose arms ran what time
    allowed."""


@dataclass(frozen=True)
class Section:
    title: str
    text: str
    tasks: dict[str, Task]


SECTIONS = (
    Section(
        "The default beside each entry it changes, on the entry's test seeds",
        "`entry`: the task's entry before the default (its page's runs); `default`: that entry laid over the "
        "default, which is what the shipped file now gives the task.",
        {
            "cartpole_novel": Task(
                "CartPoleNoVel, 100,000 env steps",
                475.0,
                {
                    "entry": "peer_cartpole_novel/records/gtrxl_norm",
                    "default": "peer_cartpole_novel/records/gtrxl",
                },
                ROPE,
            ),
            "tmaze_alt_100": Task(
                "TMazeAltLong (corridor 100), 2,000,000 env steps",
                0.9,
                {
                    "entry": "memory_tasks/superseded/tmaze_alt_100_xl_relative/gtrxl",
                    "default": "memory_tasks/records/tmaze_alt_100/gtrxl",
                },
                ROPE,
            ),
        },
    ),
    Section(
        "The default alone, on a task without an entry",
        "`default`: the default recipe over the library's defaults (`make train`'s task and budget).",
        {
            "tmaze_10": Task(
                "TMaze (corridor 10, Ni et al.'s penalty), 300,000 env steps",
                0.9,
                {"default": "default_recipe/test/tmaze_10/gtrxl"},
            ),
        },
    ),
    Section(
        "Ruled out: rotary positions with observation and reward scaling, on the entry's test seeds",
        "`entry`: the RepeatPrevious entries (rotary positions; the same runs as "
        "[memory_tasks.md](memory_tasks.md)); `union`: the entry with observation and reward scaling added.",
        {
            "rp_easy": Task(
                "RepeatPreviousEasy (memory 4), 500,000 env steps",
                0.9,
                {
                    "entry": "memory_tasks/records/repeat_previous_easy/gtrxl",
                    "union": "default_recipe/union/rp_easy/gtrxl",
                },
                SCALING,
            ),
            "rp_medium": Task(
                "RepeatPreviousMedium (memory 32), 1,000,000 env steps",
                0.9,
                {
                    "entry": "memory_tasks/records/repeat_previous_medium/gtrxl",
                    "union": "default_recipe/union/rp_medium/gtrxl",
                },
                SCALING,
            ),
            "rp_hard": Task(
                "RepeatPreviousHard (memory 64), 1,000,000 env steps",
                0.9,
                {
                    "entry": "memory_tasks/records/repeat_previous_hard/gtrxl",
                    "union": "default_recipe/union/rp_hard/gtrxl",
                },
                SCALING,
            ),
        },
    ),
    Section(
        "The screen, on tuning seeds 100-104",
        "Before the test: `union` (each entry with whichever of rotary positions and observation and reward "
        "scaling it lacked) and, where they ran, the entry as it then stood, on tuning seeds (never a test seed).",
        {
            "screen_cartpole_novel": Task(
                "CartPoleNoVel (screen)",
                475.0,
                {
                    "entry": "default_recipe/screen/entry_cartpole_novel/gtrxl",
                    "union": "default_recipe/screen/defcand_cartpole_novel/gtrxl",
                },
                ROPE,
                paired=False,
            ),
            "screen_rp_easy": Task(
                "RepeatPreviousEasy (screen)",
                0.9,
                {"union": "default_recipe/screen/defcand_rp_easy/gtrxl"},
                paired=False,
            ),
            "screen_rp_medium": Task(
                "RepeatPreviousMedium (screen)",
                0.9,
                {
                    "entry": "default_recipe/screen/entry_rp_medium/gtrxl",
                    "union": "default_recipe/screen/defcand_rp_medium/gtrxl",
                },
                SCALING,
                paired=False,
            ),
            "screen_tmaze_alt_100": Task(
                "TMazeAltLong (screen)",
                0.9,
                {"union": "default_recipe/screen/defcand_tmaze_alt_100/gtrxl"},
                paired=False,
            ),
        },
    ),
)
TASKS = {key: task for section in SECTIONS for key, task in section.tasks.items()}


def arm_records(experiments: Path, folder: str) -> list[dict[str, Any]]:
    """The records of one arm folder (``<arm>/s<seed>.json``, its ``provenance.json`` filling gaps)."""
    path = experiments / folder
    return load_records(path.parent).get(path.name, []) if path.parent.exists() else []


def task_runs(experiments: Path, task: Task) -> dict[str, list[dict[str, Any]]]:
    """{label: records} of a task's arms that have records; a compared arm must run the reference's seeds."""
    runs = {label: arm_records(experiments, folder) for label, folder in task.arms.items()}
    reference, *others = task.arms
    expected = {int(r["seed"]) for r in runs[reference]}
    for label in others:
        extra = {int(r["seed"]) for r in runs[label]} - expected
        if task.paired and runs[reference] and extra:
            raise ValueError(f"{task.arms[label]}: seeds {sorted(extra)} are not the {reference} arm's seeds")
    return {label: rs for label, rs in runs.items() if rs}


def seed_span(seeds: list[int]) -> str:
    """ "10-19" for consecutive seeds, else the list."""
    if seeds == list(range(seeds[0], seeds[0] + len(seeds))):
        return f"{seeds[0]}-{seeds[-1]}"
    return ", ".join(map(str, seeds))


def count(summary: ArmSummary, threshold: float) -> int:
    return sum(m >= threshold for m in summary.means)


def overview(results: dict[str, tuple[Task, dict[str, ArmSummary]]]) -> list[str]:
    """One row per task compared: seeds solved per arm, the exact p and its Holm correction over the tasks."""
    raw = {k: exact_permutation_p(*(s.means for s in a.values())) for k, (_, a) in results.items()}
    adjusted = holm(raw)
    rows = []
    for key, (task, arms) in results.items():
        solved = [f"{label} {count(s, task.solved)} of {len(s.means)}" for label, s in arms.items()]
        rows.append([task.title, seed_span(next(iter(arms.values())).seeds), ", ".join(solved)])
        rows[-1] += [f"{raw[key]:.3g}", f"{adjusted[key]:.3g}"]
    n = len(raw)
    return markdown_table(["task", "seeds", "solved", "exact p", f"Holm p ({n} task{'s' * (n > 1)})"], rows)


def section(experiments: Path, part: Section) -> list[str]:
    """The section's heading and text, its overview where arms are compared on all seeds, then a table per task."""
    out, compared = [f"## {part.title}", part.text], {}
    for key, task in part.tasks.items():
        runs = task_runs(experiments, task)
        if not runs:
            out.append(f"{task.title}: no runs yet.")
            continue
        summaries = summarise(runs)
        reference = next(iter(task.arms))
        if len(runs) == len(task.arms) > 1 and all(len(s.seeds) >= SEEDS for s in summaries.values()):
            compared[key] = (task, summaries)
        short = [f"`{label}` {len(s.seeds)}" for label, s in summaries.items() if len(s.seeds) < SEEDS]
        out += [f"### {task.title}", "\n".join(table(summaries, task.solved, reference))]
        out += [f"Fewer than {SEEDS} seeds (not a claim): {', '.join(short)}."] if short else []
    if compared:
        out.insert(2, "\n".join(overview(compared)))
    return out


def render(experiments: Path, preamble: str) -> str:
    parts = [preamble.rstrip()]
    for part in SECTIONS:
        parts += section(experiments, part)
    return "\n\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--experiments", type=Path, default=EXPERIMENTS)
    parser.add_argument("--page", type=Path, default=PAGE)
    args = parser.parse_args(argv)
    preamble = (HERE / "preamble.md").read_text(encoding="utf-8")
    atomic_write_text(args.page, render(args.experiments, preamble))
    print(f"wrote {args.page}")


if __name__ == "__main__":
    main()
