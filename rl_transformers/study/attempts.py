"""A study run's attempts: an interrupted PPO run resumes from its checkpoint instead of from step 0.

A worker stopped mid-run (the session ended, the machine went down, the launcher's timeout) leaves the
trainer's last checkpoint in its run directory. The next worker for the job resumes from it only when that
continues the same computation bit for bit: the trainer's resume restores the model, the optimizer, the RNG
states and the envs themselves (:mod:`rl_transformers.algos.ppo_checkpoint`), so a resumed run logs what the
uninterrupted run would have (``tests/study/test_attempts.py`` compares the two). That needs

- the same job (its key), the same code and the same machine: :data:`CODE_PATHS` as committed, without
  uncommitted changes (:func:`code_identity`: git's objects for them, so a commit that touches only documents,
  like a study's records, keeps it), and the machine a record names (one-thread CPU results differ between CPU
  models: ``scripts/check_reproducible.py``);
- a checkpoint whose signed env state verifies with this user's key (a foreign or unsigned one would resume
  with fresh episodes: not the same run).

Anything else starts over, as every attempt did before. DT jobs always start over (they take minutes).

**Wall time.** A record's ``wall_s`` is what the run took to reach its budget, summed over its attempts. Each
interrupted attempt is credited up to its last checkpoint (the file's modification time), since what came
after it is redone. ``attempt.json`` in the job directory, written atomically as an attempt starts, carries
the credit so far, and the record lists the steps it resumed from (``resumed_from``). The worker removes it
once the record is written, so a finished run that is run again (``--rerun-encoders``) starts over.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_transformers.utils.atomic import atomic_write_json

ATTEMPT_FILE = "attempt.json"
CODE_PATHS = ("rl_transformers", "envs", "offline_data", "pyproject.toml")
"""What a run executes, relative to the checkout (the dependencies' versions: ``pyproject.toml``)."""


def code_identity(root: Path | None = None) -> str | None:
    """Git's object ids of :data:`CODE_PATHS` at HEAD in the checkout ``root`` (default: this one), or None
    when any of them has uncommitted or untracked changes, or git cannot tell."""
    from rl_transformers.runs.provenance import git_output
    from rl_transformers.study.launch import ROOT

    root = root or ROOT
    try:
        changed = git_output(root, "status", "--porcelain", "--", *CODE_PATHS)
        objects = git_output(root, "rev-parse", *(f"HEAD:{path}" for path in CODE_PATHS), timeout=5).split()
    except (OSError, subprocess.SubprocessError):
        return None
    return None if changed or len(objects) != len(CODE_PATHS) else ",".join(objects)


@dataclass(frozen=True)
class Attempt:
    """How this attempt starts: the checkpoint it resumes (None: from step 0), the wall time credited to the
    attempts before it and the steps they resumed from (``resumed_from`` of the record)."""

    checkpoint: Path | None = None
    credit_s: float = 0.0
    resumed_from: tuple[int, ...] = ()


def _previous(job_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((job_dir / ATTEMPT_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _verified_step(checkpoint: Path) -> int | None:
    """The env step of a PPO checkpoint whose signed env state verifies with this user's key; else None."""
    from rl_transformers.algos.ppo_checkpoint import RESUME_BLOB
    from rl_transformers.runs.checkpoint_load import InvalidCheckpointError, load_checkpoint
    from rl_transformers.utils.trust import UntrustedBlob, verify_signed

    try:
        ckpt = load_checkpoint(checkpoint)
        if not isinstance(ckpt, dict) or ckpt.get(RESUME_BLOB) is None:
            return None
        verify_signed(ckpt[RESUME_BLOB], RESUME_BLOB)
    except (InvalidCheckpointError, UntrustedBlob, OSError):
        return None
    step = ckpt.get("global_step")
    return step if isinstance(step, int) and step > 0 else None


def plan_attempt(job: dict[str, Any], run: Path, code: str | None, machine: str) -> Attempt:
    """Resume ``run`` (the job's run directory) when the previous attempt allows it (module docstring)."""
    from rl_transformers.runs.checkpoint_load import latest_checkpoint
    from rl_transformers.study.records import expected_steps

    before = _previous(run.parent)
    same = (
        before is not None
        and job["algo"] == "ppo"
        and code is not None
        and (before.get("key"), before.get("code"), before.get("machine")) == (job["key"], code, machine)
    )
    checkpoint = latest_checkpoint(run) if same and run.is_dir() else None
    step = _verified_step(checkpoint) if checkpoint is not None else None
    if before is None or checkpoint is None or step is None or step >= expected_steps(job):
        return Attempt()
    credit, started = before.get("credit_s"), before.get("started_at")
    if not isinstance(credit, (int, float)) or not isinstance(started, (int, float)):
        return Attempt()
    saved_at = checkpoint.stat().st_mtime
    if saved_at > started:  # the previous attempt got this far; else it resumed from this checkpoint itself
        credit += saved_at - started
    resumed = tuple(int(s) for s in before.get("resumed_from", []) if isinstance(s, int))
    return Attempt(checkpoint, float(credit), (*resumed, step) if step not in resumed else resumed)


def finish_attempt(run: Path) -> None:
    """The record is written: nothing is left to resume."""
    (run.parent / ATTEMPT_FILE).unlink(missing_ok=True)


def start_attempt(job: dict[str, Any], run: Path, attempt: Attempt, code: str | None, machine: str) -> None:
    """Write ``attempt.json`` for the attempt that starts now."""
    atomic_write_json(
        run.parent / ATTEMPT_FILE,
        {
            "key": job["key"],
            "code": code,
            "machine": machine,
            "started_at": time.time(),
            "credit_s": attempt.credit_s,
            "resumed_from": list(attempt.resumed_from),
        },
        indent=1,
    )
