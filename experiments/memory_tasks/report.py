"""Write docs/results/memory_tasks.md from the committed run records of ``records/<task>/<arm>/s<seed>.json``.

One table per task (POPGym's RepeatPrevious at memory 4, 32 and 64, T-Maze with AMAGO's recoverable penalty at
corridor 100): per arm every seed's final greedy score, the seeds solved (score >= :data:`SOLVED`), the
interquartile mean with its 95 % stratified-bootstrap CI and the
exact permutation test of every recurrent arm against the transformer, Holm-corrected
(:mod:`rl_transformers.study.peer_report`). Nothing but the records and ``preamble.md`` goes in, so a clone at
any path rebuilds the page byte for byte (tests/experiments/test_memory_tasks.py).

    python -m experiments.memory_tasks.report
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym

import envs  # noqa: F401  (registers the rlt/ ids)
from rl_transformers.study.peer_report import ArmSummary, load_records, replace_block, summarise, table
from rl_transformers.study.tuning_space import DEFAULT_REACH
from rl_transformers.tune.tuner import warmup_steps
from rl_transformers.utils.atomic import atomic_write_text

HERE = Path(__file__).resolve().parent
PAGE = HERE.parents[1] / "docs" / "results" / "memory_tasks.md"
SOLVED = 0.9
"""The final greedy mean return at which a seed counts as solved (each task's maximum is 1; random scores
-0.5 on RepeatPrevious, -0.75 on T-Maze; a policy that ignores the T-Maze cue scores 0)."""
REFERENCE = "gtrxl"
SEEDS = 10
"""Seeds per arm for a claim; a table with fewer says so under it."""
TASKS = {
    "repeat_previous_easy": "RepeatPreviousEasy (memory 4)",
    "repeat_previous_medium": "RepeatPreviousMedium (memory 32)",
    "repeat_previous_hard": "RepeatPreviousHard (memory 64)",
    "tmaze_alt_100": "TMazeAltLong (T-Maze corridor 100, recoverable penalty)",
}
"""Records folder -> section title, to which the records' budget is added (what precedes " (" names the task in the
README's line)."""
CURRICULA = {
    "tmaze_alt_400_curriculum": (
        "TMaze400 by curriculum (T-Maze corridor 400, recoverable penalty, XL memory of 512, 256 steps per env; "
        "stage 1: TMazeAltLong's recipe at corridor 100, 2,000,000 env steps; stage 2 from its final weights)"
    ),
    "tmaze_alt_400_curriculum_stop": (
        "TMaze400 by curriculum, stopped at 0.9 (T-Maze corridor 400, recoverable penalty, XL memory of 512, 256 "
        "steps per env; stage 1: TMazeAltLong's recipe at corridor 100, 2,000,000 env steps; stage 2 from its final "
        "weights, evaluated every 50,000 env steps over 16 greedy episodes, stopped once their mean reaches 0.9)"
    ),
}
"""Records folders of curricula -> section title: the final stage's records (``<arm>/s<seed>.json``) and, in
``stage1/transfer_<seed>.json``, ``transfer.py``'s rows of each seed's stage-1 policy (the budget of stage 2 is added)."""
README_BLOCK = "memory-tasks"
PROBES = {
    "tmaze_alt_400_probe": "Probe: TMazeAltVeryLong (T-Maze corridor 400, recoverable penalty)",
    "tmaze_alt_400_steps256": "Probe: TMazeAltVeryLong with 256 steps per env in an update",
    "tmaze_alt_400_knn": "Probe: TMazeAltVeryLong with a kNN memory (Memorizing Transformer), 256 steps per env",
    "tmaze_alt_400_knn_detached": "Probe: TMazeAltVeryLong with the kNN memory and a detached critic",
    "tmaze_alt_200": "Probe: T-Maze corridor 200 (TMazeAltLong's env at corridor_length 200), XL memory of 256",
    "tmaze_alt_300": "Probe: T-Maze corridor 300 (TMazeAltLong's env at corridor_length 300), XL memory of 384",
    "tmaze_alt_1000_probe": (
        "Probe: T-Maze corridor 1,000 by curriculum (corridor 100's recipe, then corridor 400, then 1,000, each "
        "from the last's final weights; at 1,000 an XL memory of 1,280, evaluated every 100,000 env steps and "
        "stopped at 0.9)"
    ),
}
"""Tuning folders of probes the page shows as tables (a task whose target was judged on a probe) -> title."""


def budgets(runs: dict[str, list[dict[str, Any]]]) -> str:
    """The runs' budgets (``--total-timesteps``), e.g. "2,000,000" or "500,000 / 1,000,000"."""
    return " / ".join(
        f"{b:,}" for b in sorted({r["config"]["total_timesteps"] for rs in runs.values() for r in rs})
    )


