"""Compare encoders: the chosen registered encoders (default: every attention, plus GTrXL, memories, depths,
GRU / LSTM / MLP) as policy encoders, online (PPO on T-Maze + POPGym Easy) and offline (Decision Transformer),
aggregated with rliable (rl_transformers/study/run.py; the screening stage built on it: experiments/encoder_screening/).

    python scripts/encoder_study.py --preset quick --dry-run          # run count and estimated time
    python scripts/encoder_study.py --preset quick --encoders gtrxl gru lstm   # smoke run (1 seed)
    python scripts/encoder_study.py --preset full --parts online      # the full online grid (resumable)
    python scripts/encoder_study.py --preset full --rerun-encoders lsh bigbird   # re-run changed variants
    python scripts/encoder_study.py --preset full --launcher ray --ray-address auto   # on a Ray cluster
    python scripts/encoder_study.py --preset quick --report-only      # rebuild the documents

Progress: a bar over the runs (done / running / left, ETA from measured rates) on a terminal, one line per
finished run otherwise. Runs land in <out>/<preset>/<algo>/<task>/<encoder>/s<seed>/ (result.json when finished);
a second invocation skips finished runs and retries failed ones, and skips a run another invocation is running
(its running.lock names the process; a lock of a dead process is taken over). Committed records
(<docs>/encoders_screening.json) are restored into empty run directories first (--no-restore to skip); the
documents (default <out>/<preset>/docs) always cover the whole preset, whichever --tasks / --encoders this
invocation runs.
"""

from __future__ import annotations

import tyro

from rl_transformers.study.launch import STUDY_INTERRUPTED
from rl_transformers.study.run import StudyConfig, run_study
from rl_transformers.utils.errors import run_cli
from rl_transformers.utils.extras import need


def main(config: StudyConfig) -> None:
    """Plan, run and report the study of ``config`` (:func:`~rl_transformers.study.run.run_study`)."""
    if not config.flags.dry_run:  # checked before any run starts: the documents need both
        need("rliable", "the study's statistics (rl_transformers.study.aggregate)")
        need("matplotlib", "the study's plots (rl_transformers.study.plots)")
    run_study(config)


def command() -> int:
    """``rlt study``: the flags of :class:`StudyConfig` on ``sys.argv``, then :func:`main`; user errors as one
    line, Ctrl-C as one line (the study resumes)."""
    run_cli(lambda: main(tyro.cli(StudyConfig, description=__doc__)), on_interrupt=STUDY_INTERRUPTED)
    return 0
