"""The study's run records: job keys, validation against the job, the committed records and their restore.

A job's **key** (:func:`job_key`) is a hash of its ``job.json`` contents (task, encoder spec, seed, budget,
trainer settings). Nothing machine- or checkout-specific is in a job: the offline datasets' root is the relative
:data:`~rl_transformers.study.suite.DATASET_ROOT`, resolved against the checkout by the worker, so a clone at
another path computes the same keys and restores every committed record. Until the key migration (see
:func:`legacy_key_matches`) DT jobs held the absolute dataset root; a run directory of that time is still
recognised by its ``job.json``.

A **record** (``result.json``, one entry of a committed records file: ``encoders.json``, ``encoders_screening.json``) counts for a job only when :func:`problem` finds
nothing: same key, the job's algorithm, task, encoder, seed and preset, the whole budget run, a finite score and
well-formed numbers and curve, every return within the task's possible returns (:mod:`.ranges`), a git commit
that is one and a one-line machine text. Every record carries the machine (:func:`machine_text`) and the git commit
(``git_sha``) it ran at; records written before those fields existed say ``"unknown"`` in the published file.

:func:`restore` writes the committed records of a fresh checkout into its empty run directories and refuses, with
a message naming the record, a file that is not a JSON list of records, a record that contradicts its job and a
record that matches no job (the documents rebuilt without it would lose it), and a local result that differs from
the committed record of its job (the page would move without a commit saying why).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_transformers.algos.ppo_config import PPOConfig, TrainConfig
from rl_transformers.study.ranges import outside, score_range
from rl_transformers.study.suite import DATASET_ROOT
from rl_transformers.utils.atomic import atomic_write_json
from rl_transformers.utils.errors import UserError

UNKNOWN = "unknown"
"""The published ``machine`` / ``git_sha`` of a record that ran before the field was recorded."""
IDENTITY = ("algo", "task", "encoder", "encoder_name", "seed", "preset")
"""Record fields that must equal the job's."""
PPO_NUM_STEPS = PPOConfig().num_steps
PPO_NUM_ENVS: int = TrainConfig.__dataclass_fields__["num_envs"].default  # type: ignore[assignment]


@dataclass(frozen=True)
class Job:
    """One run of a study: its ``job.json`` (:func:`~rl_transformers.study.launch.make_job`) and its directory."""

    spec: dict[str, Any]
    """The job.json contents."""
    dir: Path

    @property
    def name(self) -> str:
        """Unique within a study: the preset is part of it (the confirmation stage runs each cell as two
        presets, ``v2-untuned`` and ``v2-tuned``, which progress and log lines must tell apart)."""
        s = self.spec
        return f"{s['preset']}/{s['algo']}/{s['task']}/{s['encoder_name']}/s{s['seed']}"


