"""Run the Decision Transformer on offline T-Maze corridors, one compact JSON record per (corridor, seed).

Each run is ``scripts/train_dt.py`` with ``full`` attention and the whole episode in context (K = L + 1 steps,
3(L + 1) tokens, windows aligned to the episode start) under :data:`RECIPE`; the record keeps the config, the
success rate and mean return of every evaluation (50 greedy episodes at target return 1), the commit, the
machine and the command. Records of the experiment need a clean tree (the records folder aside): a run from
uncommitted code does not count. Existing records are kept (the run is resumable by rerunning the command).

    python -m experiments.offline_tmaze_dt.run --corridors 10 50 200   # each corridor's test seeds
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from experiments._driver import checked_commit, train_dt, write_record

HERE = Path(__file__).resolve().parent
RECORDS = HERE / "records"
DATASET = "rlt/tmaze-{L}/mixed-e0-r20-v0"
DATASET_COMMAND = (
    "python scripts/make_memory_dataset.py --task tmaze --memory-lengths 10 50 200 --random-share 0.2 "
    "--root datasets/minari"
)
RECIPE_FILE = HERE / "recipe.json"
"""The shipped recipe (data, read by this script and by tests/algos/test_dt_tmaze_learns.py): the backbone
(the offline memory table's DT: ``full``, d = 64, 2 layers, 1 head, no dropout) and the backbone fields that
differ at one corridor, the DT flags besides the context, budget and seed, the updates per corridor length and
the evaluations per run (evenly spaced, the last at the end of the budget)."""
_RECIPE = json.loads(RECIPE_FILE.read_text())
BACKBONE: dict[str, Any] = _RECIPE["backbone"]
BACKBONE_BY_CORRIDOR = {int(k): dict(v) for k, v in _RECIPE.get("backbone_by_corridor", {}).items()}
RECIPE: dict[str, Any] = _RECIPE["dt"]
BUDGET = {int(k): int(v) for k, v in _RECIPE["budget"].items()}
TEST_SEEDS = {int(k): [int(s) for s in v] for k, v in _RECIPE["test_seeds"].items()}
"""The test seeds of each corridor: 0-9, but 10-19 at corridor 10, whose budget was raised after its seeds 0-9
had run (those runs: ``superseded/``)."""
EVALUATIONS = int(_RECIPE["evaluations"])


def backbone_of(length: int) -> dict[str, Any]:
    """The backbone of corridor ``length``: :data:`BACKBONE` with that corridor's own fields."""
    return {**BACKBONE, **BACKBONE_BY_CORRIDOR.get(length, {})}


def settings_of(length: int, seed: int, overrides: dict[str, Any]) -> dict[str, Any]:
    """Every ``train_dt.py`` setting of the run (corridor ``length``, ``seed``) with ``overrides`` applied."""
    budget = int(overrides.pop("total_steps", BUDGET[length]))
    settings = {
        "dataset": DATASET.format(L=length),
        "context_len": length + 1,
        **RECIPE,
        "total_steps": budget,
        "eval_every": max(1, budget // EVALUATIONS),
        "seed": seed,
        **{f"backbone.{k}": v for k, v in backbone_of(length).items()},
    }
    settings.update(overrides)
    return settings


def curve(run_dir: Path) -> list[dict[str, float]]:
    """[{step, success, return}] of each evaluation at the first target, in step order."""
    points = []
    for path in (run_dir / "eval").glob("step_*.json"):
        data = json.loads(path.read_text())
        episodes = data["episodes"][0]
        successes = [bool(x) for x in episodes["successes"]]
        returns = [float(x) for x in episodes["returns"]]
        points.append(
            {
                "step": int(data["step"]),
                "success": round(sum(successes) / len(successes), 4),
                "return": round(sum(returns) / len(returns), 4),
            }
        )
    return sorted(points, key=lambda p: p["step"])


def run_one(length: int, seed: int, args: argparse.Namespace, overrides: dict[str, Any]) -> Path:
    """Train one run and write its record; returns the record path (an existing one is kept)."""
    out = Path(args.records) / f"L{length}" / f"s{seed}.json"
    if out.exists():
        return out
    commit, dirty = checked_commit(Path(args.records), args.allow_dirty)
    settings = settings_of(length, seed, dict(overrides))
    run_root = Path(args.runs) / f"L{length}" / f"s{seed}"
    run_dir, wall, resumed = train_dt(
        settings, args.dataset_root, run_root, Path(args.runs) / f"L{length}-s{seed}.log"
    )
    points = curve(run_dir)
    fields = {
        "corridor": length,
        "seed": seed,
        "settings": settings,
        "final_success": points[-1]["success"],
        "final_return": points[-1]["return"],
        "curve": points,
    }
    return write_record(out, fields, settings, wall, commit, dirty, resumed)


def parse_override(text: str) -> tuple[str, Any]:
    key, _, value = text.partition("=")
    if not value:
        raise argparse.ArgumentTypeError(f"--set takes key=value, got {text!r}")
    return key, json.loads(value) if value[0] in "0123456789-[" or value in ("true", "false") else value


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--corridors", type=int, nargs="+", default=sorted(BUDGET), choices=sorted(BUDGET))
    parser.add_argument(
        "--seeds", type=int, nargs="+", help="seeds to run (default: each corridor's test seeds, recipe.json)"
    )
    parser.add_argument(
        "--records", default=str(RECORDS), help="where records go: <records>/L<L>/s<seed>.json"
    )
    parser.add_argument("--runs", default="runs/offline_tmaze_dt", help="run directories and logs")
    parser.add_argument("--dataset-root", default="datasets/minari")
    parser.add_argument("--set", type=parse_override, action="append", default=[], help="tuning: key=value")
    parser.add_argument("--allow-dirty", action="store_true", help="tuning only: run from uncommitted code")
    args = parser.parse_args()
    Path(args.runs).mkdir(parents=True, exist_ok=True)
    for length in args.corridors:
        for seed in args.seeds or TEST_SEEDS[length]:
            path = run_one(length, seed, args, dict(args.set))
            record = json.loads(path.read_text())
            print(
                f"L={length} seed={seed} success={record['final_success']} wall={record['wall_s']}s",
                flush=True,
            )


if __name__ == "__main__":
    main()
