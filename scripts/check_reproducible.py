r"""Does the current tree reproduce a published run of an older commit bit for bit?

    python scripts/check_reproducible.py --commit e92ead2 \
        --command "python scripts/train_gtrxl.py --total-timesteps 8192"
    python scripts/check_reproducible.py --commit a2b2141 --command "python scripts/train_dt.py --algo dt \
        --dataset rlt/pendulum/medium-v0 --dataset-root datasets/minari --total-steps 200 --eval-every 0" \
        --now-flags="--backbone.ffn-dropout 0.1"

Runs the same training command twice - once with the scripts and package of ``--commit`` (a temporary
``git worktree``, first on ``PYTHONPATH``) and once with the working tree - each in a fresh directory (its runs
land in the default runs/ there; paths of this checkout named in the command, e.g. a dataset root, are made
absolute) with ``--no-progress`` (and ``--now-flags`` on the working-tree side) and one torch thread, then
compares the two runs' ``progress.jsonl`` row by row: every logged value except timings (keys naming time,
fps, per-second rates or wall clock) must be equal exactly. Training on the CPU with one thread is
deterministic on one CPU model, so equal logs over a few updates mean the code computes the same thing, and a
published table of that commit still describes this tree. Both runs are on this machine: a run published from
another CPU model (AMD EPYC against Intel Xeon) rounds differently and drifts from it after a while. Exit code 0: identical; 1: a difference (the first one is printed);
2: a command failed.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tyro

from rl_transformers.bench.worktree import commit_tree
from rl_transformers.utils.errors import UserError, run_cli

ROOT = Path(__file__).resolve().parents[1]
TIMING = ("time", "fps", "per_s", "wall", "elapsed", "sps")


@dataclass(frozen=True)
class Args:
    commit: str
    """The published commit (any git revision)."""
    command: str
    """The training command, as in the docs (a train_gtrxl.py / train_dt.py command line)."""
    now_flags: str = ""
    """Extra flags for the working-tree run only: the flags that restore a default changed since the commit
    (e.g. ``--backbone.ffn-dropout 0.1``), as the docs name them."""


def is_timing(key: str) -> bool:
    return any(t in key.lower() for t in TIMING)


def first_difference(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> str | None:
    """None when the logs agree (timings ignored), else a sentence naming the first differing row and key."""
    if len(old) != len(new):
        return f"{len(old)} logged rows at the commit, {len(new)} in the working tree"
    for i, (a, b) in enumerate(zip(old, new)):
        keys = sorted(k for k in set(a) | set(b) if not is_timing(k))
        for k in keys:
            if k not in a or k not in b:
                return f"row {i} (step {a.get('step', b.get('step'))}): key {k!r} only in one log"
            if a[k] != b[k]:
                return f"row {i} (step {a.get('step')}): {k} = {a[k]!r} at the commit, {b[k]!r} now"
    return None


def read_progress(run_root: Path) -> list[dict[str, Any]]:
    logs = sorted(run_root.rglob("progress.jsonl"))
    if len(logs) != 1:
        raise UserError(
            f"expected one progress.jsonl under {run_root}, found {len(logs)}", source="--command"
        )
    return [json.loads(line) for line in logs[0].read_text().splitlines() if line.strip()]


def _run(argv: list[str], workdir: Path, tree: Path) -> None:
    """Run ``argv`` with ``tree``'s package in a fresh ``workdir`` (the run lands in its default runs/ there)."""
    workdir.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    script = tree / argv[1]
    if not script.is_file():
        raise UserError(f"{argv[1]} does not exist at that commit", source="--command")
    # Arguments naming existing files or directories of this checkout (a dataset root, say) become absolute.
    rest = [
        str(ROOT / a) if not a.startswith("-") and "/" in a and (ROOT / a).exists() else a for a in argv[2:]
    ]
    full = [
        sys.executable if argv[0] in ("python", "python3") else argv[0],
        str(script),
        *rest,
        "--no-progress",
    ]
    done = subprocess.run(full, cwd=workdir, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-8:])
        raise UserError(f"{shlex.join(full)} failed (exit {done.returncode}):\n{tail}", source="--command")


def check(args: Args) -> int:
    argv = shlex.split(args.command)
    if len(argv) < 2 or not argv[1].startswith("scripts/"):
        raise UserError(
            f"--command must run a script under scripts/, got {args.command!r}", source="--command"
        )
    with commit_tree(ROOT, args.commit) as tree, tempfile.TemporaryDirectory(prefix="reproduce-") as tmp:
        _run(argv, Path(tmp) / "commit", tree)
        _run([*argv, *shlex.split(args.now_flags)], Path(tmp) / "now", ROOT)
        old, new = read_progress(Path(tmp) / "commit"), read_progress(Path(tmp) / "now")
    diff = first_difference(old, new)
    now = f" (with `{args.now_flags}`)" if args.now_flags else ""
    if diff is None:
        print(f"identical: {len(new)} logged rows of `{args.command}` at {args.commit} and in the working tree"
              f"{now} (timings ignored)")  # fmt: skip
        return 0
    print(f"differs: {diff}")
    return 1


def main() -> int:
    return run_cli(lambda: check(tyro.cli(Args, description=__doc__)))


if __name__ == "__main__":
    sys.exit(main())
