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
target, which selects ``best.pt``; ``last.pt`` is the latest save (labels in ``checkpoints/index.json``).

Distributed: under ``torchrun --nproc_per_node N`` (``WORLD_SIZE`` > 1) the model is wrapped in
DistributedDataParallel (gloo on CPU, nccl on GPU); ``batch_size`` is the global batch, each rank samples
``batch_size / N`` windows from its own generator. Rank 0 logs, evaluates and writes checkpoints holding every
rank's RNG states, so a resume continues each rank's stream. Run directory, resume, Ctrl-C, non-finite stop,
save-then-evaluate, process group and final summary: :mod:`rl_transformers.algos.lifecycle` (shared with PPO).
"""

from __future__ import annotations

import json
import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rl_transformers import logging as L
from rl_transformers.algos.distributed import DistContext, gather_objects
from rl_transformers.algos.dt_config import RESUME_MUTABLE, RESUME_PER_INVOCATION, DTConfig
from rl_transformers.algos.dt_data import TrajectoryDataset
from rl_transformers.algos.evaluation import EvalResult, evaluate_dt
from rl_transformers.algos.lifecycle import Resumed, Run, RunOutcome, load_resume, session
from rl_transformers.policies.decision_transformer import DecisionTransformer
from rl_transformers.utils import (
    capture_rng_state,
    check_finite,
    latest_checkpoint,
    linear_warmup,
    load_checkpoint,
    restore_rng_state,
    seed_everything,
    to_jsonable,
)
from rl_transformers.utils.errors import UserError
from rl_transformers.utils.resume import merge_resume

__all__ = ["DTConfig", "DTTrainer", "EvalResult", "TrainResult", "evaluate", "load_policy", "train"]

BEST_METRIC = L.EVAL_RETURN_MEAN
"""The tag that selects best.pt: the mean return of the first (highest) target."""
HEADLINE = (L.EVAL_RETURN_MEAN, L.EVAL_NORMALIZED_SCORE, L.LOSS)
"""Tags of the final summary (their last logged values)."""
REQUIRED_KEYS = ("model", "optimizer", "scheduler", "step", "rng", "sampler_rng")
evaluate = evaluate_dt
"""Old name of :func:`rl_transformers.algos.evaluation.evaluate_dt`."""


@dataclass
class TrainResult(RunOutcome):
    """A DT / BC run's outcome (``step``: gradient updates; ``run_dir`` None off rank 0)."""

    model: DecisionTransformer | None = None
    data_summary: dict[str, Any] = field(default_factory=dict)
    """The training data actually used (after %BC filtering): episodes, steps, return statistics."""


# --- helpers -------------------------------------------------------------------------------------------------


def default_return_scale(returns: np.ndarray, env_name: str | None) -> float:
    """1/1000 for D4RL MuJoCo families (the paper's value), else 10^-floor(log10(max |return|)), at most 1."""
    from offline_data.scores import env_family

    if env_name and env_family(env_name) is not None:
        return 1e-3
    peak = float(np.max(np.abs(returns))) if len(returns) else 0.0
    if peak < 1.0:
        return 1.0
    return 10.0 ** (-math.floor(math.log10(peak)))


def target_label(target: float | None) -> str:
    """Tag suffix of a target: ``@3600`` (``%g`` format), empty for BC."""
    return "" if target is None else f"@{target:g}"


def _round_target(x: float) -> float:
    return float(f"{x:.4g}")


def load_policy(path: str | Path, device: str | torch.device = "cpu") -> DecisionTransformer:
    """The model of a checkpoint file or run directory (weights + normalisation), in eval mode."""
    source = latest_checkpoint(path) or Path(path)
    ckpt = load_checkpoint(source, map_location=device)
    missing = [k for k in ("model", "model_kwargs") if k not in ckpt]
    if missing or not isinstance(ckpt.get("model_kwargs"), dict):
        raise UserError(f"checkpoint {source} lacks {missing or ['model_kwargs']}: not a DT checkpoint")
    try:
        model = DecisionTransformer.from_kwargs(ckpt["model_kwargs"])
        model.load_state_dict(ckpt["model"])
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        raise UserError(
            f"checkpoint {source}: its model does not rebuild ({type(err).__name__}: {err})"
        ) from err
    return model.to(device).eval()


def _dataset_name(config: DTConfig, info: Any) -> str:
    if info.dataset_id:
        return str(info.dataset_id)
    path = Path(config.dataset)
    return path.stem if path.suffix in (".hdf5", ".h5") else path.name


