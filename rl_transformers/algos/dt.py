"""Offline trainer for the Decision Transformer (and, with ``algo="bc"``, behaviour cloning / %BC).

Method (Chen et al. 2021, arXiv 2106.01345): sample B windows of K steps ∝ episode length
(:class:`~rl_transformers.algos.dt_data.TrajectoryDataset`), predict every a_t from its state token, minimise
the masked action loss (MSE for Box, cross-entropy for Discrete) plus the backbone's aux losses, with AdamW,
a linear learning-rate warm-up then a constant rate, and gradient-norm clipping. States are normalised with
the dataset's mean / std and returns-to-go scaled by ``return_scale`` inside the model, so the checkpoint
(which holds both) is all a rollout needs. Defaults are the paper's: lr 1e-4, weight decay 1e-4, warm-up
10k, clip 0.25, batch 64, K = 20, 100k updates.

Evaluation every ``eval_every`` updates (and at the end): for each target return, ``eval_episodes`` episodes
in the dataset's evaluation env with deterministic actions, reset seeds ``eval_seed + i`` (i = 0 ..
episodes − 1, the same for every target and every evaluation). The default ``eval_seed = 1_000_000`` lies
outside the seeds of the local dataset builder (``offline_data.build``: 10M and up) and of Minari's scripts
(123 + episode); when the dataset records episode seeds, an overlap is refused. Logged: ``eval/return_mean@<target>``,
``eval/return_std@..``, ``eval/ep_length_mean@..``, ``eval/normalized_score@..`` (dataset references,
100·(R − min)/(max − min)), and ``eval/return_mean`` / ``eval/normalized_score`` for the first (highest)
target, which selects ``best.pt``; ``last.pt`` is the latest save (labels in ``checkpoints/index.json``). The
final summary names each number with its target (``eval/return_mean@<target>``, every target) and the step and
checkpoint it comes from.

Distributed: under ``torchrun --nproc_per_node N`` (``WORLD_SIZE`` > 1) the model is wrapped in
DistributedDataParallel (gloo on CPU, nccl on GPU); ``batch_size`` is the global batch, each rank samples
``batch_size / N`` windows from its own generator. Rank 0 logs, evaluates and writes checkpoints holding every
rank's RNG states, so a resume continues each rank's stream. Run directory, resume, Ctrl-C, non-finite stop,
save-then-evaluate, process group and final summary: :mod:`rl_transformers.runs.lifecycle` (shared with PPO).
Set-up decisions (env, targets, return scale, seeds): :mod:`~rl_transformers.algos.dt_setup`; checkpoints:
:mod:`~rl_transformers.algos.dt_checkpoint`; logged tags: :mod:`~rl_transformers.algos.dt_logging`.
"""

from __future__ import annotations

import functools
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from envs.spec_record import evaluated_spec
from rl_transformers import logging as L
from rl_transformers import tags as T
from rl_transformers.algos.dt_checkpoint import REQUIRED_KEYS
from rl_transformers.algos.dt_config import RESUME_MUTABLE, RESUME_PER_INVOCATION, DTConfig
from rl_transformers.algos.dt_data import TrajectoryDataset, segment_backward
from rl_transformers.algos.dt_logging import Window, eval_scalars, record_training, write_eval_episodes
from rl_transformers.algos.dt_setup import (
    check_eval_seeds,
    dataset_name,
    default_return_scale,
    default_targets,
    env_factory,
    episode_embedding_rows,
    target_label,
    time_limit,
)
from rl_transformers.algos.evaluation import evaluate_dt
from rl_transformers.policies.decision_transformer import DecisionTransformer
from rl_transformers.runs.config import saved_form
from rl_transformers.runs.distributed import DistContext, gather_objects
from rl_transformers.runs.lifecycle import RunResult, RunSpec, load_resume, train_run
from rl_transformers.runs.resume import merge_resume
from rl_transformers.runs.run import Resumed, Run
from rl_transformers.utils.config_json import to_jsonable
from rl_transformers.utils.errors import UserError
from rl_transformers.utils.rng import capture_rng_state, restore_rng_state
from rl_transformers.utils.training import check_finite, linear_warmup, seed_everything, warmup_cosine

__all__ = ["DTTrainer", "train"]

BEST_METRIC = T.EVAL_RETURN_MEAN
"""The tag that selects best.pt: the mean return of the first (highest) target."""
FUSED_ADAMW_DEVICES = frozenset({"cpu", "cuda"})
"""Devices where AdamW runs ``fused=True`` (one kernel per step instead of one loop per parameter; the same
update, tested against the per-parameter loop in tests/algos/test_dt_optimizer.py)."""


