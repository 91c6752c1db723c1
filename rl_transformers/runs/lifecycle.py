"""One run lifecycle for every trainer: PPO (online), the Decision Transformer / BC (offline), anything later.

A trainer owns its model, data and update step, and its loop body (cleanrl's phases, per algorithm); everything
around the loop is written once, here, and :func:`train_run` is the one ``train()`` both trainers call:

1. **Session** (:func:`session`): torch CPU threads (``--threads``, default 1; None = cores / local processes),
   the device, and the distributed process group under ``torchrun`` (joined on entry, destroyed on exit
   whatever happens: the one place both trainers shut it down).
2. **Resume** (:func:`load_resume`): the newest readable checkpoint of ``--resume``, its saved config merged with
   this invocation by the trainer's rule (:mod:`rl_transformers.runs.resume`), and the run directory it belongs
   to (:func:`run_dir_of`).
3. **Run bookkeeping** (:class:`Run`, written by rank 0 only): the run directory
   ``<run_root>/<algo>/<env or dataset>/<YYYYmmdd-HHMMSS>-s<seed>/``, ``config.json``, the logger (TensorBoard,
   ``progress.jsonl``, the stdout table with ``--verbose``), the HParams session (fresh runs), the checkpoint
   manager (``step_<n>`` / ``last`` / ``best``), the parameter count, printed and logged (text tag
   ``run/summary``) at the start, and ``system_info.json``: per invocation (fresh or resumed) the command
   line, start step, git commit, versions and machine (:mod:`rl_transformers.runs.provenance`).
4. **The loop** (:meth:`Run.loop`): each iteration ends with :meth:`Run.end_iteration`, which checkpoints
   *before* it evaluates (an evaluation error never loses training, and ``best.pt`` is the evaluated model),
   then writes one log row. :meth:`Run.should_stop` turns Ctrl-C / SIGTERM (:class:`GracefulInterrupt`) or a
   callback's ``False`` into a stop that every rank agrees on. A non-finite loss raises
   :class:`~rl_transformers.utils.NonFiniteError` after a message naming the last good checkpoint.
5. **The end** (:meth:`Run.finish`): a last checkpoint unless the final step is saved already, and the
   outcome, whose ``metrics`` are the last *logged* values of the trainer's headline tags, so the final summary
   (:func:`summary_text`) prints exactly what TensorBoard shows, with the step and checkpoint file each number
   comes from (``sources``) and the checkpoint that ``best.pt`` holds (``best``).
"""

from __future__ import annotations

import contextlib
import datetime
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch
from torch import nn

from rl_transformers.runs.distributed import (
    DistContext,
    launched_context,
    setup_distributed,
    shutdown,
)
from rl_transformers.runs.run import Resumed, Run
from rl_transformers.runs.config import RunConfig
from rl_transformers.runs.checkpoint_load import latest_checkpoint, load_checkpoint
from rl_transformers.utils.errors import UserError
from rl_transformers.runs.resume import saved_config
from rl_transformers.utils.config_json import to_jsonable
from rl_transformers.utils.training import available_cores, set_threads

__all__ = [
    "RunResult",
    "RunSpec",
    "Trainer",
    "load_resume",
    "run_dir_of",
    "session",
    "summary_text",
    "train_run",
]

C = TypeVar("C")
RC = TypeVar("RC", bound=RunConfig)
T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

DIST_TIMEOUT = datetime.timedelta(hours=2)
"""Process-group timeout: ranks > 0 wait in the next collective while rank 0 evaluates (long rollouts)."""


def run_dir_of(path: str | Path) -> Path:
    """The run directory of a checkpoint file (``<run>/checkpoints/x.pt``), a ``checkpoints/`` directory or a
    run directory."""
    path = Path(path)
    if path.is_file():
        return path.parent.parent if path.parent.name == "checkpoints" else path.parent
    return path.parent if path.name == "checkpoints" else path