def task_summaries(records: Path) -> Iterator[tuple[str, dict[str, ArmSummary]]]:
    """(section title with the runs' budget, per-arm summaries) of each task of :data:`TASKS` that has records,
    in their order."""
    for folder, title in TASKS.items():
        if any((records / folder).glob("*/s*.json")):
            runs = load_records(records / folder)
            yield f"{title}, {budgets(runs)} env steps", summarise(runs)


def curriculum_summaries(records: Path) -> Iterator[tuple[str, str, dict[str, ArmSummary]]]:
    """(folder, section title with the last stage's budget, per-arm summaries) of each curriculum with records."""
    for folder, title in CURRICULA.items():
        if any((records / folder).glob("*/s*.json")):
            runs = load_records(records / folder)
            stops = any(r["config"].get("stop_at") is not None for rs in runs.values() for r in rs)
            budget = f"stage 2 {'at most ' if stops else ''}{budgets(runs)} env steps"
            yield folder, f"{title}, {budget}", summarise(runs)


def stage_table(folder: Path) -> list[str]:
    """Per seed: its stage-1 policy's greedy return at the corridor it trained on and, zero-shot, at the last
    stage's corridor (with the cue's arm probability at the junction), then the last stage's final return, the
    env steps it trained (fewer than its budget where ``--stop-at`` ended it) and the episodes they make: every
    T-Maze episode lasts L + 1 steps and holds one decision at the junction, the only one that reads the cue."""
    final = {run["seed"]: run for runs in load_records(folder).values() for run in runs}
    rows = [
        "| seed | stage 1 at its corridor | stage 1 zero-shot at the last corridor (p_cue) | final | env steps at the end"
        " | episodes (junction decisions) |",
        "|---|---|---|---|---|---|",
    ]
    files = {int(p.stem.removeprefix("transfer_")): p for p in (folder / "stage1").glob("transfer_*.json")}
    for seed, path in sorted(files.items()):
        (by_corridor,) = json.loads(path.read_text(encoding="utf-8")).values()  # one checkpoint per file
        trained = int(next(iter(by_corridor.values()))["trained_corridor"])
        own, last = by_corridor[str(trained)], by_corridor[max(by_corridor, key=int)]
        run = final.get(seed)
        score = (
            f"{sum(run['returns']) / len(run['returns']):.2f} | {run['total_timesteps']:,} | {episodes(run):,.0f}"
            if run
            else "– | – | –"
        )
        rows.append(
            f"| {seed} | {own['mean_return']:.2f} | {last['mean_return']:.2f} ({last['p_cue']:.2f}) | {score} |"
        )
    return rows


def episodes(run: dict[str, Any]) -> float:
    """The T-Maze episodes of a run's training: its env steps over the episode's L + 1 steps (L from the run's
    env kwargs over its env id's registered ones)."""
    kwargs = {**gym.spec(run["env_id"]).kwargs, **run["config"]["env_kwargs"]}
    return run["total_timesteps"] / (kwargs["corridor_length"] + 1)


def probe_sections(tuning: Path) -> Iterator[str]:
    """One section per folder of :data:`PROBES` with records: its table, marked as a probe, not a test."""
    for folder, title in PROBES.items():
        if any((tuning / folder).glob("*/s*.json")):
            runs = load_records(tuning / folder)
            stages = (
                "\n".join(stage_table(tuning / folder)) + "\n\n"
                if (tuning / folder / "stage1").is_dir()
                else ""
            )
            yield (
                f"## {title}, {budgets(runs)} env steps\n\n"
                + "\n".join(table(summarise(runs), SOLVED, REFERENCE, digits=2))
                + "\n\n"
                + stages
                + f"`tuning/{folder}/`: a probe, not a test; the text above says what its seeds show."
            )


def _span(bounds: list[float]) -> str:
    return f"{bounds[0]:g}–{bounds[1]:g}"


def _param(name: str, value: object) -> str:
    return f"{name} {value:.2e}" if isinstance(value, float) else f"{name} {value}"


def _study_row(study: dict[str, Any], best_file: Path) -> str:
    """One study's table row: its knob range, every complete trial's score, the pruned count, the best trial."""
    best = json.loads(best_file.read_text(encoding="utf-8"))
    done = [t for t in study["trials"] if t["state"] == "complete"]
    pruned = sum(t["state"] == "pruned" for t in study["trials"])
    params = ", ".join(_param(k, v) for k, v in best["params"].items())
    scores = " / ".join(f"{t['value']:.2f}" for t in done)
    knob = study["settings"]["space"]["knob"] or DEFAULT_REACH
    return (
        f"| {study['study']} | `{study['settings']['encoder']}` | {knob[0]}–{knob[1]} | {len(study['trials'])} | "
        f"{scores} | {pruned} | trial {best['trial']} ({best['value']:.2f}): {params} |"
    )


