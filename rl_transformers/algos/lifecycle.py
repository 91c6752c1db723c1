"""One run lifecycle for every trainer: PPO (online), the Decision Transformer / BC (offline), anything later.

A trainer owns its model, data and update step; everything around its loop is written once, here:

1. **Session** (:func:`session`): torch CPU threads (``--threads``, default 1; None = cores / local processes),
   the device, and the distributed process group under ``torchrun`` (joined on entry, destroyed on exit
   whatever happens: the one place both trainers shut it down).
2. **Resume** (:func:`load_resume`): the newest readable checkpoint of ``--resume``, its saved config merged with
   this invocation by the trainer's rule (:mod:`rl_transformers.utils.resume`), and the run directory it belongs
   to (:func:`run_dir_of`).
3. **Run bookkeeping** (:class:`Run`, written by rank 0 only): the run directory
   ``<run_root>/<algo>/<env or dataset>/<YYYYmmdd-HHMMSS>-s<seed>/``, ``config.json``, the logger (TensorBoard,
   ``progress.jsonl``, the stdout table with ``--verbose``), the HParams session (fresh runs), the checkpoint
   manager (``step_<n>`` / ``last`` / ``best``), the parameter count, printed and logged (text tag
   ``run/summary``) at the start, and ``system_info.json``: per invocation (fresh or resumed) the command
   line, start step, git commit, versions and machine (:mod:`rl_transformers.utils.provenance`).
4. **The loop** (:meth:`Run.loop`): each iteration ends with :meth:`Run.end_iteration`, which checkpoints
   *before* it evaluates (an evaluation error never loses training, and ``best.pt`` is the evaluated model),
   then writes one log row. :meth:`Run.should_stop` turns Ctrl-C / SIGTERM (:class:`GracefulInterrupt`) or a
   callback's ``False`` into a stop that every rank agrees on. A non-finite loss raises
   :class:`~rl_transformers.utils.NonFiniteError` after a message naming the last good checkpoint.
5. **The end** (:meth:`Run.finish`): a last checkpoint unless the final step is saved already, and the
   outcome, whose ``metrics`` are the last *logged* values of the trainer's headline tags, so the final summary
   (:func:`summary_text`) prints exactly what TensorBoard shows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from rl_transformers.algos.distributed import (
    DistContext,
    any_rank,
    launched_context,
    setup_distributed,
    shutdown,
)
from rl_transformers.algos.run_config import INVOCATION_FIELDS
from rl_transformers.logging import Logger
from rl_transformers.utils import (
    CheckpointManager,
    GracefulInterrupt,
    NonFiniteError,
    available_cores,
    latest_checkpoint,
    load_checkpoint,
    make_run_dir,
    save_config,
    set_threads,
    to_jsonable,
)
from rl_transformers.utils.errors import UserError
from rl_transformers.utils.provenance import SYSTEM_INFO_FILE, record_invocation
from rl_transformers.utils.resume import saved_config

__all__ = [
    "Resumed",
    "Run",
    "RunOutcome",
    "count_parameters",
    "load_resume",
    "run_dir_of",
    "saved_form",
    "session",
    "summary_text",
]

C = TypeVar("C")

DIST_TIMEOUT = datetime.timedelta(hours=2)
"""Process-group timeout: ranks > 0 wait in the next collective while rank 0 evaluates (long rollouts)."""


def run_dir_of(path: str | Path) -> Path:
    """The run directory of a checkpoint file (``<run>/checkpoints/x.pt``), a ``checkpoints/`` directory or a
    run directory."""
    path = Path(path)
    if path.is_file():
        return path.parent.parent if path.parent.name == "checkpoints" else path.parent
    return path.parent if path.name == "checkpoints" else path


def count_parameters(model: nn.Module) -> int:
    """Number of parameters (trainable or not) of ``model``."""
    return sum(p.numel() for p in model.parameters())


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


@dataclass
class Resumed:
    """What ``--resume`` found: the merged config, the checkpoint, its file and its run directory."""

    config: Any
    checkpoint: dict[str, Any]
    source: Path
    run_dir: Path


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
class RunOutcome:
    """What every trainer's ``train`` returns (each trainer's result extends it)."""

    algo: str
    run_dir: Path | None
    """The run directory (None off rank 0 under torchrun)."""
    step: int
    """Environment steps (PPO) or gradient updates (DT / BC) done."""
    interrupted: bool = False
    """Ctrl-C, SIGTERM or a callback stopped the run early (its last checkpoint is saved)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """The last logged value of each headline tag (what :func:`summary_text` prints)."""
    evaluations: dict[int, dict[str, float]] = field(default_factory=dict)
    """Logged evaluation scalars by step."""


