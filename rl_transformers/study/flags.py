"""The flags every study driver shares, and what the drivers do alike around them.

:class:`StudyFlags` is composed into each driver's configuration as its ``flags`` field (:data:`Flags`: on the
command line without a prefix, ``--out``, ``--docs``, ``--seeds``, ``--workers``, ...); a driver gives its own
defaults with a :class:`StudyFlags` instance. Around them, the same three steps in every driver:

- :func:`restore_committed` - the committed records (``<docs>/<records>.json``) restored into empty run
  directories, so a fresh checkout resumes where the committed results end (a dry run only counts them);
- :func:`check_nothing_lost` - documents that would hold fewer records than were committed are refused;
- :func:`rebuild_command` - the command that rebuilds the documents, as the page prints it.

:func:`configure` and :func:`changed` build and change a configuration by field name, the shared flags included.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Protocol, TypeVar

import tyro

from rl_transformers.study import records
from rl_transformers.study.records import Job
from rl_transformers.utils.errors import UserError


@dataclass(frozen=True)
class StudyFlags:
    """Where runs and documents go, how many run at once, and what this invocation does."""

    out: Path = Path("runs/study")
    """Run directories (one per job, a result.json when finished)."""
    docs: Path | None = Path("docs/results")
    """Where the documents are written and the committed records are read."""
    seeds: tuple[int, ...] | None = None
    """Seeds of every job (default: the study's own)."""
    workers: int = 1
    """Runs at once (one torch thread each; with --launcher ray: CPUs of a local Ray instance)."""
    timeout_s: float | None = 3600.0
    """Kill a run after this many seconds (failed: it runs again on the next invocation); its worker stops too."""
    stop_starting_after_h: float | None = None
    """Start no run after this many hours (a time-limited slot, e.g. a SLURM job's --time less one run's
    duration); the running ones finish and keep their results, the next invocation runs the rest."""
    dry_run: bool = False
    """Print the run count and the estimated cost, then exit; nothing on disk changes."""
    report_only: bool = False
    """Only rebuild the documents from finished runs."""
    restore: bool = True
    """Restore the committed records (in --docs) into empty run directories first, so a fresh checkout resumes
    where the committed results end; --no-restore starts afresh."""


Flags = Annotated[StudyFlags, tyro.conf.OmitArgPrefixes]
"""The ``flags`` field's type: its options without a ``flags.`` prefix on the command line."""

NAMES = frozenset(f.name for f in dataclasses.fields(StudyFlags))


class HasFlags(Protocol):
    """A driver's configuration: its own fields and the shared ``flags``."""

    @property
    def flags(self) -> StudyFlags: ...


C = TypeVar("C", bound=HasFlags)


def _split(fields: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    shared = {k: v for k, v in fields.items() if k in NAMES}
    return {k: v for k, v in fields.items() if k not in NAMES}, shared


def configure(cls: Callable[..., C], **fields: Any) -> C:
    """``cls(**fields)`` where the shared flags among ``fields`` change ``cls``'s default flags, e.g.
    ``configure(StudyConfig, preset="full", out=Path("runs"), dry_run=True)``."""
    own, shared = _split(fields)
    return cls(**own, flags=replace(cls().flags, **shared))


def changed(cfg: C, **fields: Any) -> C:
    """``cfg`` with ``fields`` replaced, the shared flags among them in ``cfg.flags``."""
    own, shared = _split(fields)
    return replace(cfg, **own, flags=replace(cfg.flags, **shared))  # type: ignore[type-var]


def restore_committed(every: list[Job], committed: Path, flags: StudyFlags, log=print) -> set[Path]:
    """Restore the committed records into the empty run directories of ``every`` (unless --no-restore; a dry run
    writes nothing) and return the directories restored (or that would be)."""
    if not (flags.restore and committed.exists()):
        return set()
    restored = {j.dir for j in records.restore(every, committed, dry_run=flags.dry_run)}
    if restored:
        log(
            f"{'would restore' if flags.dry_run else 'restored'} {len(restored)} finished runs from {committed}"
        )
    return restored


def check_nothing_lost(
    found: list[dict], committed: Path, moved: Collection[str] = (), guard: bool = True
) -> None:
    """Refuse to write documents holding fewer records than ``committed`` (the records file they replace): every
    committed record must be among ``found``, except those moved aside on purpose (``moved``: their jobs run
    again). ``guard`` False (a run with --no-restore: starting over) skips the check."""
    if not guard or not committed.exists():
        return
    before = records.read_committed(committed)
    have = {r["key"] for r in found}
    lost = [r for r in before if r["key"] not in have and r["key"] not in moved]
    if lost:
        who = "/".join(str(lost[0].get(f)) for f in ("algo", "task", "encoder_name", "seed"))
        raise UserError(
            f"the rebuilt documents would hold {len(found)} records, and {len(lost)} of the {len(before)} "
            f"committed ones would be lost (e.g. {who}, key {lost[0]['key']!r}); nothing written. Their run "
            "directories lack a finished result: restore them (leave out --no-restore) or run them",
            source=str(committed),
        )


def rebuild_command(
    command: str,
    flags: StudyFlags,
    default: StudyFlags,
    leading: Sequence[str] = (),
    always: Collection[str] = (),
) -> str:
    """``command`` with ``leading`` options, then --seeds, --out and --docs where they differ from ``default`` (or
    are named in ``always``), then --report-only."""
    parts = list(leading)
    if flags.seeds is not None and ("seeds" in always or flags.seeds != default.seeds):
        parts += ["--seeds", *map(str, flags.seeds)]
    for name in ("out", "docs"):
        value = getattr(flags, name)
        if value is not None and (name in always or value != getattr(default, name)):
            parts += [f"--{name}", str(value)]
    return " ".join([command, *(shlex.quote(p) for p in parts), "--report-only"])