def job_key(spec: dict[str, Any]) -> str:
    """The job's key: the first 16 hex digits of the SHA-256 of its sorted JSON (the ``key`` field left out)."""
    body = {k: v for k, v in spec.items() if k != "key"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


def legacy_key_matches(old_spec: Any, spec: dict[str, Any]) -> bool:
    """Whether ``old_spec`` (the ``job.json`` of a run directory) is ``spec`` in the form used before the key
    migration: a DT job whose ``dataset_root`` was the absolute path of this checkout's ``datasets/minari``
    (its key hashed that path). Its result then belongs to ``spec``."""
    if not isinstance(old_spec, dict) or spec.get("algo") != "dt":
        return False
    root = old_spec.get("dataset_root")
    if not isinstance(root, str) or not Path(root).is_absolute() or not root.endswith(DATASET_ROOT):
        return False
    same = {**old_spec, "dataset_root": spec["dataset_root"]}
    return job_key(same) == spec["key"] and old_spec.get("key") == job_key(old_spec)


def expected_steps(spec: dict[str, Any]) -> int:
    """What a complete run of the job reaches: PPO env steps of its whole updates (the trainer stops after the
    last whole update within the budget), DT / BC gradient updates."""
    if spec["algo"] == "ppo":
        per_update = int(spec.get("num_envs", PPO_NUM_ENVS)) * int(
            spec.get("ppo", {}).get("num_steps", PPO_NUM_STEPS)
        )
        return int(spec["budget"]) // per_update * per_update
    return int(spec["budget"])


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def problem(record: Any, spec: dict[str, Any]) -> str | None:
    """Why ``record`` is not a finished run of the job ``spec`` (None: it is one)."""
    if not isinstance(record, dict):
        return f"not a JSON object but {type(record).__name__}"
    if record.get("key") != spec["key"]:
        return f"key {record.get('key')!r} is not the job's {spec['key']!r}"
    for field in IDENTITY:
        if record.get(field) != spec[field] or type(record.get(field)) is not type(spec[field]):
            return f"{field} {record.get(field)!r} is not the job's {spec[field]!r}"
    if not _number(record.get("score")):
        return f"score {record.get('score')!r} is not a finite number"
    steps_field = "env_steps" if spec["algo"] == "ppo" else "updates"
    steps = record.get(steps_field)
    if not _number(steps) or steps < expected_steps(spec):  # type: ignore[operator]  # _number: int | float
        return f"{steps_field} {steps!r}: the job's whole budget is {expected_steps(spec):,}"
    for field in ("final_return", "wall_s", "steps_per_s", "updates_per_s"):
        if record.get(field) is not None and not _number(record[field]):
            return f"{field} {record[field]!r} is not a finite number"
    params = record.get("parameters")
    if params is not None and (not isinstance(params, int) or isinstance(params, bool) or params < 0):
        return f"parameters {params!r} is not a count"
    for field in ("curve", "success_curve"):
        points = record.get(field)
        if points is not None and not (
            isinstance(points, list)
            and all(isinstance(p, list) and len(p) == 2 and all(_number(x) for x in p) for p in points)
        ):
            return f"{field} is not a list of [step, value] pairs of finite numbers"
    success = record.get("success")
    if success is not None and not (_number(success) and 0.0 <= success <= 1.0):
        return f"success {success!r} is not a rate in [0, 1]"
    resumed = record.get("resumed_from")  # study/attempts.py: the steps an interrupted run resumed from
    end = steps if isinstance(steps, (int, float)) else 0  # a number here (checked above)
    if resumed is not None and not (
        isinstance(resumed, list)
        and all(isinstance(s, int) and not isinstance(s, bool) and 0 < s < end for s in resumed)
        and resumed == sorted(set(resumed))
    ):
        return f"resumed_from {resumed!r} is not a list of increasing steps inside the run"
    for field in ("git_sha", "machine"):
        if record.get(field) is not None and not isinstance(record[field], str):
            return f"{field} {record[field]!r} is not a string"
    return _range_problem(record, spec) or _text_problem(record)


def _range_problem(record: dict[str, Any], spec: dict[str, Any]) -> str | None:
    """A score, final return or curve point outside the task's possible returns (:mod:`.ranges`)."""
    bounds = score_range(spec)
    if bounds is None:
        return None
    where = f"{spec.get('env_id')} {spec.get('env_kwargs') or ''}".strip()
    values = [("score", record["score"]), ("final_return", record.get("final_return"))]
    values += [(f"curve point at step {s:g}", v) for s, v in record.get("curve") or ()]
    for name, value in values:
        if value is not None and outside(value, bounds):
            return f"{name} {value!r} is outside the task's possible returns {list(bounds)} ({where})"
    return None


_SHA = re.compile(r"[0-9a-f]{7,40}(-dirty)?")  # a run from a checkout with changes says so


def _text_problem(record: dict[str, Any]) -> str | None:
    """Free-text fields that cannot be what the worker wrote: a git commit that is not one, a machine text
    with line breaks or of unbounded length (they are rendered into the published page)."""
    sha = record.get("git_sha")
    if sha is not None and sha != UNKNOWN and not _SHA.fullmatch(sha):
        return f"git_sha {sha[:60]!r} is not a git commit"
    machine = record.get("machine")
    if machine is not None and (len(machine) > 300 or any(ord(c) < 32 for c in machine)):
        return f"machine {machine[:60]!r}... is not one line of at most 300 characters"
    return None


def complete(record: Any, spec: dict[str, Any]) -> bool:
    """A record of this job that ran its whole budget (a run stopped early, e.g. by SIGTERM, is no result)."""
    return problem(record, spec) is None


def own_result(run_dir: Path, spec: dict[str, Any]) -> dict[str, Any] | None:
    """The record in ``run_dir/result.json`` when it is this job's (same key, or the pre-migration key of the same
    job by the directory's ``job.json``: returned under the current key), else None - a missing, unreadable or
    garbage file included."""
    record = read_json(run_dir / "result.json")
    if not isinstance(record, dict) or not isinstance(record.get("key"), str):
        return None
    if record["key"] == spec["key"]:
        return record
    old = read_json(run_dir / "job.json")
    if legacy_key_matches(old, spec) and isinstance(old, dict) and record["key"] == old.get("key"):
        return {**record, "key": spec["key"]}
    return None


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def results(jobs: Iterable[Job], log: Any = None) -> list[dict[str, Any]]:
    """The finished record of every job that has one (its own, complete ``result.json``), sorted; a result that is
    not one (garbage, another job's, stopped early) is left out and, with ``log``, named."""
    out = []
    for job in jobs:
        record = own_result(job.dir, job.spec)
        if record is not None and complete(record, job.spec):
            out.append(record)
        elif log is not None and (job.dir / "result.json").exists():
            why = problem(record, job.spec) if record is not None else "not this job's JSON record"
            log(f"ignored {job.dir / 'result.json'}: {why}")
    return sorted(out, key=lambda r: (r["algo"], r["task"], r["encoder_name"], r["seed"]))


def read_committed(records_file: Path) -> list[dict[str, Any]]:
    """The records of a committed records file (``encoders.json``, ...), read as data; a file that is not a JSON list of objects
    with a string ``key`` each, or with a key twice, is refused (:class:`UserError` naming it)."""
    source = str(records_file)
    try:
        data = json.loads(Path(records_file).read_text())
    except (OSError, ValueError) as err:
        raise UserError(f"cannot read the committed records: {err}", source=source) from err
    if not isinstance(data, list):
        raise UserError(f"expected a JSON list of run records, got {type(data).__name__}", source=source)
    seen: dict[str, int] = {}
    for i, rec in enumerate(data):
        if not isinstance(rec, dict) or not isinstance(rec.get("key"), str):
            raise UserError(
                f"record {i} is not a run record (a JSON object with a string 'key')", source=source
            )
        if rec["key"] in seen:
            raise UserError(
                f"records {seen[rec['key']]} and {i} have the same key {rec['key']!r}", source=source
            )
        seen[rec["key"]] = i
    return data


def restore(jobs: Sequence[Job], records_file: Path, dry_run: bool = False) -> list[Job]:
    """Write ``result.json`` for every job without a finished one whose record is in ``records_file``.

    ``records_file`` is a committed records file (:func:`read_committed`): a fresh checkout, whose ``runs/``
    is empty, resumes where the committed results end instead of re-running them. Each record must be a finished
    run of a job of ``jobs`` (:func:`problem`); one that contradicts its job (a task, encoder, seed or score that
    is not the job's, a shortened run) or matches no job is refused with a :class:`UserError` naming it, before
    anything is written. A job whose result was moved aside (``result.stale.json``, ``--rerun-encoders``) is not
    restored: the committed record is that stale result. Returns the jobs restored (with ``dry_run``: the jobs
    that would be; nothing is written).
    """
    records = read_committed(records_file)
    by_key = {job.spec["key"]: job for job in jobs}
    unmatched = [i for i, r in enumerate(records) if r["key"] not in by_key]
    if unmatched:
        first = records[unmatched[0]]
        who = "/".join(str(first.get(f)) for f in ("algo", "task", "encoder_name", "seed"))
        raise UserError(
            f"{len(unmatched)} of {len(records)} committed records match no job of this study (record "
            f"{unmatched[0]}, {who}, key {first['key']!r}): the job definitions (budgets, seeds, encoders, "
            "settings) differ from the ones that ran them, so the rebuilt documents would lose them. Run the "
            "preset and --seeds they ran with, or --no-restore to start over without them",
            source=str(records_file),
        )
    for i, rec in enumerate(records):
        why = problem(rec, by_key[rec["key"]].spec)
        if why is not None:
            raise UserError(
                f"record {i} ({by_key[rec['key']].name}) is refused: {why}", source=str(records_file)
            )
    restored = []
    for rec in records:
        job = by_key[rec["key"]]
        if (job.dir / "result.stale.json").exists():  # moved aside to run again: the local result supersedes
            continue
        own = own_result(job.dir, job.spec)
        if complete(own, job.spec):
            _check_same(own, rec, job.dir / "result.json", records_file)
            continue
        if not dry_run:
            atomic_write_json(job.dir / "result.json", {**rec, "restored_from": str(records_file)}, indent=1)
        restored.append(job)
    return restored


RESULT_FIELDS = (
    "score",
    "final_return",
    "curve",
    "success",
    "success_curve",
    "env_steps",
    "updates",
    "parameters",
)
"""What a record reports; a local result and the committed record of one job must agree on all of them."""


def _check_same(local: Any, committed: dict[str, Any], local_path: Path, records_file: Path) -> None:
    """Refuse a local result that silently replaces the committed record of its job (same key, other results):
    the page rebuilt from it would move without a commit saying why."""
    differ = [f for f in RESULT_FIELDS if local.get(f) != committed.get(f)]
    if differ:
        first = differ[0]
        shown = (
            ""
            if first.endswith("curve")
            else f": {local.get(first)!r} here, {committed.get(first)!r} committed"
        )
        raise UserError(
            f"the local result {local_path} differs from the committed record of its job in {records_file} "
            f"({', '.join(differ)}{shown}); keep the committed one by moving the local file aside (e.g. to "
            "result.local.json), or publish the local one knowingly with --no-restore",
            source=str(local_path),
        )


def machine_text() -> str:
    """This machine as a record states it: CPU model, usable cores, Python and torch versions (runs use 1
    thread)."""
    import platform

    import torch

    from rl_transformers.runs.provenance import device_name
    from rl_transformers.utils.training import available_cores

    return (
        f"{device_name(torch.device('cpu'))}, {available_cores()} cores, Python {platform.python_version()}, "
        f"torch {torch.__version__}"
    )
