"""Restore of the committed memory-probe cells into a fresh checkout's ``--out``, so a run or a rebuild never
re-measures (or loses) a committed cell. The committed ``memory_probe.json`` is data: only cells of the
invocation's own plan are restored (paths come from the plan, never from the file), only when the file was
measured with the same settings, and only records whose numbers are finite."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from experiments.memory_probe.grid import CURVE_STRIDE, REQUIRED, ProbeConfig, Row, cells_of
from rl_transformers.utils.atomic import atomic_write_json
from rl_transformers.utils.errors import UserError

COMMITTED = Path("docs/results/memory_probe.json")
"""The committed probe documents a run restores from when it is given no --docs."""


def committed_json(cfg: ProbeConfig) -> Path | None:
    """Where this invocation restores finished cells from (None: --no-restore)."""
    if not cfg.flags.restore:
        return None
    return cfg.flags.docs / "memory_probe.json" if cfg.flags.docs is not None else COMMITTED


def restorable(cfg: ProbeConfig, rows: list[Row], docs_json: Path) -> dict[Path, dict[str, Any]]:
    """The cell results a committed ``memory_probe.json`` holds for cells of ``rows`` that ``cfg.out`` lacks,
    keyed by the cell's path; nothing is written. The file keeps every 10th point of a curve; a restored cell
    holds each kept point for 10 updates, so thinning it again gives the same record."""
    if not docs_json.is_file():
        return {}
    try:
        committed = json.loads(docs_json.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"unreadable probe documents ({exc})", source=str(docs_json)) from None
    if not isinstance(committed, dict) or committed.get("settings") != dataclasses.asdict(cfg.settings):
        return {}
    records = {}
    for rec in committed.get("cells") or []:
        if isinstance(rec, dict):
            records[(rec.get("encoder"), rec.get("spec"), rec.get("k"), rec.get("seed"))] = rec
    found: dict[Path, dict[str, Any]] = {}
    for row in rows:
        for k in cfg.ks:
            for cell in cells_of(row, k, cfg.seeds):
                rec = records.get((cell.encoder, cell.spec, cell.k, cell.seed))
                path = cell.path(cfg.out)
                if rec is None or path.is_file() or path in found or not _finite_record(rec):
                    continue
                curve = [v for v in rec["curve_every_10"] for _ in range(CURVE_STRIDE)]
                kept = {key: v for key, v in rec.items() if key != "curve_every_10"}
                found[path] = {**kept, "curve": curve, "settings": committed["settings"]}
    return found


def restore_cells(cfg: ProbeConfig, rows: list[Row], docs_json: Path) -> int:
    """Write :func:`restorable`'s cells into ``cfg.out`` (existing cells are never overwritten); returns the
    number of cells written."""
    found = restorable(cfg, rows, docs_json)
    for path, result in found.items():
        atomic_write_json(path, result)
    return len(found)


def check_nothing_lost(report: dict[str, Any], docs_json: Path | None) -> None:
    """Refuse to replace ``docs_json`` (the committed documents a run restored from; None: --no-restore, a run
    that starts over) with a ``report`` lacking any of its cells (same encoder, spec, k and seed): a run over a
    part of the grid, or with other settings, would otherwise drop committed measurements from the page."""
    if docs_json is None or not docs_json.is_file():
        return
    try:
        before = json.loads(docs_json.read_text(encoding="utf-8")).get("cells") or []
    except (OSError, ValueError, AttributeError) as exc:
        raise UserError(f"unreadable probe documents ({exc})", source=str(docs_json)) from None
    have = {_identity(c) for c in report["cells"]}
    lost = [c for c in before if isinstance(c, dict) and _identity(c) not in have]
    if lost:
        who = "/".join(str(lost[0].get(f)) for f in ("encoder", "spec", "k", "seed"))
        raise UserError(
            f"the rebuilt documents would hold {len(report['cells'])} cells, and {len(lost)} of the {len(before)} "
            f"committed ones would be lost (e.g. {who}); nothing written. Run the committed grid's encoders, k, "
            "seeds and settings, write to another --docs, or start over with --no-restore",
            source=str(docs_json),
        )


def _identity(cell: dict[str, Any]) -> tuple[Any, ...]:
    return (cell.get("encoder"), cell.get("spec"), cell.get("k"), cell.get("seed"))


def _finite_record(rec: dict[str, Any]) -> bool:
    numbers = [rec.get("accuracy"), rec.get("updates_per_s")]
    curve = rec.get("curve_every_10")
    if not isinstance(curve, list) or not all(isinstance(v, (int, float)) for v in [*numbers, *curve]):
        return False
    return all(math.isfinite(v) for v in [*numbers, *curve]) and set(rec) >= REQUIRED - {"settings"}


__all__ = ["COMMITTED", "check_nothing_lost", "committed_json", "restorable", "restore_cells"]
