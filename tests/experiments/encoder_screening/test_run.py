"""The screening stage: the general study with its page text and the offline memory table as its offline part."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from experiments.encoder_screening import run as screening
from experiments.offline_memory import plan as omp
from rl_transformers.study import offline_memory as om
from rl_transformers.study.flags import configure
from tests.experiments.offline_memory.test_stages import TINY_ROWS


def beside(cfg: screening.ScreeningConfig, docs: Path) -> None:
    """What the screening page runs beside the study's jobs, with ``cfg``'s settings."""
    page = screening.page(cfg)
    assert page.beside is not None and page.dt_section is not None
    page.beside(cfg, docs)


def test_the_study_runs_the_table_as_its_offline_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The screening stage (--preset full) runs the table with its own settings (workers, seeds, dry run, restore)
    and the --encoders the table has; not for the quick preset, a --tasks filter, the online part alone, only
    encoders the table lacks, or --no-memory-table."""
    called: list[omp.OfflineMemoryConfig] = []
    monkeypatch.setattr(
        screening, "run_offline_memory", lambda cfg, log=print, start_by=None: called.append(cfg)
    )
    monkeypatch.setattr(om, "rows", lambda match=True: list(TINY_ROWS))
    base = configure(screening.ScreeningConfig, preset="full", out=tmp_path / "runs", workers=2, dry_run=True)
    beside(replace(base, encoders=("xl", "gru")), tmp_path / "docs")
    (cfg,) = called
    assert cfg.encoders == ("xl",) and cfg.flags.workers == 2 and cfg.flags.dry_run and cfg.seeds == om.SEEDS
    assert cfg.flags.docs == tmp_path / "docs" and cfg.flags.out == tmp_path / "runs"
    for skipped in (
        replace(base, preset="quick"),
        replace(base, tasks=("TMaze10",)),
        replace(base, parts=("online",)),
        replace(base, encoders=("gru",)),
        replace(base, memory_table=False),
    ):
        beside(skipped, tmp_path / "docs")
    assert len(called) == 1
