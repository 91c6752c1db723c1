"""A training run's rank-0 bookkeeping and the stop / save / evaluate rules of its loop (:class:`Run`; the
lifecycle around it: :mod:`rl_transformers.runs.lifecycle`)."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rl_transformers.runs.distributed import DistContext, any_rank
from rl_transformers.runs.config import saved_form
from rl_transformers.logging import Logger
from rl_transformers.runs.checkpoint import CheckpointManager
from rl_transformers.utils.params import count_parameters
from rl_transformers.runs.provenance import SYSTEM_INFO_FILE, record_invocation
from rl_transformers.runs.lock import RunLock, claim_run
from rl_transformers.runs.run_dirs import make_run_dir
from rl_transformers.utils.config_json import save_config, to_jsonable
from rl_transformers.utils.training import GracefulInterrupt, NonFiniteError

__all__ = ["Resumed", "Run"]

EVALUATING = "evaluation_due"
"""Checkpoint key: True when the checkpoint was saved for an evaluation that follows it (:meth:`Run.end_iteration`),
so a resume can tell an evaluation a kill cut short (:meth:`Run.evaluation_lost`)."""


@dataclass
class Resumed:
    """What ``--resume`` found: the merged config, the checkpoint, its file and its run directory."""

    config: Any
    checkpoint: dict[str, Any]
    source: Path
    run_dir: Path


class Run:
    """Rank-0 bookkeeping of one training run, and the stop / save / evaluate rules of its loop.

    Args:
        config: the run's config (a :class:`~rl_transformers.runs.config.RunConfig`; ``run_root``, ``seed``,
            ``verbose``, ``progress`` are read).
        algo, name: the run directory is ``<run_root>/<algo>/<name>/<stamp>-s<seed>/``.
        dist: this process's place in the job.
        step: the trainer's step after any restore (the resumed step, else 0).
        resumed: what :func:`load_resume` found (the run directory and the purge step come from it).
        run_dir: a fixed run directory (tests, Python callers); default: a fresh one.
        best_metric: the tag that selects ``best.pt`` (None: no best.pt).
        best_label: how the summary names it (default ``best_metric``; DT: the tag with its target).
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
        best_label: str | None = None,
        hparam_metrics: Sequence[str] = (),
        headline: Sequence[str] = (),
        keep_checkpoints: int = 3,
    ) -> None:
        self.config, self.algo, self.dist = config, algo, dist
        self.headline = tuple(headline)
        self.start_step = step
        self.resumed = resumed is not None
        self.latest: dict[str, float] = {}
        self.latest_step: dict[str, int] = {}
        self.best_label = best_label or best_metric
        self.evaluations: dict[int, dict[str, float]] = {}
        self.saved_step: int | None = step if resumed is not None else None
        self._resumed_before_evaluating = resumed is not None and bool(resumed.checkpoint.get(EVALUATING))
        self.interrupted = False
        self.reached: float | None = None  # the evaluation value that met config.stop_at (rank 0)
        self.target_reached = False
        self.dir: Path | None = None
        self.logger: Logger | None = None
        self.checkpoints: CheckpointManager | None = None
        self._interrupt: GracefulInterrupt | None = None
        self._bar: Any = None
        self._lock: RunLock | None = None
        if not dist.is_main:
            return
        if resumed is not None:
            self.dir = resumed.run_dir
        elif run_dir is not None:
            self.dir = Path(run_dir)
        else:
            self.dir = make_run_dir(config.run_root, algo=algo, name=name, seed=config.seed)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = claim_run(self.dir)  # one process per run; no symbolic link out of it (runs/lock.py)
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
        n = count_parameters(model, trainable_only=False)
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
        if getattr(self.config, "stop_at", None) is not None:  # the same on every rank: the collective matches
            self.target_reached = any_rank(self.reached is not None, self.dist)
        stop = any_rank(flag, self.dist)
        self.interrupted = self.interrupted or stop
        return stop or self.target_reached

    def evaluation_lost(self, step: int) -> bool:
        """Whether this run resumed from a checkpoint of ``step`` saved for an evaluation (:data:`EVALUATING`) that
        no logged row holds: :meth:`end_iteration` saves before it evaluates, so a kill between the two leaves the
        checkpoint without its evaluation. The trainer then runs :meth:`end_iteration` at ``step`` first (which
        saves nothing again). Rank 0 only: it alone evaluates and logs."""
        path = self.logger.jsonl_path if self.logger is not None else None
        if not (self._resumed_before_evaluating and step == self.saved_step and path is not None and path.exists()):
            return False
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # a line a kill cut short
                continue
            if row.get("step") == step and any(str(key).startswith("eval/") for key in row):
                return False
        return True

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
            self.save(step, checkpoint, evaluating=evaluate is not None)
        values: dict[str, float] = {}
        if evaluate is not None and self.is_main:
            values, best = evaluate()
            self.evaluations[step] = dict(values)
            if self.checkpoints is not None:
                self.checkpoints.update_metric(step, best)
            stop_at = getattr(self.config, "stop_at", None)
            if stop_at is not None and best is not None and best >= stop_at:
                self.reached = best
            if self.logger is not None:
                for key, value in values.items():
                    self.logger.record(key, value)
        self.dump(step)
        return values

    def save(
        self, step: int, checkpoint: Callable[[], dict[str, Any] | None], evaluating: bool = False
    ) -> None:
        """Checkpoint ``step`` unless it is saved already; ``evaluating``: an evaluation of it follows."""
        if self.saved_step == step:
            return
        payload = checkpoint()
        if payload is not None:
            payload[EVALUATING] = evaluating
        if self.checkpoints is not None and payload is not None:
            self.checkpoints.save(payload, step)
        self.saved_step = step

    def dump(self, step: int) -> dict[str, Any]:
        """Write the logger's window at ``step`` (rank 0); remembers the values for the final summary."""
        if self.logger is None:
            return {}
        values = self.logger.dump(step)
        numbers = {k: v for k, v in values.items() if isinstance(v, int | float)}
        self.latest.update(numbers)
        self.latest_step.update(dict.fromkeys(numbers, step))
        return values

    # -- the end --------------------------------------------------------------------------------------------
    def finish(self, step: int, checkpoint: Callable[[], dict[str, Any] | None]) -> dict[str, float]:
        """Save the final step unless saved; report a stop; return the headline metrics (last logged; their
        steps and checkpoints: :meth:`sources`)."""
        self.save(step, checkpoint)
        if self.is_main and self.checkpoints is not None:
            if self.interrupted:
                print(f"stopped at step {step}; checkpoint {self.checkpoints.last_path}", file=sys.stderr)
            elif self.target_reached:
                print(
                    f"--stop-at {self.config.stop_at:g} reached at step {step} ({self.best_label} "
                    f"{self.reached:.4g}); checkpoint {self.checkpoints.last_path}",
                    file=sys.stderr,
                )
        return {tag: self.latest[tag] for tag in self.headline if tag in self.latest}

    def sources(self) -> dict[str, dict[str, Any]]:
        """Per headline tag (logged): the step of its last value and the checkpoint file of that step, named
        ``last.pt`` for the last save, ``best.pt`` for the best one, else ``step_<n>.pt`` while it is kept."""
        return {tag: self._source(self.latest_step[tag]) for tag in self.headline if tag in self.latest_step}

    def best(self) -> dict[str, Any] | None:
        """What ``best.pt`` holds (step, ranking tag, value); None when it is not tracked or not written."""
        manager = self.checkpoints
        if manager is None or manager.best_step is None or not manager.best_path.is_file():
            return None
        return {
            "checkpoint": "best.pt",
            "step": manager.best_step,
            "tag": self.best_label,
            "value": manager.best_value,
        }

    def _source(self, step: int) -> dict[str, Any]:
        manager, name = self.checkpoints, None
        if manager is not None:
            if manager.last_step == step and manager.last_path.is_file():
                name = manager.last_path.name
            elif manager.best_step == step and manager.best_path.is_file():
                name = manager.best_path.name
            elif manager.step_path(step).is_file():
                name = manager.step_path(step).name
        return {"step": step, "checkpoint": name}

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self.logger is not None:
            self.logger.close()
        if self._lock is not None:
            self._lock.release()

    def _report_non_finite(self, err: NonFiniteError) -> None:
        if not self.is_main:
            return
        where = self.checkpoints.last_good() if self.checkpoints is not None else None
        message = f"stopping: {err}. " + (
            f"The last good checkpoint is {where}." if where else "No checkpoint was written."
        )
        print(message, file=sys.stderr)
        if self.logger is not None:
            self.logger.text("errors", message, step=int(err.step or 0))
