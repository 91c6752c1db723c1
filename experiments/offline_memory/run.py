"""The offline memory table: the Decision Transformer on T-Maze corridors of 10 / 25 / 50, one row per causal
attention (context covering the corridor), per memory (segments with carried memory) and a floor (method:
rl_transformers/study/offline_memory.py).

    python scripts/make_memory_dataset.py --task tmaze --memory-lengths 10 25 50 --random-share 0.2 --root datasets/minari
    python -m experiments.offline_memory.run --dry-run                        # run count and estimated core-hours
    python -m experiments.offline_memory.run --lengths 10 50 --workers 2       # run (resumable), then write the documents
    python -m experiments.offline_memory.run --encoders full xl floor --lengths 10 --seeds 0
    python -m experiments.offline_memory.run --report-only                     # rebuild docs/results/offline_memory.*

Each finished run leaves a result.json under --out; an interrupted table resumes where it stopped, and a fresh
checkout restores the committed records of docs/results/offline_memory.json first.
"""

from __future__ import annotations

import tyro

from experiments.offline_memory.plan import OfflineMemoryConfig
from experiments.offline_memory.stages import run_offline_memory
from rl_transformers.study.launch import STUDY_INTERRUPTED
from rl_transformers.utils.errors import run_cli

if __name__ == "__main__":
    run_cli(
        lambda: run_offline_memory(tyro.cli(OfflineMemoryConfig, description=__doc__)),
        on_interrupt=STUDY_INTERRUPTED,
    )