def tuning_tables(tuning: Path) -> Iterator[str]:
    """One section per Optuna tuning folder ``tuning/optuna_*/`` (its studies' ``trials.json`` and ``best.json``,
    written by ``scripts/tune.py``): every trial's score, how many were pruned, and the best trial's parameters."""
    for folder in sorted(tuning.glob("optuna_*")):
        studies = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(folder.glob("*/trials.json"))]
        if not studies:
            continue
        first = studies[0]["settings"]
        space = first["space"]
        warmup = warmup_steps(first["total_timesteps"], first["pruner_warmup_steps"])
        rows = [
            "| study | encoder | knob searched | trials | final greedy score per complete trial (trial order) | pruned "
            "| best |",
            "|---|---|---|---|---|---|---|",
        ]
        rows += [_study_row(study, folder / study["study"] / "best.json") for study in studies]
        for tested in sorted(folder.glob("seeds_*")):
            runs = load_records(tested)
            rows += [
                "",
                f"Each study's best trial trained on the test seeds {tested.name.split('_', 1)[1]} "
                f"(`{tested.name}/`; the arms' entries as they were then):",
                "",
                *table(summarise(runs), SOLVED, REFERENCE, digits=2),
            ]
        yield (
            f"## Optuna tuning: {first['env_id'].split('-')[1]}, {first['total_timesteps']:,} env steps per trial\n\n"
            f"`tuning/{folder.name}/`: per study, TPE sampling ({first['n_startup_trials']} random trials first, "
            f"sampler seed {first['sampler_seed']}), a median pruner acting from step {warmup:,}, {first['num_envs']} envs, "
            "a greedy evaluation of "
            f"{first['eval_episodes']} episodes every {first['eval_every']:,} steps; a trial scores its last one. "
            f"Searched: learning rate {_span(space['learning_rate'])}, entropy coefficient {_span(space['ent_coef'])} "
            f"(log-uniform), training window {space['seq_len']}, and the encoder's context knob (log-uniform integers: "
            "the XL memory of the GTrXL, the hidden size of the RNNs, whose range keeps the parameters within 10 % "
            "of the GTrXL's).\n\n" + "\n".join(rows)
        )


def section(title: str, summaries: dict[str, ArmSummary]) -> list[str]:
    """A task's heading and table, with a note under it while an arm has fewer than :data:`SEEDS` seeds."""
    parts = [f"## {title}", "\n".join(table(summaries, SOLVED, REFERENCE, digits=2))]
    short = [f"`{arm}` {len(s.seeds)}" for arm, s in summaries.items() if len(s.seeds) < SEEDS]
    if short:
        parts.append(
            f"**Partial**: seeds finished of {SEEDS}: {', '.join(short)}. No claim rests on this table until"
            " every arm has them all (the runs resume from the committed records)."
        )
    return parts


def render(records: Path, preamble: str) -> str:
    parts = [preamble.rstrip()]
    for title, summaries in task_summaries(records):
        parts += section(title, summaries)
    for folder, title, summaries in curriculum_summaries(records):
        parts += section(title, summaries)
        parts += [
            "Each seed's stages (`transfer.py`, 50 greedy episodes):",
            "\n".join(stage_table(records / folder)),
        ]
    parts += probe_sections(records.parent / "tuning")
    parts += tuning_tables(records.parent / "tuning")
    return "\n\n".join(parts) + "\n"


def readme_line(records: Path) -> str:
    """The README's summary: per task, each arm's seeds solved (and finished, where fewer than all)."""
    tasks: list[str] = []
    labels: list[str] = []
    curricula = [(title, summaries) for _, title, summaries in curriculum_summaries(records)]
    for title, summaries in [*task_summaries(records), *curricula]:
        label = title.split(" (")[0]
        shared = [seen for seen in labels if label.startswith(f"{seen}, ")]  # a variant: its difference only
        labels.append(label)
        arms = [
            f"{arm} {sum(m >= SOLVED for m in s.means)}"
            + (f" of {len(s.seeds)}" if len(s.seeds) < SEEDS else "")
            for arm, s in summaries.items()
        ]
        tasks.append(f"{label.removeprefix(f'{shared[0]}, ') if shared else label}: {', '.join(arms)}")
    return (
        f"**Memory tasks** ([memory_tasks.md](docs/results/memory_tasks.md), generated): seeds of {SEEDS} solved"
        f" (≥ {SOLVED}), task recipes applied; LSTM / GRU parameter-matched, tuned on Easy (at chance"
        " on Medium and Hard tuned too). " + "; ".join(tasks) + "."
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=Path, default=HERE / "records")
    parser.add_argument("--page", type=Path, default=PAGE)
    parser.add_argument("--readme", type=Path, default=HERE.parents[1] / "README.md")
    args = parser.parse_args(argv)
    atomic_write_text(args.page, render(args.records, (HERE / "preamble.md").read_text(encoding="utf-8")))
    text = args.readme.read_text(encoding="utf-8")
    atomic_write_text(args.readme, replace_block(text, README_BLOCK, readme_line(args.records)))
    print(f"wrote {args.page} and {args.readme}'s {README_BLOCK} block")


if __name__ == "__main__":
    main()
