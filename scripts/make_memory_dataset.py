r"""Build offline memory datasets (passive T-Maze, RepeatPrevious) as Minari datasets, one per memory length.

Scripted oracles with epsilon-random actions plus a share of uniformly random episodes, no training; each
dataset stores the random and oracle reference scores. Rerunning a command keeps the datasets it already
wrote; an id holding other data needs --overwrite. See `offline_data.memory_build` and docs/offline_memory.md.
Examples:

    python scripts/make_memory_dataset.py --task tmaze --memory-lengths 10 50 200 --root datasets/minari
    python scripts/make_memory_dataset.py --task tmaze --memory-lengths 50 --epsilon 0.01 --random-share 0.2
    python scripts/make_memory_dataset.py --task repeat-previous --memory-lengths 32 --epsilon 0.1
"""

from __future__ import annotations

from offline_data.memory_build import main
from rl_transformers.utils.errors import run_cli

if __name__ == "__main__":
    run_cli(lambda: main(description=__doc__))