@contextlib.contextmanager
def session(
    device: str, threads: int | None, timeout: datetime.timedelta | None = DIST_TIMEOUT
) -> Iterator[tuple[DistContext, torch.device]]:
    """Threads, device and process group of one run: ``with session(cfg.device, cfg.threads) as (dist,
    device): ...``. The group (if any) is destroyed when the block exits, normally or not."""
    set_threads(threads or max(1, available_cores() // launched_context().local_world_size))
    dist, dev = setup_distributed(device, timeout)
    try:
        yield dist, dev
    finally:
        shutdown(dist)


def load_resume(
    config: C,
    cls: type[C],
    merge: Callable[[C, C, Path], C],
    required: Sequence[str] = (),
    kind: str = "",
) -> Resumed | None:
    """The checkpoint of ``config.resume`` (None without one) with ``merge(saved, config, source)`` applied.

    ``required``: checkpoint keys this trainer needs (a clear error names the missing ones and ``kind``)."""
    resume = getattr(config, "resume", None)
    if resume is None:
        return None
    source = latest_checkpoint(resume)
    if source is None:
        raise UserError(f"--resume {resume}: no checkpoint (last.pt / step_<n>.pt) found there")
    ckpt = load_checkpoint(source)
    missing = [k for k in required if k not in ckpt]
    if missing:
        raise UserError(f"checkpoint {source} lacks {missing}: not a {kind} checkpoint of rl_transformers")
    merged = merge(saved_config(cls, ckpt, source), config, Path(resume))
    return Resumed(merged, ckpt, source, run_dir_of(source))


@dataclass
class RunResult:
    """What a training run ended with: every trainer's ``train`` returns it (PPO, DT, BC), and so do
    :func:`rl_transformers.train_ppo` / :func:`rl_transformers.train_dt`. ``rl_transformers.load(result.run_dir)``
    gives the trained agent."""

    algo: str
    """``ppo``, ``dt`` or ``bc``."""
    run_dir: Path | None
    """The run directory (None off rank 0 under torchrun)."""
    step: int
    """Environment steps (PPO) or gradient updates (DT / BC) done."""
    interrupted: bool = False
    """Ctrl-C, SIGTERM or a callback stopped the run early (its last checkpoint is saved)."""
    target_reached: bool = False
    """An evaluation reached ``stop_at`` (``--stop-at``) and the run stopped there, its last checkpoint saved."""
    metrics: dict[str, float] = field(default_factory=dict)
    """The last logged value of each headline tag (what :func:`summary_text` prints)."""
    evaluations: dict[int, dict[str, float]] = field(default_factory=dict)
    """Logged evaluation scalars by step."""
    sources: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per headline tag: the ``step`` its value was logged at and the ``checkpoint`` file (in ``checkpoints/``)
    holding the model of that step, None when none is kept."""
    best: dict[str, Any] | None = None
    """What ``best.pt`` holds: its ``step``, the ``tag`` that ranks it and that tag's ``value``."""
    episode_returns: list[float] = field(default_factory=list)
    """PPO: returns of the last (up to 100) training episodes (their mean is the last rollout/ep_rew_mean)."""
    model: nn.Module | None = None
    """DT / BC: the trained model (None off rank 0)."""
    data_summary: dict[str, Any] = field(default_factory=dict)
    """DT / BC: the training data actually used (after %BC filtering): episodes, steps, return statistics."""


def summary_text(outcome: RunResult) -> str:
    """The final summary both training scripts print: JSON with the run directory, step, whether the run was
    interrupted or stopped at ``--stop-at``, the last logged values of the headline metrics (``metrics``, keyed by their tags), the step and
    checkpoint each comes from (``sources``) and what ``best.pt`` holds (``best``)."""
    data = {
        "algo": outcome.algo,
        "run_dir": None if outcome.run_dir is None else str(outcome.run_dir),
        "step": outcome.step,
        "interrupted": outcome.interrupted,
        "target_reached": outcome.target_reached,
        "metrics": outcome.metrics,
        "sources": outcome.sources,
        "best": outcome.best,
    }
    return json.dumps(to_jsonable(data, strict=False), indent=2)


# -- the one train() ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunSpec:
    """What a built trainer tells :func:`train_run` about its run."""

    algo: str
    name: str
    """The run directory's name component (env id, dataset)."""
    step: int
    """The trainer's step after any restore."""
    model: nn.Module
    """The model whose parameters are counted at the start."""
    best_metric: str | None
    best_label: str | None
    hparam_metrics: tuple[str, ...]
    headline: tuple[str, ...]
    keep_checkpoints: int
    facts: Mapping[str, Any]
    """What the run summary records besides the parameter count."""


class Trainer(Protocol[T_co]):
    """What :func:`train_run` needs of a trainer: built from (config, dist, device, resumed)."""

    def run_spec(self) -> RunSpec: ...
    def learn(self, run: Run, callback: Callable[[T_co], bool | None] | None = None) -> RunResult: ...
    def close(self) -> None: ...


def train_run(
    config: RC,
    resume: Callable[[RC], Resumed | None],
    build: Callable[[RC, DistContext, torch.device, Resumed | None], Trainer[T]],
    run_dir: Path | None = None,
    callback: Callable[[T], bool | None] | None = None,
) -> RunResult:
    """Build (or resume) a run, train it, close it: the ``train()`` of every trainer. ``resume(config)``: the
    checkpoint to continue (:func:`load_resume` with the trainer's merge rule), ``build``: the trainer (restored
    from it), whose :meth:`learn` runs the loop inside a :class:`Run` that only rank 0 writes."""
    resumed = resume(config)
    config = resumed.config if resumed is not None else config
    with session(config.device, config.threads) as (dist, device):
        trainer = build(config, dist, device, resumed)
        run = None
        try:
            spec = trainer.run_spec()
            run = Run(
                config,
                algo=spec.algo,
                name=spec.name,
                dist=dist,
                step=spec.step,
                resumed=resumed,
                run_dir=run_dir,
                best_metric=spec.best_metric,
                best_label=spec.best_label,
                hparam_metrics=spec.hparam_metrics,
                headline=spec.headline,
                keep_checkpoints=spec.keep_checkpoints,
            )
            run.announce(spec.model, spec.facts)
            return trainer.learn(run, callback)
        finally:
            if run is not None:
                run.close()
            trainer.close()
