"""Reading Decision Transformer / BC run directories for a results table (:mod:`.offline_table`).

A run directory gives its algorithm, dataset and seed (``config.json``), every episode's return per target of
an evaluation (``eval/step_<n>.json``, the newest unless a step is asked for), the dataset's reference scores
(its newest readable checkpoint, read with ``weights_only=True``) and its provenance (``system_info.json``).
Everything is read as data (JSON, safe torch loading); malformed files raise :class:`UserError` naming them.

Runs are grouped by algorithm, dataset and every config field that can change a result: seeds of one
experiment share a row, and runs that differ in anything else (``--bc-top-fraction``, ``--dataset-root``, the
backbone, the budget) get rows of their own, labelled by the fields that differ (``variant``). Within one
experiment every seed must have been evaluated at the same step (a shorter one is an unfinished run).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import warnings
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rl_transformers.agents.run_listing import missing_run_message
from rl_transformers.runs.checkpoint_load import InvalidCheckpointError, latest_checkpoint, read_checkpoint
from rl_transformers.runs.provenance import read_invocations
from rl_transformers.utils.errors import UserError

__all__ = ["NOT_EXPERIMENT", "OFFLINE_ALGOS", "OfflineRun", "collect_runs", "read_run"]

OFFLINE_ALGOS = ("dt", "bc")
_STEP_FILE = re.compile(r"^step_(\d+)\.json$")
NOT_EXPERIMENT = frozenset(
    {"seed", "run_root", "resume", "trust_checkpoint", "allow_env_modules", "device", "threads", "verbose",
     "progress", "log_every", "save_every", "keep_checkpoints"}
)  # fmt: skip
"""Config fields that do not change a result: runs differing only in these (and the seed) share a row."""


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
    """(ref_min, ref_max) of the dataset, None when it has none (or no readable checkpoint)."""
    invocations: list[dict[str, Any]] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    """The config flattened to dotted keys, without the fields of :data:`NOT_EXPERIMENT`."""
    variant: str = ""
    """The settings in which this run differs from other runs of its algorithm and dataset ("" if none)."""


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
    try:
        info = read_checkpoint(ckpt_path).get("dataset")
    except InvalidCheckpointError as err:
        warnings.warn(f"{err}; its dataset references are left out", stacklevel=3)
        return None
    lo, hi = (
        (info.get("ref_min_score"), info.get("ref_max_score")) if isinstance(info, dict) else (None, None)
    )
    if lo is None or hi is None:
        return None
    try:
        refs = float(lo), float(hi)
    except (TypeError, ValueError):
        raise UserError(f"{ckpt_path}: reference scores {lo!r}, {hi!r} are not numbers") from None
    if not all(map(math.isfinite, refs)) or refs[1] <= refs[0]:
        raise UserError(f"{ckpt_path}: reference scores need ref_min < ref_max, got {refs}")
    return refs


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _config(run_dir: Path) -> dict[str, Any]:
    config = _read_json(run_dir / "config.json")
    if not isinstance(config, dict):
        raise UserError(f"{run_dir / 'config.json'}: expected a JSON object, got {type(config).__name__}")
    return config


def _invocations(run_dir: Path) -> list[dict[str, Any]]:
    try:
        return read_invocations(run_dir)
    except ValueError as err:
        warnings.warn(f"{err}; commit and machine not recorded for this run", stacklevel=3)
        return []


def read_run(run_dir: str | Path, step: int | None = None) -> OfflineRun:
    """One DT / BC run directory (``step``: its evaluation to read, default the newest)."""
    run_dir = Path(run_dir)
    config = _config(run_dir)
    algo = config.get("algo")
    if algo not in OFFLINE_ALGOS:
        raise UserError(f"{run_dir}: algo {algo!r} is not an offline run (expected one of {OFFLINE_ALGOS})")
    if not isinstance(config.get("seed"), int):
        raise UserError(f"{run_dir / 'config.json'}: no integer 'seed' (got {config.get('seed')!r})")
    step, path = _eval_file(run_dir, step)
    data = _read_json(path)
    try:
        returns = {
            (None if e["target"] is None else float(e["target"])): np.asarray(e["returns"], dtype=np.float64)
            for e in data["episodes"]
        }
        if not returns or any(r.ndim != 1 or r.size == 0 for r in returns.values()):
            raise ValueError("every target needs a non-empty list of returns")
    except (KeyError, TypeError, ValueError) as err:
        raise UserError(f"{path}: not an evaluation file ({err!r})") from None
    settings = {k: v for k, v in _flatten(config).items() if k.split(".")[0] not in NOT_EXPERIMENT}
    return OfflineRun(
        run_dir=run_dir,
        algo=algo,
        dataset=str(config.get("dataset")),
        seed=config["seed"],
        step=step,
        returns=returns,
        refs=_refs(run_dir),
        invocations=_invocations(run_dir),
        settings=settings,
    )


def _run_dirs(path: Path) -> list[Path]:
    """``path`` itself when it is a run directory, else every run directory below it (symlinks followed)."""
    if (path / "config.json").is_file():
        return [path]
    found = []
    for directory, subdirs, files in os.walk(path, followlinks=True):
        if "config.json" in files:
            found.append(Path(directory))
            subdirs.clear()  # a run directory holds no other run
    return sorted(found)


def _label(runs: list[OfflineRun]) -> list[OfflineRun]:
    """``runs`` (one algorithm and dataset) with ``variant`` set to the settings that differ between them."""
    keys = sorted({k for r in runs for k in r.settings})
    differ = [k for k in keys if len({json.dumps(r.settings.get(k), sort_keys=True) for r in runs}) > 1]
    return [
        dataclasses.replace(r, variant=", ".join(f"{k}={json.dumps(r.settings.get(k))}" for k in differ))
        for r in runs
    ]


def collect_runs(paths: Iterable[str | Path], step: int | None = None) -> list[OfflineRun]:
    """Every DT / BC run directory at or under ``paths`` (symlinked folders followed), sorted by (algorithm,
    dataset, variant, seed), with ``variant`` set. A run directory named directly must be a DT / BC run with
    an evaluation; one found below a folder with no evaluation yet is left out with a warning. Errors name the problem: two runs of one experiment and seed, seeds of one experiment
    evaluated at different steps, different reference scores for one dataset."""
    roots = [Path(p) for p in paths]
    chosen: dict[Path, Path] = {}
    for p in roots:
        if not p.exists():
            raise UserError(missing_run_message(p, "run directory"))  # lists the runs that exist
        direct = (p / "config.json").is_file()
        for run_dir in _run_dirs(p):
            config = _config(run_dir)
            if config.get("algo") in OFFLINE_ALGOS and (run_dir / "eval").is_dir():
                if direct or any(_STEP_FILE.match(f.name) for f in (run_dir / "eval").iterdir()):
                    chosen.setdefault(run_dir.resolve(), run_dir)
                else:
                    warnings.warn(
                        f"{run_dir}: no evaluation yet (a run in progress?); left out", stacklevel=2
                    )
            elif direct:
                why = (
                    "has no eval/ directory"
                    if config.get("algo") in OFFLINE_ALGOS
                    else "is not a DT / BC run"
                )
                raise UserError(f"{p} {why} (algo {config.get('algo')!r})")
    if not chosen:
        raise UserError(f"no DT / BC run with an eval/ directory under {[str(p) for p in roots]}")
    runs = [read_run(run_dir, step) for run_dir in sorted(chosen.values())]
    by_dataset: dict[tuple[str, str], list[OfflineRun]] = defaultdict(list)
    for r in runs:
        by_dataset[(r.algo, r.dataset)].append(r)
    labelled = [r for group in by_dataset.values() for r in _label(group)]
    experiments: dict[tuple[str, str, str], list[OfflineRun]] = defaultdict(list)
    for r in labelled:
        experiments[(r.algo, r.dataset, r.variant)].append(r)
    for (algo, dataset, variant), group in experiments.items():
        name = f"{algo} {dataset}" + (f" ({variant})" if variant else "")
        seen: dict[int, Path] = {}
        for r in group:
            if r.seed in seen:
                raise UserError(f"two {name} runs with seed {r.seed}: {seen[r.seed]} and {r.run_dir}")
            seen[r.seed] = r.run_dir
        steps = {r.step: r.run_dir for r in group}
        if len(steps) > 1:
            where = ", ".join(f"{s} ({d})" for s, d in sorted(steps.items()))
            raise UserError(
                f"the {name} seeds were last evaluated at different steps: {where}; an unfinished run? "
                "Pass --step N to read one step of every run, or leave the unfinished run out"
            )
        refs = {r.refs for r in group if r.refs is not None}
        if len(refs) > 1:
            raise UserError(f"the {name} runs store different reference scores {sorted(refs)}")
    return sorted(labelled, key=lambda r: (r.algo, r.dataset, r.variant, r.seed))
