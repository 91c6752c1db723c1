"""What a Decision Transformer / BC run logs: the training window's means and the evaluation scalars.

Tags come from :mod:`rl_transformers.tags` (the vocabulary is tabulated in docs/design.md). Training, every
``log_every`` updates: ``train/loss``, ``train/action_loss``, ``train/grad_norm``, ``train/learning_rate``,
``train/n_updates``, ``train/aux_<name>`` (backbone aux losses), the backbone's diagnostics of the last update,
``time/samples_per_second`` and ``time/time_elapsed``. Evaluation, per target ``@<target>``:
``eval/return_mean``, ``eval/return_std``, ``eval/ep_length_mean``, ``eval/normalized_score``; the first
(highest) target also without suffix (``eval/return_mean`` selects ``best.pt``) and under the tags PPO logs
(``eval/mean_reward``, ``eval/mean_ep_length``), so one TensorBoard query compares both families.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rl_transformers import logging as L
from rl_transformers import tags as T
from rl_transformers.algos.dt_setup import target_label
from rl_transformers.algos.evaluation import EvalResult
from rl_transformers.utils.config_json import save_config

__all__ = ["AUX_PREFIX", "Window", "eval_scalars", "record_training", "write_eval_episodes"]

AUX_PREFIX = "train/aux_"
"""DT's tag prefix of backbone aux losses (PPO logs them as ``backbone/aux/<name>``)."""


class Window:
    """Sums of loss terms over the updates of one logging window (kept on device: no sync per update)."""

    def __init__(self, device: torch.device) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.aux: dict[str, torch.Tensor] = {}
        self.n = 0
        self.start = time.perf_counter()

    def add(self, terms: dict[str, Any]) -> None:
        self.n += 1
        for key in ("loss", "action_loss", "grad_norm"):
            self.sums[key] = self.sums.get(key, 0) + terms[key]
        for key, value in terms["aux"].items():
            self.aux[key] = self.aux.get(key, 0) + value

    def mean(self, key: str, aux: bool = False) -> float:
        return float((self.aux if aux else self.sums)[key]) / max(self.n, 1)


def record_training(
    logger: L.Logger,
    window: Window,
    last: dict[str, Any],
    *,
    learning_rate: float,
    step: int,
    batch_size: int,
    started: float,
) -> None:
    """Record the window's means, the last update's backbone diagnostics and the throughput (not written yet:
    the run's ``dump`` writes the row)."""
    logger.record(T.LOSS, window.mean("loss"))
    logger.record(T.ACTION_LOSS, window.mean("action_loss"))
    logger.record(T.GRAD_NORM, window.mean("grad_norm"))
    logger.record(T.LEARNING_RATE, learning_rate)
    logger.record(T.N_UPDATES, step)
    for name in window.aux:
        logger.record(f"{AUX_PREFIX}{name}", window.mean(name, aux=True))
    for key, value in last["info"].items():  # backbone diagnostics of the last update
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            logger.record(key, float(value))
        elif isinstance(value, int | float):
            logger.record(key, value)
    elapsed = time.perf_counter() - window.start
    logger.record(T.SAMPLES_PER_SECOND, window.n * batch_size / max(elapsed, 1e-9))
    logger.record(T.TIME_ELAPSED, time.perf_counter() - started)


def eval_scalars(results: Sequence[EvalResult], info: Any) -> dict[str, float]:
    """Evaluation scalars by tag (see the module docstring); ``info``: the dataset's reference scores."""
    values: dict[str, float] = {}
    for i, res in enumerate(results):
        label = target_label(res.target)
        mean = float(res.returns.mean())
        values[f"{T.EVAL_RETURN_MEAN}{label}"] = mean
        values[f"{T.EVAL_RETURN_STD}{label}"] = float(res.returns.std())
        values[f"{T.EVAL_EP_LENGTH_MEAN}{label}"] = float(res.lengths.mean())
        if res.successes is not None:  # episodes of an env that reports no flag count as failures
            values[f"{T.EVAL_SUCCESS_RATE}{label}"] = float(np.nan_to_num(res.successes, nan=0.0).mean())
        if info.ref_min_score is not None and info.ref_max_score is not None:
            score = float(np.mean(info.normalized_score(res.returns)))
            values[f"{T.EVAL_NORMALIZED_SCORE}{label}"] = score
            if i == 0:
                values[T.EVAL_NORMALIZED_SCORE] = score
        if i == 0:  # the first (highest) target: selects best.pt; also under PPO's tags
            values[T.EVAL_RETURN_MEAN] = mean
            values[T.EVAL_MEAN_REWARD] = mean
            values[T.EVAL_MEAN_EP_LENGTH] = float(res.lengths.mean())
            if res.successes is not None:
                values[T.EVAL_SUCCESS_RATE] = values[f"{T.EVAL_SUCCESS_RATE}{label}"]
    return values


def write_eval_episodes(run_dir: Path, step: int, results: Sequence[EvalResult]) -> Path:
    """``<run_dir>/eval/step_<step>.json`` (written atomically): every target's per-episode returns and
    lengths, and success flags (null: not reported) where the env reports them."""
    episodes = [
        {"target": r.target, "returns": r.returns.tolist(), "lengths": r.lengths.tolist()}
        | ({} if r.successes is None else {"successes": [None if x != x else bool(x) for x in r.successes]})
        for r in results
    ]
    return save_config(run_dir / "eval", {"step": step, "episodes": episodes}, filename=f"step_{step}.json")
