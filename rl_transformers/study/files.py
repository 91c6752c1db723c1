"""The study's document names under ``--docs`` (docs/results in the repository), in one place.

Two stages: the **screening** stage (every encoder untuned at one small budget:
:mod:`~rl_transformers.study.run`, :mod:`~rl_transformers.study.report`), and the **confirmation** stage
(tuned and untuned on a memory-length ladder: :mod:`~experiments.encoder_study.stages`,
:mod:`~experiments.encoder_study.report`), whose documents are the study's main page. Until 2026-11-27 the
screening stage's files were called encoders.{md,json} / encoders_aggregate.json and the confirmation stage's
encoders_v2.{md,json} / encoders_v2_tuning.json.
"""

from __future__ import annotations

SCREENING_RECORDS = "encoders_screening.json"
SCREENING_AGGREGATE = "encoders_screening_aggregate.json"
SCREENING_PAGE = "encoders_screening.md"
RECORDS = "encoders.json"
"""The confirmation stage's run records (restored into a fresh checkout's empty run directories)."""
PAGE = "encoders.md"
TUNING = "encoders_tuning.json"
"""Every encoder's tuning result (a fresh checkout plans the same tuned jobs from it)."""
SUPERSEDED = "encoders_superseded.json"
"""Records of jobs whose definition changed deliberately (docs/encoder_study.md): kept, never read."""
