"""Shared training infrastructure for the PPO (GTrXL) and Decision Transformer trainers.

``runs``: run directories and config JSON round trips; ``checkpoint``: atomic saves, RNG state and the
``step_<n>`` / ``last`` / ``best`` checkpoint manager; ``checkpoint_load``: the safe loader and the newest
loadable checkpoint of a run; ``training``: seeding, threads, graceful Ctrl-C,
finiteness checks and schedules. The logger lives in :mod:`rl_transformers.logging`.
"""

from __future__ import annotations

from rl_transformers.utils.checkpoint import CheckpointManager, CheckpointWriteError, atomic_save
from rl_transformers.utils.checkpoint_load import (
    InvalidCheckpointError,
    latest_checkpoint,
    load_checkpoint,
    read_checkpoint,
)
from rl_transformers.utils.rng import capture_rng_state, restore_rng_state
from rl_transformers.utils.runs import (
    from_dict,
    load_config,
    make_run_dir,
    sanitize_name,
    save_config,
    to_jsonable,
)
from rl_transformers.utils.training import (
    GracefulInterrupt,
    NonFiniteError,
    available_cores,
    check_finite,
    linear_schedule,
    linear_warmup,
    seed_everything,
    set_threads,
    warmup_cosine,
)

__all__ = [
    "CheckpointManager",
    "CheckpointWriteError",
    "GracefulInterrupt",
    "InvalidCheckpointError",
    "NonFiniteError",
    "atomic_save",
    "available_cores",
    "capture_rng_state",
    "check_finite",
    "from_dict",
    "latest_checkpoint",
    "linear_schedule",
    "linear_warmup",
    "load_checkpoint",
    "load_config",
    "make_run_dir",
    "read_checkpoint",
    "restore_rng_state",
    "sanitize_name",
    "save_config",
    "seed_everything",
    "set_threads",
    "to_jsonable",
    "warmup_cosine",
]
