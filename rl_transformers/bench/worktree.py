"""An older commit's tree beside the working tree, for side-by-side checks (scripts/check_reproducible.py,
benchmarks/ab_attention_timing.py): ``with commit_tree(repo, rev) as tree`` checks ``rev`` out into a temporary
``git worktree`` and removes it afterwards; run its code with ``PYTHONPATH=tree``."""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rl_transformers.utils.errors import UserError


def resolve(repo: Path, rev: str, source: str = "--commit") -> str:
    """The full SHA of ``rev`` in ``repo``, or a user error naming it."""
    done = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=repo, capture_output=True,
                          text=True)  # fmt: skip
    if done.returncode != 0:
        raise UserError(f"unknown commit {rev!r} in {repo}", source=source)
    return done.stdout.strip()


@contextmanager
def commit_tree(repo: Path, rev: str, source: str = "--commit") -> Iterator[Path]:
    """A temporary detached worktree of ``rev`` (removed on exit, also after an error)."""
    sha = resolve(repo, rev, source)
    with tempfile.TemporaryDirectory(prefix="rlt-tree-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(tree), sha], cwd=repo, check=True)
        try:
            yield tree
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=repo, check=False)
