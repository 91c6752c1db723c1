"""The encoder study's confirmation stage: 11 encoders, untuned and tuned, on a memory-length
ladder (RepeatPrevious Easy / Medium / Hard, T-Maze 10 / 100 / 400) plus a control and a noisy task, 3 seeds
(method: experiments/encoder_study/plan.py; design: docs/encoder_study.md).

    python -m experiments.encoder_study.run --dry-run                            # run count and core-hours of both stages
    python -m experiments.encoder_study.run --stage tune --workers 2             # tune every encoder (8 trials each, resumable)
    python -m experiments.encoder_study.run --stage tune --encoders gtrxl gru    # tune only these
    python -m experiments.encoder_study.run --workers 2                          # run both variants (resumable), write the documents
    python -m experiments.encoder_study.run --tasks RepeatPreviousEasy TMaze10 --seeds 0
    python -m experiments.encoder_study.run --report-only                        # rebuild docs/results/encoders.{md,json}
                                                                            # and the README's headline (--readme None: not)

Tuning results go to docs/results/encoders_tuning.json (commit it with the runs' records): a fresh checkout
then plans the same tuned jobs and restores the committed records of docs/results/encoders.json.
"""

from __future__ import annotations

from pathlib import Path

import tyro

from experiments.encoder_study.stages import ConfirmConfig, run_confirm
from rl_transformers.study.launch import STUDY_INTERRUPTED
from rl_transformers.utils.errors import run_cli

if __name__ == "__main__":
    run_cli(
        lambda: run_confirm(
            tyro.cli(ConfirmConfig, description=__doc__, default=ConfirmConfig(readme=Path("README.md")))
        ),
        on_interrupt=STUDY_INTERRUPTED,
    )
