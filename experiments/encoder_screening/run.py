"""The encoder study's screening stage: every registered attention (plus GTrXL, memories, depths, GRU / LSTM /
MLP) as a policy encoder, online (PPO on T-Maze + POPGym Easy) and offline (Decision Transformer), aggregated
with rliable; the full preset's offline part includes the offline memory table (experiments/offline_memory/).

    python -m experiments.encoder_screening.run --preset quick --dry-run          # run count and estimated time
    python -m experiments.encoder_screening.run --preset quick                    # smoke run (1 seed, <= 1 h on 2 cores)
    python -m experiments.encoder_screening.run --preset full --parts online      # the full online grid (resumable)
    python -m experiments.encoder_screening.run --preset full --rerun-encoders lsh bigbird   # re-run changed variants
    python -m experiments.encoder_screening.run --preset full --launcher ray --ray-address auto   # on a Ray cluster
    python -m experiments.encoder_screening.run --preset full --out runs/study --docs docs/results --report-only  # rebuild

The general tool it runs (plan, launchers, records, report): rl_transformers/study/run.py (scripts/encoder_study.py
without this stage's page text). Progress: a bar over the runs (done / running / left, ETA from measured rates) on
a terminal, one line per finished run otherwise. Runs land in <out>/<preset>/<algo>/<task>/<encoder>/s<seed>/
(result.json when finished); a second invocation skips finished runs and retries failed ones, and skips a run
another invocation is running (its running.lock names the process; a lock of a dead process is taken over). The
committed records (<docs>/encoders_screening.json) are restored into empty run directories first (--no-restore to
skip), so a fresh checkout resumes where the committed results end; the documents always cover the whole preset,
whichever --tasks / --encoders this invocation runs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import tyro

from experiments.encoder_screening import notes
from experiments.encoder_screening.spec import ENCODERS
from experiments.offline_memory import plan as omp
from experiments.offline_memory.report import study_section
from experiments.offline_memory.stages import run_offline_memory
from rl_transformers.study import offline_memory
from rl_transformers.study.launch import STUDY_INTERRUPTED
from rl_transformers.study.run import Page, StudyConfig, run_study
from rl_transformers.utils.errors import run_cli

COMMAND = "python -m experiments.encoder_screening.run"


@dataclass(frozen=True)
class ScreeningConfig(StudyConfig):
    """The screening stage: the general study with this stage's page and the offline memory table."""

    memory_table: bool = True
    """With --preset full, the offline part also runs the offline memory table, its main tasks (T-Maze corridors,
    every causal attention and memory: experiments/offline_memory/, into the same --docs); CartPole / Pendulum
    are its control rows."""


def offline_memory_part(
    cfg: StudyConfig, docs: Path, log=print, start_by: float | None = None, memory_table: bool = True
) -> None:
    """The offline memory table as part of the study (``memory_table``, preset full, the offline part chosen and
    no --tasks filter): run, dry-run or rebuild it with this invocation's settings (``start_by``: its start
    limit, :func:`rl_transformers.study.launch.start_limit`); --encoders passes on the names the table has (none
    of them: the table is left out)."""
    if not (memory_table and cfg.preset == "full" and "offline" in cfg.parts and not cfg.tasks):
        return
    table = {r.name for r in offline_memory.rows()}
    names = tuple(n for n in cfg.encoders if n in table)
    if cfg.encoders and not names:
        return
    run_offline_memory(
        omp.OfflineMemoryConfig(
            encoders=names,
            flags=replace(cfg.flags, docs=docs),
        ),
        log,
        start_by,
    )


def page(cfg: ScreeningConfig) -> Page:
    """The screening page: its method, notes and caveat, and the offline memory table beside the jobs."""

    def beside(study: StudyConfig, docs: Path, log=print, start_by: float | None = None) -> None:
        offline_memory_part(study, docs, log, start_by, memory_table=cfg.memory_table)

    return Page(COMMAND, notes.method, notes.notes, notes.caveat, beside, study_section, ENCODERS)


def main(cfg: ScreeningConfig) -> None:
    run_study(cfg, page=page(cfg))


if __name__ == "__main__":
    run_cli(lambda: main(tyro.cli(ScreeningConfig, description=__doc__)), on_interrupt=STUDY_INTERRUPTED)
