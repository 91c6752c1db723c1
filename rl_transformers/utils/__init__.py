"""Helpers every layer may use (standard library and torch only): atomic writes, config JSON round trips
(``config_json``), RNG states, errors, checks, tables, and ``training``: seeding, threads, graceful Ctrl-C,
finiteness checks and schedules. The run infrastructure (directories, checkpoints, resume, locks, provenance)
is :mod:`rl_transformers.runs`; the logger :mod:`rl_transformers.logging`.
"""

from __future__ import annotations

from rl_transformers.utils.config_json import from_dict, load_config, save_config, to_jsonable
from rl_transformers.utils.rng import capture_rng_state, restore_rng_state
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
    "GracefulInterrupt",
    "NonFiniteError",
    "available_cores",
    "capture_rng_state",
    "check_finite",
    "from_dict",
    "linear_schedule",
    "linear_warmup",
    "load_config",
    "restore_rng_state",
    "save_config",
    "seed_everything",
    "set_threads",
    "to_jsonable",
    "warmup_cosine",
]