def _dataset_name(config: DTConfig, info: Any) -> str:
    if info.dataset_id:
        return str(info.dataset_id)
    path = Path(config.dataset)
    return path.stem if path.suffix in (".hdf5", ".h5") else path.name


def _merge(saved: DTConfig, given: DTConfig, source: Path) -> DTConfig:
    return merge_resume(
        saved, given, mutable=RESUME_MUTABLE, per_invocation=RESUME_PER_INVOCATION, source=source
    )


# --- training ------------------------------------------------------------------------------------------------


class DTTrainer:
    """Data, model and optimiser of one run (built in ``__init__``, restored from ``resumed``); :meth:`learn`
    trains inside a :class:`~rl_transformers.algos.lifecycle.Run`."""

    def __init__(
        self,
        config: DTConfig,
        dist: DistContext,
        device: torch.device,
        resumed: Resumed | None = None,
    ) -> None:
        from offline_data import load_episodes

        self.config, self.dist, self.device = config, dist, device
        seed_everything(config.seed + dist.rank)
        self.sampler_rng = np.random.default_rng([config.seed, dist.rank])
        if config.batch_size % dist.world_size:
            raise ValueError(
                f"batch_size={config.batch_size} is not divisible by the {dist.world_size} ranks"
            )
        self.local_batch = config.batch_size // dist.world_size

        # Data, evaluation env, derived settings.
        episodes, self.info = load_episodes(config.dataset, root=config.dataset_root, env_id=config.env_id)
        self.data = TrajectoryDataset(
            episodes,
            discrete_actions=self.info.discrete_actions,
            discrete_observations=isinstance(self.info.observation_space, gym.spaces.Discrete),
            top_fraction=config.bc_top_fraction,
        )
        _check_eval_seeds(episodes, config)
        self.make_env = _env_factory(config, self.info)
        env_limit = _time_limit(self.make_env) if config.eval_episodes > 0 else None
        self.max_ep_len = config.max_ep_len or max(int(self.data.lengths.max()), env_limit or 0)
        self.max_eval_steps = None if env_limit is not None else self.max_ep_len
        name = self.info.env_id or self.info.dataset_id or config.dataset
        self.return_scale = config.return_scale or default_return_scale(self.data.returns, name)
        self.targets: list[float | None] = [None]
        if config.algo == "dt":
            returns = self.data.returns
            default_targets = [_round_target(returns.max()), _round_target(float(np.median(returns)))]
            self.targets = list(dict.fromkeys(config.target_returns or default_targets))

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
        )
        if not self.model.discrete_observations:
            self.model.set_state_normalization(*self.data.state_stats())
        self.model.to(device)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=config.learning_rate,
            weight_decay=config.weight_decay,
            betas=config.betas,
        )
        warmup = config.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: linear_warmup(s, warmup))
        self.step = 0
        if resumed is not None:
            self._restore(resumed.checkpoint)
        self.net: nn.Module = self.model
        if dist.enabled:
            ids = [device.index] if device.type == "cuda" else None
            self.net = nn.parallel.DistributedDataParallel(self.model, device_ids=ids)
        self.run_dir: Path | None = None
        """Set by :func:`train` (rank 0): evaluations write ``eval/step_<n>.json`` there."""
        self.eval_envs: list[gym.Env] = []
        if dist.is_main and self.make_env is not None and config.eval_episodes > 0:
            n_envs = min(config.eval_envs, config.eval_episodes)
            self.eval_envs = [self.make_env() for _ in range(n_envs)]

    @property
    def name(self) -> str:
        """The run directory's name component: the dataset id or file stem."""
        return _dataset_name(self.config, self.info)

    def facts(self) -> dict[str, Any]:
        """What the run summary records besides the parameter count."""
        return {
            "dataset": self.data.describe(),
            "return_scale": self.return_scale,
            "max_ep_len": self.max_ep_len,
            "targets": self.targets,
        }

    # -- one update -----------------------------------------------------------------------------------------
    def update(self, collect_info: bool = False) -> dict[str, Any]:
        """Sample a batch, one optimiser step; returns detached loss terms (and diagnostics if asked)."""
        config, model = self.config, self.model
        batch = self.data.sample(self.local_batch, config.context_len, self.sampler_rng, config.padding)
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
        grad_norm = nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        return {
            "loss": loss.detach(),
            "action_loss": action_loss.detach(),
            "grad_norm": grad_norm.detach(),
            "aux": {name: value.detach() for name, value in out.aux_losses.items()},
            "info": out.info,
        }

    # -- the loop ---------------------------------------------------------------------------------------------
    def learn(self, run: Run, callback: Callable[[DTTrainer], bool | None] | None = None) -> TrainResult:
        """Train to ``total_steps``. Each update: sample and step, log every ``log_every``, then checkpoint and
        evaluate when due (:meth:`Run.end_iteration`: saved before evaluating; always at the last update).
        ``callback(trainer)`` after each update; False stops the run (as Ctrl-C does)."""
        config = self.config
        self._t0 = time.perf_counter()
        self._window = _Window(self.device)
        run.progress_bar(config.total_steps, self.step, unit="update", desc=f"{config.algo} {self.name}")
        with run.loop():
            while self.step < config.total_steps:
                log_now = (self.step + 1) % config.log_every == 0
                terms = self.update(collect_info=log_now)
                self._window.add(terms)
                final = self.step >= config.total_steps
                eval_now = final or (config.eval_every > 0 and self.step % config.eval_every == 0)
                save_now = self.step % config.save_every == 0
                postfix = {}
                if log_now or save_now or eval_now:  # never log or save a non-finite model
                    mean_loss = check_finite(self._window.mean("loss"), L.LOSS, self.step)
                    postfix = {"loss": f"{mean_loss:.4f}"}
                if log_now:
                    if run.logger is not None:
                        self._record(run.logger, terms)
                    self._window = _Window(self.device)
                run.end_iteration(
                    self.step,
                    self.checkpoint,
                    save=save_now,
                    evaluate=self._evaluation if eval_now else None,
                )
                run.advance(1, **postfix)
                if run.should_stop(callback is not None and callback(self) is False):
                    break
        return TrainResult(
            algo=config.algo,
            run_dir=run.dir,
            step=self.step,
            interrupted=run.interrupted,
            metrics=run.finish(self.step, self.checkpoint),
            evaluations=run.evaluations,
            model=self.model,
            data_summary=self.data.describe(),
        )

    def _record(self, logger: L.Logger, last: dict[str, Any]) -> None:
        window = self._window
        logger.record(L.LOSS, window.mean("loss"))
        logger.record(L.ACTION_LOSS, window.mean("action_loss"))
        logger.record(L.GRAD_NORM, window.mean("grad_norm"))
        logger.record(L.LEARNING_RATE, self.scheduler.get_last_lr()[0])
        logger.record(L.N_UPDATES, self.step)
        for name in window.aux:
            logger.record(f"train/aux_{name}", window.mean(name, aux=True))
        for key, value in last["info"].items():  # backbone diagnostics of the last update
            if isinstance(value, torch.Tensor) and value.numel() == 1:
                logger.record(key, float(value))
            elif isinstance(value, int | float):
                logger.record(key, value)
        elapsed = time.perf_counter() - window.start
        logger.record(L.SAMPLES_PER_SECOND, window.n * self.config.batch_size / max(elapsed, 1e-9))
        logger.record(L.TIME_ELAPSED, time.perf_counter() - self._t0)

    # -- evaluation -------------------------------------------------------------------------------------------
    def _evaluation(self) -> tuple[dict[str, float], float | None]:
        """Logged eval scalars and the best.pt value; the time spent is left out of the throughput."""
        t_eval = time.perf_counter()
        values = self.evaluate()
        self._window.start += time.perf_counter() - t_eval
        return values, values.get(BEST_METRIC)

    def evaluate(self) -> dict[str, float]:
        """Roll out every target (rank 0); eval scalars by tag, episodes written to eval/step_<n>.json.

        The global RNG states are restored afterwards: evaluating never changes the training stream."""
        if not self.eval_envs:
            return {}
        rng = capture_rng_state()
        try:
            return self._evaluate()
        finally:
            restore_rng_state(rng)

    def _evaluate(self) -> dict[str, float]:
        config, info = self.config, self.info
        results = evaluate_dt(
            self.model,
            self.make_env,  # type: ignore[arg-type]
            self.targets,
            config.eval_episodes,
            config.eval_seed,
            envs=self.eval_envs,
            max_steps=self.max_eval_steps,
        )
        values: dict[str, float] = {}
        for i, res in enumerate(results):
            label = target_label(res.target)
            values[f"{L.EVAL_RETURN_MEAN}{label}"] = float(res.returns.mean())
            values[f"{L.EVAL_RETURN_STD}{label}"] = float(res.returns.std())
            values[f"{L.EVAL_EP_LENGTH_MEAN}{label}"] = float(res.lengths.mean())
            if info.ref_min_score is not None and info.ref_max_score is not None:
                score = float(np.mean(info.normalized_score(res.returns)))
                values[f"{L.EVAL_NORMALIZED_SCORE}{label}"] = score
                if i == 0:
                    values[L.EVAL_NORMALIZED_SCORE] = score
            if i == 0:  # the first (highest) target selects best.pt
                values[BEST_METRIC] = float(res.returns.mean())
        if self.run_dir is not None:
            episodes = [
                {"target": r.target, "returns": r.returns.tolist(), "lengths": r.lengths.tolist()}
                for r in results
            ]
            path = self.run_dir / "eval" / f"step_{self.step}.json"
            path.parent.mkdir(exist_ok=True)
            path.write_text(json.dumps({"step": self.step, "episodes": episodes}) + "\n")
        return values

    # -- checkpoints ------------------------------------------------------------------------------------------
    def checkpoint(self) -> dict[str, Any] | None:
        """The checkpoint payload (collective under DDP: gathers every rank's RNG states; None off rank 0)."""
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
            "config": to_jsonable(self.config),
            "dataset": {
                "source": info.source,
                "env_id": info.env_id,
                "ref_min_score": info.ref_min_score,
                "ref_max_score": info.ref_max_score,
            },
        }

    def _restore(self, ckpt: dict[str, Any]) -> None:
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


