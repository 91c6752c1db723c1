"""Run the Decision Transformer and behaviour cloning on the reduced-scale Hopper ``medium-replay`` dataset, one
compact JSON record per (arm, seed).

Each run is ``scripts/train_dt.py --algo <arm>`` under :data:`RECIPE` (the reduced-scale recipe of
docs/results/offline.md: d = 64, 3 layers, K = 20, batch 64, 6,000 updates, one evaluation of 100 episodes
after the last update; the DT at target return 1,400, BC without a target). The record keeps the settings, the
mean return and D4RL normalized score of that evaluation, the number of episodes, the wall time, the commit, the
machine and the command. Records of the experiment need a clean tree (the records folder aside): a run from
uncommitted code does not count. Existing records are kept (the run is resumable by rerunning the command).
Runs go one at a time, one torch thread each; run two drivers side by side for the two arms.

    python -m experiments.offline_hopper.run --arms dt      # seeds 0-9 (recipe.json)
    python -m experiments.offline_hopper.run --arms bc
    python -m experiments.offline_hopper.run --describe-dataset      # records/dataset.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from experiments._driver import checked_commit, train_dt, write_record
from rl_transformers.utils.atomic import atomic_write_json

HERE = Path(__file__).resolve().parent
RECORDS = HERE / "records"
RECIPE_FILE = HERE / "recipe.json"
"""The shipped recipe (data): the dataset, the backbone, the flags every arm shares, each arm's own flags and the
default seeds."""
_RECIPE = json.loads(RECIPE_FILE.read_text())
DATASET: str = _RECIPE["dataset"]
BACKBONE: dict[str, Any] = _RECIPE["backbone"]
RECIPE: dict[str, Any] = _RECIPE["common"]
ARMS: dict[str, dict[str, Any]] = _RECIPE["arms"]
SEEDS: list[int] = [int(s) for s in _RECIPE["seeds"]]
DATASET_COMMAND = (
    "python scripts/make_dataset.py --env-id Hopper-v5 --root datasets/minari --seed 0 --total-timesteps 400000 "
    "--medium-return 1400 --eval-freq 5000 --n-eval-episodes 10 --kinds random medium medium-replay "
    "--num-steps 200000 --policy-dir runs/experiments/make_dataset/Hopper-v5/s0"
)


def settings_of(arm: str, seed: int) -> dict[str, Any]:
    """Every ``train_dt.py`` setting of the run (``arm`` "dt" or "bc", ``seed``)."""
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}: expected one of {sorted(ARMS)}")
    return {
        "algo": arm,
        "dataset": DATASET,
        **RECIPE,
        **ARMS[arm],
        "seed": seed,
        **{f"backbone.{k}": v for k, v in BACKBONE.items()},
    }


def final_evaluation(run_dir: Path) -> dict[str, Any]:
    """The run's last evaluation (``eval/step_<n>.json``, the dataset references from its checkpoint): step,
    target, episodes, mean return and normalized score."""
    from offline_data.scores import normalized_score, reference_scores
    from rl_transformers.agents.offline_runs import read_run

    run = read_run(run_dir)
    ((target, returns),) = run.returns.items()  # one target (the DT's) or none (BC)
    ref_min, ref_max = run.refs if run.refs is not None else reference_scores(run.dataset)
    mean = float(returns.mean())
    return {
        "step": run.step,
        "target": target,
        "episodes": int(returns.size),
        "mean_return": round(mean, 4),
        "normalized_score": round(float(normalized_score(mean, ref_min, ref_max)), 4),
        "ref_min": ref_min,
        "ref_max": ref_max,
    }


def run_one(arm: str, seed: int, args: argparse.Namespace) -> Path:
    """Train one run and write its record; returns the record path (an existing one is kept)."""
    out = Path(args.records) / arm / f"s{seed}.json"
    if out.exists():
        return out
    commit, dirty = checked_commit(Path(args.records), args.allow_dirty)
    settings = settings_of(arm, seed)
    run_root = Path(args.runs) / arm / f"s{seed}"
    run_dir, wall, resumed = train_dt(
        settings, args.dataset_root, run_root, Path(args.runs) / f"{arm}-s{seed}.log"
    )
    fields = {
        "arm": arm,
        "seed": seed,
        "settings": settings,
        **final_evaluation(run_dir),
    }
    return write_record(out, fields, settings, wall, commit, dirty, resumed)


def describe(returns: list[float], steps: int, ref_min: float, ref_max: float) -> dict[str, Any]:
    """The dataset statistics of episodes with these ``returns`` (and ``steps`` steps in all)."""
    from offline_data.scores import normalized_score

    mean = statistics.fmean(returns)
    return {
        "episodes": len(returns),
        "steps": steps,
        "mean_return": round(mean, 4),
        "min_return": round(min(returns), 4),
        "median_return": round(statistics.median(returns), 4),
        "max_return": round(max(returns), 4),
        "normalized_mean": round(float(normalized_score(mean, ref_min, ref_max)), 4),
        "ref_min": ref_min,
        "ref_max": ref_max,
    }


def describe_dataset(args: argparse.Namespace) -> Path:
    """Write ``<records>/dataset.json``: the statistics of :data:`DATASET` read with
    ``offline_data.load_episodes``, and the command that built it."""
    from offline_data import load_episodes
    from offline_data.scores import reference_scores

    episodes, info = load_episodes(DATASET, root=args.dataset_root, check_env=False)
    ref_min, ref_max = reference_scores(info)
    returns = [float(e.rewards.sum()) for e in episodes]
    record = {
        "dataset": DATASET,
        **describe(returns, sum(len(e.rewards) for e in episodes), ref_min, ref_max),
        "build_command": DATASET_COMMAND,
    }
    out = Path(args.records) / "dataset.json"
    atomic_write_json(out, record, indent=1)  # a kill leaves the old record or none, never half of one
    return out


def parser() -> argparse.ArgumentParser:
    out = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    out.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    out.add_argument("--seeds", type=int, nargs="+", default=SEEDS)
    out.add_argument("--records", default=str(RECORDS), help="where records go: <records>/<arm>/s<seed>.json")
    out.add_argument("--runs", default="runs/offline_hopper", help="run directories and logs")
    out.add_argument("--dataset-root", default="datasets/minari")
    out.add_argument("--allow-dirty", action="store_true", help="tuning only: run from uncommitted code")
    out.add_argument(
        "--describe-dataset", action="store_true", help="write <records>/dataset.json and train nothing"
    )
    return out


def main() -> None:
    args = parser().parse_args()
    if args.describe_dataset:
        print(f"wrote {describe_dataset(args)}")
        return
    Path(args.runs).mkdir(parents=True, exist_ok=True)
    for arm in args.arms:
        for seed in args.seeds:
            record = json.loads(run_one(arm, seed, args).read_text())
            print(
                f"{arm} seed={seed} return={record['mean_return']:.1f} "
                f"normalized={record['normalized_score']:.1f} wall={record['wall_s']}s",
                flush=True,
            )


if __name__ == "__main__":
    main()