def summary_text(outcome: RunOutcome) -> str:
    """The final summary both training scripts print: JSON with the run directory, step, whether the run was
    interrupted, and the last logged values of the headline metrics (``metrics``, keyed by their tags)."""
    data = {
        "algo": outcome.algo,
        "run_dir": None if outcome.run_dir is None else str(outcome.run_dir),
        "step": outcome.step,
        "interrupted": outcome.interrupted,
        "metrics": outcome.metrics,
    }
    return json.dumps(to_jsonable(data, strict=False), indent=2)


class Run:
    """Rank-0 bookkeeping of one training run, and the stop / save / evaluate rules of its loop.

    Args:
        config: the run's config (a :class:`~rl_transformers.algos.run_config.RunConfig`; ``run_root``, ``seed``,
            ``verbose``, ``progress`` are read).
        algo, name: the run directory is ``<run_root>/<algo>/<name>/<stamp>-s<seed>/``.
        dist: this process's place in the job.
        step: the trainer's step after any restore (the resumed step, else 0).
        resumed: what :func:`load_resume` found (the run directory and the purge step come from it).
        run_dir: a fixed run directory (tests, Python callers); default: a fresh one.
        best_metric: the tag that selects ``best.pt`` (None: no best.pt).
        hparam_metrics: the tags the HParams dashboard lists first.
        headline: the tags of the final summary.
        keep_checkpoints: ``step_<n>.pt`` files kept.
    """

    def __init__(
        self,
        config: Any,
        *,
        algo: str,
        name: str,
        dist: DistContext,
        step: int = 0,
        resumed: Resumed | None = None,
        run_dir: str | Path | None = None,
        best_metric: str | None = None,
        hparam_metrics: Sequence[str] = (),
        headline: Sequence[str] = (),
        keep_checkpoints: int = 3,
    ) -> None:
        self.config, self.algo, self.dist = config, algo, dist
        self.headline = tuple(headline)
        self.start_step = step
        self.resumed = resumed is not None
        self.latest: dict[str, float] = {}
        self.evaluations: dict[int, dict[str, float]] = {}
        self.saved_step: int | None = step if resumed is not None else None
        self.interrupted = False
        self.dir: Path | None = None
        self.logger: Logger | None = None
        self.checkpoints: CheckpointManager | None = None
        self._interrupt: GracefulInterrupt | None = None
        self._bar: Any = None
        if not dist.is_main:
            return
        if resumed is not None:
            self.dir = resumed.run_dir
        elif run_dir is not None:
            self.dir = Path(run_dir)
        else:
            self.dir = make_run_dir(config.run_root, algo=algo, name=name, seed=config.seed)
        self.dir.mkdir(parents=True, exist_ok=True)
        save_config(self.dir, saved_form(config))
        self.logger = Logger(self.dir, stdout=config.verbose, purge_step=step + 1 if resumed else None)
        if resumed is None:
            self.logger.log_hparams(config, {tag: None for tag in hparam_metrics})
        self.checkpoints = CheckpointManager(
            self.dir, keep_last=keep_checkpoints, metric=best_metric, mode="max"
        )

    @property
    def is_main(self) -> bool:
        return self.dist.is_main

    # -- start ----------------------------------------------------------------------------------------------
    def announce(self, model: nn.Module, facts: Mapping[str, Any] | None = None) -> int:
        """Print the parameter count and run directory (rank 0), log them with ``facts`` as the text tag
        ``run/summary`` (fresh runs), append this invocation's command, commit and machine to
        ``system_info.json`` (every invocation, resumes included); returns the count."""
        n = count_parameters(model)
        if not self.is_main:
            return n
        print(f"{self.algo}: {n:,} parameters; run directory {self.dir}", flush=True)
        if self.dir is not None:
            device = next(model.parameters(), torch.empty(0)).device
            try:
                record_invocation(self.dir, device, step=self.start_step, world_size=self.dist.world_size)
            except OSError as err:  # provenance never stops a run
                print(f"warning: could not write {self.dir / SYSTEM_INFO_FILE}: {err}", file=sys.stderr)
        if not self.resumed and self.logger is not None:
            summary = {"n_parameters": n, "world_size": self.dist.world_size, **dict(facts or {})}
            text = json.dumps(to_jsonable(summary, strict=False), indent=2)
            self.logger.text("run/summary", "```\n" + text + "\n```")
        return n

    def progress_bar(self, total: int, initial: int, unit: str = "it", desc: str | None = None) -> None:
        """A tqdm bar on rank 0 when ``config.progress`` (advanced by :meth:`advance`, closed at the end)."""
        if self.is_main and self.config.progress:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, initial=initial, unit=unit, desc=desc, dynamic_ncols=True)

    def advance(self, n: int, **postfix: Any) -> None:
        if self._bar is not None:
            if postfix:
                self._bar.set_postfix(refresh=False, **postfix)
            self._bar.update(n)

    # -- the loop -------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def loop(self) -> Iterator[GracefulInterrupt]:
        """Around the training loop: Ctrl-C handling, the non-finite report, the progress bar's end."""
        try:
            with GracefulInterrupt(message=self.is_main) as interrupt:
                self._interrupt = interrupt
                yield interrupt
        except NonFiniteError as err:
            self._report_non_finite(err)
            raise
        finally:
            self._interrupt = None
            if self._bar is not None:
                self._bar.close()
                self._bar = None

    def should_stop(self, requested: bool = False) -> bool:
        """True on every rank when any rank got Ctrl-C / SIGTERM or passes ``requested`` (a collective: call it
        once per iteration on every rank)."""
        flag = requested or (self._interrupt is not None and self._interrupt.requested)
        stop = any_rank(flag, self.dist)
        self.interrupted = self.interrupted or stop
        return stop

    def end_iteration(
        self,
        step: int,
        checkpoint: Callable[[], dict[str, Any] | None],
        *,
        save: bool = False,
        evaluate: Callable[[], tuple[dict[str, float], float | None]] | None = None,
    ) -> dict[str, float]:
        """Close iteration ``step``: checkpoint when ``save`` or evaluating, *then* evaluate (rank 0), then write
        the log row. ``checkpoint()`` runs on every rank (it may be a collective) and returns the payload on
        rank 0; ``evaluate()`` returns (scalars by tag, the value that ranks best.pt). Returns the scalars."""
        if save or evaluate is not None:
            self.save(step, checkpoint)
        values: dict[str, float] = {}
        if evaluate is not None and self.is_main:
            values, best = evaluate()
            self.evaluations[step] = dict(values)
            if self.checkpoints is not None:
                self.checkpoints.update_metric(step, best)
            if self.logger is not None:
                for key, value in values.items():
                    self.logger.record(key, value)
        self.dump(step)
        return values

    def save(self, step: int, checkpoint: Callable[[], dict[str, Any] | None]) -> None:
        """Checkpoint ``step`` unless it is saved already."""
        if self.saved_step == step:
            return
        payload = checkpoint()
        if self.checkpoints is not None and payload is not None:
            self.checkpoints.save(payload, step)
        self.saved_step = step

    def dump(self, step: int) -> dict[str, Any]:
        """Write the logger's window at ``step`` (rank 0); remembers the values for the final summary."""
        if self.logger is None:
            return {}
        values = self.logger.dump(step)
        self.latest.update({k: v for k, v in values.items() if isinstance(v, int | float)})
        return values

    # -- the end --------------------------------------------------------------------------------------------
    def finish(self, step: int, checkpoint: Callable[[], dict[str, Any] | None]) -> dict[str, float]:
        """Save the final step unless saved; report a stop; return the headline metrics (last logged)."""
        self.save(step, checkpoint)
        if self.interrupted and self.is_main and self.checkpoints is not None:
            print(f"stopped at step {step}; checkpoint {self.checkpoints.last_path}", file=sys.stderr)
        return {tag: self.latest[tag] for tag in self.headline if tag in self.latest}

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self.logger is not None:
            self.logger.close()

    def _report_non_finite(self, err: NonFiniteError) -> None:
        if not self.is_main:
            return
        last = self.checkpoints.last_path if self.checkpoints is not None else None
        where = last if last is not None and last.exists() else None
        message = f"stopping: {err}. " + (
            f"The last good checkpoint is {where}." if where else "No checkpoint was written."
        )
        print(message, file=sys.stderr)
        if self.logger is not None:
            self.logger.text("errors", message, step=int(err.step or 0))


def saved_form(config: Any) -> Any:
    """``config`` as a checkpoint or ``config.json`` stores it: the per-invocation fields (``resume``,
    ``trust_checkpoint``, ``allow_env_modules``: :data:`~rl_transformers.algos.run_config.INVOCATION_FIELDS`)
    reset, so a saved file never carries (or grants) them."""
    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        return config
    fresh = {name: value for name, value in INVOCATION_FIELDS.items() if hasattr(config, name)}
    return dataclasses.replace(config, **fresh) if fresh else config


_without_invocation_fields = saved_form  # old name