class _Window:
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


def train(
    config: DTConfig,
    run_dir: Path | None = None,
    callback: Callable[[DTTrainer], bool | None] | None = None,
) -> TrainResult:
    """Train (or resume, ``config.resume``) a Decision Transformer / BC run (lifecycle:
    :mod:`rl_transformers.algos.lifecycle`); ``run_dir`` forces the run directory."""
    resumed = load_resume(config, DTConfig, _merge, REQUIRED_KEYS, "DT")
    config = resumed.config if resumed is not None else config
    with session(config.device, config.threads) as (dist, device):
        trainer = DTTrainer(config, dist, device, resumed)
        run = None
        try:
            run = Run(
                config,
                algo=config.algo,
                name=trainer.name,
                dist=dist,
                step=trainer.step,
                resumed=resumed,
                run_dir=run_dir,
                best_metric=BEST_METRIC,
                hparam_metrics=(BEST_METRIC, L.EVAL_NORMALIZED_SCORE, L.LOSS),
                headline=HEADLINE,
                keep_checkpoints=config.keep_checkpoints,
            )
            trainer.run_dir = run.dir
            run.announce(trainer.model, trainer.facts())
            return trainer.learn(run, callback)
        finally:
            if run is not None:
                run.close()
            trainer.close()


def _env_factory(config: DTConfig, info: Any) -> Callable[[], gym.Env] | None:
    """The evaluation env: ``config.env_id`` if given (registered ids and ``rlt/`` tasks, through
    :func:`~rl_transformers.algos.env_util.make_env_thunk`), else the dataset's eval / collection env, else
    None."""
    if config.env_id is not None:
        from rl_transformers.algos.env_util import make_env_thunk

        return make_env_thunk(config.env_id, source="--env-id")
    if (info.eval_env_spec or info.env_spec) is not None:
        return info.make_env
    return None


def _time_limit(make_env: Callable[[], gym.Env] | None) -> int | None:
    if make_env is None:
        return None
    env = make_env()
    try:
        return env.spec.max_episode_steps if env.spec is not None else None
    finally:
        env.close()


def _check_eval_seeds(episodes: Sequence[Any], config: DTConfig) -> None:
    """Refuse evaluation seeds that reset an episode of the dataset (when the dataset records seeds)."""
    if config.eval_episodes == 0:
        return
    used = {int(ep.seed) for ep in episodes if getattr(ep, "seed", None) is not None}
    eval_seeds = set(range(config.eval_seed, config.eval_seed + config.eval_episodes))
    clash = sorted(used & eval_seeds)
    if clash:
        raise ValueError(
            f"evaluation seeds {config.eval_seed}..{config.eval_seed + config.eval_episodes - 1} include "
            f"{len(clash)} seed(s) used to collect the dataset (e.g. {clash[0]}); pick another --eval-seed, "
            f"e.g. {max(used) + 1}"
        )


def cleanup_distributed() -> None:
    """Destroy the default process group if this process created one (:func:`train` already does; kept for
    old callers)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
