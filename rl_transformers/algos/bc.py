"""Behaviour cloning and %BC baselines, trained by the Decision Transformer trainer.

Method: the same network as the Decision Transformer without the return-to-go token (per step the tokens
(s_t, a_t), a_t predicted from s_t's output, so the policy sees the last K states and actions), trained with
the same batching, optimiser, schedule and evaluation (Chen et al. 2021, arXiv 2106.01345, §5.3). %BC
("Percentile Behavior Cloning") trains on the best episodes by return that hold the top X% of the dataset's
steps (``bc_top_fraction``, e.g. 0.1 for 10%BC). CLI: ``scripts/train_dt.py --algo bc --bc-top-fraction 0.1``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rl_transformers.algos.dt import train
from rl_transformers.algos.dt_config import DTConfig
from rl_transformers.runs.lifecycle import RunResult


def bc_config(dataset: str, top_fraction: float = 1.0, **overrides: Any) -> DTConfig:
    """A :class:`DTConfig` for BC (``top_fraction`` 1) or %BC on ``dataset``; other fields as ``overrides``."""
    return DTConfig(dataset=dataset, algo="bc", bc_top_fraction=top_fraction, **overrides)


def as_bc(config: DTConfig, top_fraction: float | None = None) -> DTConfig:
    """The BC counterpart of a DT config (same backbone, budget and evaluation)."""
    fraction = config.bc_top_fraction if top_fraction is None else top_fraction
    return dataclasses.replace(config, algo="bc", bc_top_fraction=fraction, target_returns=None)


def train_bc(dataset: str, top_fraction: float = 1.0, **overrides: Any) -> RunResult:
    """Train BC / %BC; see :func:`rl_transformers.algos.dt.train`."""
    return train(bc_config(dataset, top_fraction, **overrides))
