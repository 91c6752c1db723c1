"""A fresh checkout rebuilds the committed memory-probe documents from them (probe_restore)."""

from __future__ import annotations

import json
from pathlib import Path

from experiments.memory_probe.grid import ProbeConfig, ProbeSettings, plan_rows
from experiments.memory_probe.report import cell_records
from experiments.memory_probe.restore import restore_cells
from rl_transformers.study.encoders import ppo_encoders, select
from rl_transformers.study.flags import configure

DOCS = Path(__file__).resolve().parents[3] / "docs" / "results" / "memory_probe.json"


def _plan(committed: dict, out: Path) -> tuple[ProbeConfig, list]:
    encoders = sorted({c["encoder"] for c in committed["cells"]})
    cfg = configure(
        ProbeConfig,
        out=out,
        encoders=tuple(encoders),
        ks=tuple(committed["ks"]),
        seeds=tuple(committed["seeds"]),
        bounds=tuple(committed["bounds"]),
        settings=ProbeSettings(**committed["settings"]),
    )
    all_encoders, _ = ppo_encoders(match=True)
    return cfg, plan_rows(select(all_encoders, cfg.encoders), cfg.bounds)


def cell_key(cell: dict) -> tuple:
    """Cells compared as sets: the records' order follows the plan's rows, which this test does not pin."""
    return (cell["encoder"], str(cell.get("value")), cell["k"], cell["seed"])


def test_committed_cells_restore_into_an_empty_out_and_give_the_same_records(tmp_path: Path) -> None:
    committed = json.loads(DOCS.read_text())
    cfg, rows = _plan(committed, tmp_path / "cells")
    assert cell_records(cfg, rows) == []  # nothing measured here: without restore the page would be empty
    assert restore_cells(cfg, rows, DOCS) == len(committed["cells"])
    assert sorted(cell_records(cfg, rows), key=cell_key) == sorted(committed["cells"], key=cell_key)
    assert restore_cells(cfg, rows, DOCS) == 0  # existing cells are never overwritten


def test_other_settings_or_non_finite_records_are_not_restored(tmp_path: Path) -> None:
    committed = json.loads(DOCS.read_text())
    cfg, rows = _plan(committed, tmp_path / "cells")
    other = dict(
        committed, settings={**committed["settings"], "updates": committed["settings"]["updates"] + 1}
    )
    (tmp_path / "other.json").write_text(json.dumps(other))
    assert restore_cells(cfg, rows, tmp_path / "other.json") == 0
    bad = dict(committed, cells=[dict(c, accuracy=float("nan")) for c in committed["cells"]])
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    assert restore_cells(cfg, rows, tmp_path / "bad.json") == 0


def _script_config(committed: dict, out: Path, **changes) -> ProbeConfig:
    return configure(
        ProbeConfig,
        out=out,
        encoders=("gtrxl",),
        ks=tuple(committed["ks"]),
        seeds=tuple(committed["seeds"]),
        bounds=tuple(committed["bounds"]),
        settings=ProbeSettings(**committed["settings"]),
        **changes,
    )


def test_the_script_restores_every_committed_cell_by_default_and_dry_runs_count_them(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """Without --docs a run still starts from docs/results/memory_probe.json (a fresh checkout re-measured
    committed cells before), restoring every encoder's cells since one may repeat another; a dry run counts
    them as finished and writes nothing; --no-restore measures afresh."""
    from experiments.memory_probe import run as probe

    committed = json.loads(DOCS.read_text())
    gtrxl = [c for c in committed["cells"] if c["encoder"] == "gtrxl"]
    assert gtrxl
    monkeypatch.chdir(DOCS.parents[2])  # the committed path is relative to the repository root
    out = tmp_path / "cells"

    probe.main(_script_config(committed, out, dry_run=True))
    assert f"({len(gtrxl)} finished," in capsys.readouterr().out
    assert not out.exists()
    probe.main(_script_config(committed, out, dry_run=True, restore=False))
    assert "(0 finished," in capsys.readouterr().out

    probe.main(_script_config(committed, out, report_only=True))
    assert f"restored {len(committed['cells'])} finished cells" in capsys.readouterr().out
    assert len(list(out.rglob("*.json"))) == len(committed["cells"])
    probe.main(_script_config(committed, tmp_path / "afresh", report_only=True, restore=False))
    assert not (tmp_path / "afresh").exists()