def headline(targets: list[float | None]) -> tuple[str, ...]:
    """Tags of the final summary (their last logged values): each target's mean return and normalised score,
    named with the target (``eval/return_mean@3600``; BC's one unconditioned evaluation has no suffix), and
    the success rate where the env reports one, then the loss."""
    per_target = [
        f"{tag}{target_label(target)}"
        for target in targets
        for tag in (T.EVAL_RETURN_MEAN, T.EVAL_NORMALIZED_SCORE, T.EVAL_SUCCESS_RATE)
    ]
    return (*per_target, T.LOSS)


def _merge(saved: DTConfig, given: DTConfig, source: Path) -> DTConfig:
    return merge_resume(
        saved, given, mutable=RESUME_MUTABLE, per_invocation=RESUME_PER_INVOCATION, source=source
    )


def _optimiser(
    model: nn.Module, config: DTConfig, device: torch.device
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over ``model`` and its learning-rate schedule (linear warmup, then constant or cosine decay)."""
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=config.learning_rate,
        weight_decay=config.weight_decay,
        betas=config.betas,
        fused=device.type in FUSED_ADAMW_DEVICES or None,  # one kernel per step, the same AdamW update
    )
    warmup, total = config.warmup_steps, config.total_steps
    if config.lr_decay == "cosine":
        factor = lambda s: warmup_cosine(s, warmup, total)  # noqa: E731
    else:
        factor = lambda s: linear_warmup(s, warmup)  # noqa: E731
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


class DTTrainer:
    """Data, model and optimiser of one run (built in ``__init__``, restored from ``resumed``); :meth:`learn`
    trains inside a :class:`~rl_transformers.runs.run.Run`."""

    def __init__(
        self,
        config: DTConfig,
        dist: DistContext,
        device: torch.device,
        resumed: Resumed | None = None,
    ) -> None:
        from offline_data.loading import load_episodes

        self.config, self.dist, self.device = config, dist, device
        seed_everything(config.seed + dist.rank)
        self.sampler_rng = np.random.default_rng([config.seed, dist.rank])
        if config.batch_size % dist.world_size:
            raise UserError(
                f"batch_size={config.batch_size} (--batch-size) is not divisible by the {dist.world_size} ranks"
            )
        self.local_batch = config.batch_size // dist.world_size

        # Data, evaluation env, derived settings (algos/dt_setup.py).
        episodes, self.info = load_episodes(
            config.dataset,
            root=config.dataset_root,
            env_id=config.env_id,
            allow_env_modules=config.allow_env_modules,
        )
        self.data = TrajectoryDataset(
            episodes,
            discrete_actions=self.info.discrete_actions,
            discrete_observations=isinstance(self.info.observation_space, gym.spaces.Discrete),
            top_fraction=config.bc_top_fraction,
        )
        check_eval_seeds(episodes, config)
        self.make_env = env_factory(config, self.info)
        env_limit = time_limit(self.make_env) if config.eval_episodes > 0 else None
        self.max_ep_len = episode_embedding_rows(config.max_ep_len, int(self.data.lengths.max()), env_limit)
        self.max_eval_steps = None if env_limit is not None else self.max_ep_len
        name = self.info.env_id or self.info.dataset_id or config.dataset
        self.return_scale = config.return_scale or default_return_scale(self.data.returns, name)
        self.targets: list[float | None] = default_targets(config, self.data.returns)

        # Model and optimisation.
        self.model = DecisionTransformer(
            self.info.observation_space,
            self.info.action_space,
            config.backbone,
            config.context_len,
            self.max_ep_len,
            return_scale=self.return_scale,
            condition_on_return=config.algo == "dt",
            embed_dropout=config.embed_dropout,
            padding=config.padding,
            segments=config.segments,
        )
        if not self.model.discrete_observations:
            self.model.set_state_normalization(*self.data.state_stats())
        self.model.to(device)
        self.optimizer, self.scheduler = _optimiser(self.model, config, device)
        self.step = 0
        if resumed is not None:
            self.load_checkpoint_state(resumed.checkpoint)
        self.net: nn.Module = self.model
        if dist.enabled:
            ids = [device.index] if device.type == "cuda" else None
            self.net = nn.parallel.DistributedDataParallel(self.model, device_ids=ids)
        self.run_dir: Path | None = None
        """Set by :meth:`learn` (rank 0): evaluations write ``eval/step_<n>.json`` there."""
        self.eval_envs: list[gym.Env] = []
        if dist.is_main and self.make_env is not None and config.eval_episodes > 0:
            n_envs = min(config.eval_envs, config.eval_episodes)
            self.eval_envs = [self.make_env() for _ in range(n_envs)]

    @property
    def name(self) -> str:
        """The run directory's name component: the dataset id or file stem."""
        return dataset_name(self.config, self.info)

    def facts(self) -> dict[str, Any]:
        """What the run summary records besides the parameter count."""
        return {
            "dataset": self.data.describe(),
            "return_scale": self.return_scale,
            "max_ep_len": self.max_ep_len,
            "targets": self.targets,
        }

    def run_spec(self) -> RunSpec:
        """What the run records (:func:`~rl_transformers.runs.lifecycle.train_run`)."""
        return RunSpec(
            algo=self.config.algo,
            name=self.name,
            step=self.step,
            model=self.model,
            best_metric=BEST_METRIC,
            best_label=f"{BEST_METRIC}{target_label(self.targets[0])}",
            hparam_metrics=(BEST_METRIC, T.EVAL_NORMALIZED_SCORE, T.LOSS),
            headline=headline(self.targets),
            keep_checkpoints=self.config.keep_checkpoints,
            facts=self.facts(),
        )

    # -- one update -----------------------------------------------------------------------------------------
    def update(self, collect_info: bool = False) -> dict[str, Any]:
        """Sample a batch, one optimiser step; returns detached loss terms (and diagnostics if asked).

        With ``segments`` > 1 the batch is N consecutive segments per window (:func:`segment_backward`)."""
        config, model = self.config, self.model
        if config.segments > 1:
            self.optimizer.zero_grad(set_to_none=True)
            batches = self.data.sample_segments(
                self.local_batch, config.context_len, config.segments, self.sampler_rng
            )
            terms = segment_backward(
                self.net, model, [b.to(self.device) for b in batches], config.aux_weight, collect_info
            )
        else:
            if config.window_starts == "aligned":
                (batch,) = self.data.sample_segments(
                    self.local_batch, config.context_len, 1, self.sampler_rng
                )
            else:
                batch = self.data.sample(
                    self.local_batch, config.context_len, self.sampler_rng, config.padding
                )
            batch = batch.to(self.device)
            model.backbone.collect_info = collect_info
            try:
                out = self.net(**batch.model_inputs())
            finally:
                model.backbone.collect_info = False
            action_loss = model.action_loss(out.predictions, batch.actions, batch.mask)
            loss = action_loss
            for name, value in out.aux_losses.items():
                loss = loss + config.aux_weight(name) * value
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            terms = {
                "loss": loss.detach(),
                "action_loss": action_loss.detach(),
                "aux": {name: value.detach() for name, value in out.aux_losses.items()},
                "info": out.info,
            }
        grad_norm = nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        return {**terms, "grad_norm": grad_norm.detach()}

    # -- the loop ---------------------------------------------------------------------------------------------
    def learn(self, run: Run, callback: Callable[[DTTrainer], bool | None] | None = None) -> RunResult:
        """Train to ``total_steps``. Each update: sample and step, log every ``log_every``, then checkpoint and
        evaluate when due (:meth:`Run.end_iteration`: saved before evaluating; always at the last update).
        ``callback(trainer)`` after each update; False stops the run (as Ctrl-C does)."""
        config = self.config
        self.run_dir = run.dir
        self._t0 = time.perf_counter()
        self._window = Window(self.device)
        run.progress_bar(config.total_steps, self.step, unit="update", desc=f"{config.algo} {self.name}")
        with run.loop():
            if run.evaluation_lost(self.step):  # resumed from a checkpoint whose evaluation a kill cut short
                run.end_iteration(self.step, self.checkpoint, evaluate=self._evaluation)
            while self.step < config.total_steps:
                log_now = (self.step + 1) % config.log_every == 0
                terms = self.update(collect_info=log_now)
                self._window.add(terms)
                final = self.step >= config.total_steps
                eval_now = final or (config.eval_every > 0 and self.step % config.eval_every == 0)
                save_now = self.step % config.save_every == 0
                postfix = {}
                if log_now or save_now or eval_now:  # never log or save a non-finite model
                    mean_loss = check_finite(self._window.mean("loss"), T.LOSS, self.step)
                    postfix = {"loss": f"{mean_loss:.4f}"}
                if log_now:
                    if run.logger is not None:
                        self._record(run.logger, terms)
                    self._window = Window(self.device)
                run.end_iteration(
                    self.step,
                    self.checkpoint,
                    save=save_now,
                    evaluate=self._evaluation if eval_now else None,
                )
                run.advance(1, **postfix)
                if run.should_stop(callback is not None and callback(self) is False):
                    break
        return RunResult(
            algo=config.algo,
            run_dir=run.dir,
            step=self.step,
            interrupted=run.interrupted,
            target_reached=run.target_reached,
            metrics=run.finish(self.step, self.checkpoint),
            evaluations=run.evaluations,
            sources=run.sources(),
            best=run.best(),
            model=self.model,
            data_summary=self.data.describe(),
        )

    def _record(self, logger: L.Logger, last: dict[str, Any]) -> None:
        record_training(
            logger,
            self._window,
            last,
            learning_rate=cast(float, self.scheduler.get_last_lr()[0]),
            step=self.step,
            batch_size=self.config.batch_size,
            started=self._t0,
        )

    # -- evaluation -------------------------------------------------------------------------------------------
    def _evaluation(self) -> tuple[dict[str, float], float | None]:
        """Logged eval scalars and the best.pt value; the time spent is left out of the throughput."""
        t_eval = time.perf_counter()
        values = self.evaluate()
        self._window.start += time.perf_counter() - t_eval
        return values, values.get(BEST_METRIC)

    def evaluate(self) -> dict[str, float]:
        """Roll out every target (rank 0); eval scalars by tag (:func:`~rl_transformers.algos.dt_logging.
        eval_scalars`), episodes written to eval/step_<n>.json.

        The global RNG states are restored afterwards: evaluating never changes the training stream."""
        if not self.eval_envs:
            return {}
        rng = capture_rng_state()
        try:
            results = evaluate_dt(
                self.model,
                self.make_env,  # type: ignore[arg-type]
                self.targets,
                self.config.eval_episodes,
                self.config.eval_seed,
                envs=self.eval_envs,
                max_steps=self.max_eval_steps,
            )
        finally:
            restore_rng_state(rng)
        if self.run_dir is not None:
            write_eval_episodes(self.run_dir, self.step, results)
        return eval_scalars(results, self.info)

    # -- checkpoints ------------------------------------------------------------------------------------------
    def checkpoint(self) -> dict[str, Any] | None:
        """The checkpoint payload (tensors and plain data: module docstring of
        :mod:`~rl_transformers.algos.dt_checkpoint`; collective under DDP: gathers every rank's RNG states; None
        off rank 0)."""
        rngs = gather_objects(capture_rng_state(), self.dist)
        samplers = gather_objects(self.sampler_rng.bit_generator.state, self.dist)
        if not self.dist.is_main:
            return None
        info = self.info
        return {
            "model": self.model.state_dict(),
            "model_kwargs": self.model.init_kwargs(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "step": self.step,
            "rng": rngs,
            "sampler_rng": samplers,
            "world_size": self.dist.world_size,
            "config": to_jsonable(saved_form(self.config)),
            "dataset": {
                "source": info.source,
                "env_id": info.env_id,
                "env_spec": evaluated_spec(self.config.env_id, info, self.config.allow_env_modules),
                "ref_min_score": info.ref_min_score,
                "ref_max_score": info.ref_max_score,
            },
        }

    def load_checkpoint_state(self, ckpt: dict[str, Any]) -> None:
        """Put back what :meth:`checkpoint` saved (RNG streams only when the world size is unchanged)."""
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.scheduler.load_state_dict(ckpt["scheduler"])
        self.step = int(ckpt["step"])
        if int(ckpt.get("world_size", 1)) == self.dist.world_size:
            restore_rng_state(ckpt["rng"][self.dist.rank])
            self.sampler_rng.bit_generator.state = ckpt["sampler_rng"][self.dist.rank]
        elif self.dist.is_main:
            warnings.warn(
                f"resume: world size changed ({ckpt.get('world_size')} -> {self.dist.world_size}); "
                "random streams are reseeded, the run will not match an uninterrupted one",
                stacklevel=2,
            )

    def close(self) -> None:
        for env in self.eval_envs:
            env.close()
        self.eval_envs = []
        self.net = self.model  # drop the DDP wrapper (and its process group) before the group is destroyed


def train(
    config: DTConfig,
    run_dir: Path | None = None,
    callback: Callable[[DTTrainer], bool | None] | None = None,
) -> RunResult:
    """Train (or resume, ``config.resume``) a Decision Transformer / BC run (lifecycle:
    :func:`~rl_transformers.runs.lifecycle.train_run`); ``run_dir`` forces the run directory."""
    resume = functools.partial(load_resume, cls=DTConfig, merge=_merge, required=REQUIRED_KEYS, kind="DT")
    return train_run(config, resume, DTTrainer, run_dir, callback)
