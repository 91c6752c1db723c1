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
rank's RNG states, so a resume continues each rank's stream. Run layout and resume: see ``docs/design.md``.
"""

from __future__ import annotations

import datetime
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

from rl_transformers.algos.distributed import any_rank, gather_objects, setup_distributed
from rl_transformers.algos.dt_config import RESUME_MUTABLE, RESUME_PER_INVOCATION, DTConfig
from rl_transformers.algos.dt_data import TrajectoryDataset
from rl_transformers.logging import Logger
from rl_transformers.policies.decision_transformer import (
    DecisionTransformer,
    DTAgent,
)
from rl_transformers.utils import (
    CheckpointManager,
    GracefulInterrupt,
    capture_rng_state,
    check_finite,
    latest_checkpoint,
    linear_warmup,
    load_checkpoint,
    make_run_dir,
    restore_rng_state,
    save_config,
    seed_everything,
    set_threads,
    to_jsonable,
)
from rl_transformers.utils.errors import UserError
from rl_transformers.utils.resume import merge_resume, saved_config

BEST_METRIC = "eval/return_mean"


@dataclass
class EvalResult:
    """Returns and lengths of the evaluation episodes of one target."""

    target: float | None
    returns: np.ndarray
    lengths: np.ndarray


@dataclass
class TrainResult:
    """What :func:`train` returns (on rank 0; other ranks get ``run_dir=None``)."""

    model: DecisionTransformer
    run_dir: Path | None
    step: int
    interrupted: bool
    evaluations: dict[int, dict[str, float]] = field(default_factory=dict)
    """Logged eval scalars by step."""
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


def evaluate(
    model: DecisionTransformer,
    make_env: Callable[[], gym.Env],
    targets: Sequence[float | None],
    n_episodes: int,
    seed: int,
    num_envs: int = 10,
    max_steps: int | None = None,
    envs: list[gym.Env] | None = None,
) -> list[EvalResult]:
    """Roll out ``model`` (deterministic actions) for ``n_episodes`` per target; episode i resets with seed + i.

    Episodes run in chunks of ``num_envs`` envs stepped together through one :class:`DTAgent`. An episode
    ends at termination / truncation or after ``max_steps`` steps (for envs without a time limit).
    """
    was_training = model.training
    own = envs is None
    envs = envs if envs is not None else [make_env() for _ in range(max(1, min(num_envs, n_episodes)))]
    results = []
    try:
        for target in targets:
            returns = np.zeros(n_episodes)
            lengths = np.zeros(n_episodes, dtype=np.int64)
            for first in range(0, n_episodes, len(envs)):
                ids = list(range(first, min(n_episodes, first + len(envs))))
                n = len(ids)
                agent = DTAgent(model, n, target)
                obs = np.stack([np.asarray(envs[j].reset(seed=seed + i)[0]) for j, i in enumerate(ids)])
                alive = np.ones(n, dtype=bool)
                while alive.any():
                    actions = agent.act(obs)
                    rewards = np.zeros(n)
                    for j in np.flatnonzero(alive):
                        action = actions[j] if not model.discrete_actions else int(actions[j])
                        ob, r, terminated, truncated, _ = envs[j].step(action)
                        obs[j] = np.asarray(ob)
                        rewards[j] = float(r)
                        returns[ids[j]] += float(r)
                        lengths[ids[j]] += 1
                        if (
                            terminated
                            or truncated
                            or (max_steps is not None and lengths[ids[j]] >= max_steps)
                        ):
                            alive[j] = False
                    agent.observe(rewards)
            results.append(EvalResult(target, returns, lengths))
    finally:
        if own:
            for env in envs:
                env.close()
        model.train(was_training)
    return results


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


def _resolve_resume(config: DTConfig) -> tuple[DTConfig, dict[str, Any] | None, Path | None]:
    """The merged config, checkpoint and run directory of ``config.resume`` (rules: ``utils/resume.py``)."""
    if config.resume is None:
        return config, None, None
    path = latest_checkpoint(config.resume)
    if path is None:
        raise UserError(f"--resume {config.resume}: no checkpoint (last.pt / step_<n>.pt) found there")
    ckpt = load_checkpoint(path)
    missing = [k for k in ("model", "optimizer", "scheduler", "step", "rng", "sampler_rng") if k not in ckpt]
    if missing:
        raise UserError(f"checkpoint {path} lacks {missing}: not a DT checkpoint of rl_transformers")
    merged = merge_resume(
        saved_config(DTConfig, ckpt, path),
        config,
        mutable=RESUME_MUTABLE,
        per_invocation=RESUME_PER_INVOCATION,
        source=config.resume,
    )
    run_dir = path.parent.parent if path.parent.name == "checkpoints" else path.parent
    return merged, ckpt, run_dir


# --- training ------------------------------------------------------------------------------------------------


class DTTrainer:
    """One run: data, model, optimiser, logger and checkpoints set up in ``__init__``; :meth:`run` trains.

    ``run_dir`` forces the run directory (tests); by default a fresh one is made under ``config.runs_dir``
    (or the resumed run's directory).
    """

    def __init__(self, config: DTConfig, run_dir: Path | None = None) -> None:
        from offline_data import load_episodes

        config, ckpt, resume_dir = _resolve_resume(config)
        self.config = config
        # Generous timeout: ranks > 0 wait in the next all-reduce while rank 0 evaluates (long rollouts).
        self.dist, self.device = setup_distributed(config.device, timeout=datetime.timedelta(hours=2))
        if config.threads is not None:
            set_threads(config.threads)
        seed_everything(config.seed + self.dist.rank)
        self.sampler_rng = np.random.default_rng([config.seed, self.dist.rank])
        if config.batch_size % self.dist.world_size:
            raise ValueError(
                f"batch_size={config.batch_size} is not divisible by the {self.dist.world_size} ranks"
            )
        self.local_batch = config.batch_size // self.dist.world_size

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
        max_ep_len = config.max_ep_len or max(int(self.data.lengths.max()), env_limit or 0)
        self.max_eval_steps = None if env_limit is not None else max_ep_len
        name = self.info.env_id or self.info.dataset_id or config.dataset
        return_scale = config.return_scale or default_return_scale(self.data.returns, name)
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
            max_ep_len,
            return_scale=return_scale,
            condition_on_return=config.algo == "dt",
            embed_dropout=config.embed_dropout,
            padding=config.padding,
        )
        if not self.model.discrete_observations:
            self.model.set_state_normalization(*self.data.state_stats())
        self.model.to(self.device)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=config.learning_rate,
            weight_decay=config.weight_decay,
            betas=config.betas,
        )
        warmup = config.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: linear_warmup(s, warmup))
        self.step = 0
        if ckpt is not None:
            self._restore(ckpt)
        self.net: nn.Module = self.model
        if self.dist.enabled:
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.net = nn.parallel.DistributedDataParallel(self.model, device_ids=ids)

        # Run directory, logger, checkpoints, evaluation envs: rank 0 only.
        self.run_dir: Path | None = None
        self.logger: Logger | None = None
        self.manager: CheckpointManager | None = None
        self.eval_envs: list[gym.Env] = []
        if self.dist.is_main:
            self.run_dir = Path(
                resume_dir
                or run_dir
                or make_run_dir(
                    config.runs_dir, algo=config.algo, name=_dataset_name(config, self.info), seed=config.seed
                )
            )
            self.run_dir.mkdir(parents=True, exist_ok=True)
            save_config(self.run_dir, config)
            purge = self.step + 1 if ckpt is not None else None
            self.logger = Logger(self.run_dir, stdout=config.log_stdout, purge_step=purge)
            self.manager = CheckpointManager(
                self.run_dir, keep_last=config.keep_checkpoints, metric=BEST_METRIC, mode="max"
            )
            if ckpt is None:
                self._log_run_summary(return_scale, max_ep_len)
            if self.make_env is not None and config.eval_episodes > 0:
                n_envs = min(config.eval_envs, config.eval_episodes)
                self.eval_envs = [self.make_env() for _ in range(n_envs)]

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
            loss = loss + config.aux_loss_weights.get(name, 1.0) * value
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

    # -- evaluation -------------------------------------------------------------------------------------------
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
        results = evaluate(
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
            values[f"eval/return_mean{label}"] = float(res.returns.mean())
            values[f"eval/return_std{label}"] = float(res.returns.std())
            values[f"eval/ep_length_mean{label}"] = float(res.lengths.mean())
            if info.ref_min_score is not None and info.ref_max_score is not None:
                score = float(np.mean(info.normalized_score(res.returns)))
                values[f"eval/normalized_score{label}"] = score
                if i == 0:
                    values["eval/normalized_score"] = score
            if i == 0:  # the first (highest) target selects best.pt
                values[BEST_METRIC] = float(res.returns.mean())
        episodes = [
            {"target": r.target, "returns": r.returns.tolist(), "lengths": r.lengths.tolist()}
            for r in results
        ]
        assert self.run_dir is not None
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

    def _log_run_summary(self, return_scale: float, max_ep_len: int) -> None:
        assert self.logger is not None
        n_params = sum(p.numel() for p in self.model.parameters())
        summary = {"dataset": self.data.describe(), "return_scale": return_scale, "max_ep_len": max_ep_len}
        summary |= {"targets": self.targets, "n_parameters": n_params, "world_size": self.dist.world_size}
        self.logger.log_hparams(
            self.config, {BEST_METRIC: None, "eval/normalized_score": None, "train/loss": None}
        )
        text = json.dumps(to_jsonable(summary, strict=False), indent=2)
        self.logger.text("run/summary", "```\n" + text + "\n```")

    # -- the loop ---------------------------------------------------------------------------------------------
    def run(self) -> TrainResult:
        """Train to ``total_steps``: update, log every ``log_every``, evaluate, checkpoint, stop on Ctrl-C."""
        config, logger = self.config, self.logger
        result = TrainResult(self.model, self.run_dir, self.step, False, data_summary=self.data.describe())
        window = _Window(self.device)
        bar = self._progress_bar()
        try:
            with GracefulInterrupt() as stop:
                while self.step < config.total_steps:
                    log_now = (self.step + 1) % config.log_every == 0
                    terms = self.update(collect_info=log_now)
                    window.add(terms)
                    if bar is not None:
                        bar.update(1)
                    if log_now:
                        mean_loss = check_finite(window.mean("loss"), "train/loss", self.step)
                        if logger is not None:
                            self._record_train(window, terms)
                        if bar is not None:
                            bar.set_postfix(loss=f"{mean_loss:.4f}")
                        window = _Window(self.device)
                    final = self.step >= config.total_steps
                    eval_now = final or (config.eval_every > 0 and self.step % config.eval_every == 0)
                    stop_now = any_rank(stop.requested, self.dist)
                    if eval_now or stop_now or self.step % config.save_every == 0:
                        # saved before evaluating: an evaluation error never loses training
                        payload = self.checkpoint()  # every rank takes part (RNG gather)
                        if self.manager is not None and payload is not None:
                            self.manager.save(payload, self.step)
                    if eval_now and self.dist.is_main:
                        t_eval = time.perf_counter()
                        values = self.evaluate()
                        window.start += time.perf_counter() - t_eval  # throughput counts updates only
                        result.evaluations[self.step] = values
                        if self.manager is not None:
                            self.manager.update_metric(self.step, values.get(BEST_METRIC))
                        if logger is not None:
                            for key, value in values.items():
                                logger.record(key, value)
                    if logger is not None and (log_now or eval_now):
                        logger.dump(self.step)
                    if stop_now:
                        result.interrupted = True
                        break
        finally:
            if bar is not None:
                bar.close()
            self.close()
        result.step = self.step
        return result

    def _record_train(self, window: _Window, last: dict[str, Any]) -> None:
        logger = self.logger
        assert logger is not None
        logger.record("train/loss", window.mean("loss"))
        logger.record("train/action_loss", window.mean("action_loss"))
        logger.record("train/grad_norm", window.mean("grad_norm"))
        logger.record("train/learning_rate", self.scheduler.get_last_lr()[0])
        logger.record("train/n_updates", self.step)
        for name in window.aux:
            logger.record(f"train/aux_{name}", window.mean(name, aux=True))
        for key, value in last["info"].items():  # backbone diagnostics of the last update
            if isinstance(value, torch.Tensor) and value.numel() == 1:
                logger.record(key, float(value))
            elif isinstance(value, int | float):
                logger.record(key, value)
        elapsed = time.perf_counter() - window.start
        logger.record("time/samples_per_second", window.n * self.config.batch_size / max(elapsed, 1e-9))
        logger.record("time/time_elapsed", time.perf_counter() - self._t0)

    def _progress_bar(self) -> Any:
        self._t0 = time.perf_counter()
        if not (self.dist.is_main and self.config.progress):
            return None
        from tqdm.auto import tqdm

        desc = f"{self.config.algo} {_dataset_name(self.config, self.info)}"
        return tqdm(total=self.config.total_steps, initial=self.step, desc=desc)

    def close(self) -> None:
        for env in self.eval_envs:
            env.close()
        self.eval_envs = []
        if self.logger is not None:
            self.logger.close()


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


def train(config: DTConfig, run_dir: Path | None = None) -> TrainResult:
    """Train (or resume, ``config.resume``) a Decision Transformer / BC run; see the module docstring."""
    return DTTrainer(config, run_dir).run()


def _env_factory(config: DTConfig, info: Any) -> Callable[[], gym.Env] | None:
    """The evaluation env: ``config.env_id`` if given, else the dataset's eval / collection env, else None."""
    if config.env_id is not None:
        from envs.resolve import make_env, resolve_env

        spec = resolve_env(config.env_id, source="--env-id")  # registered ids only (envs.resolve)
        return lambda: make_env(spec, source="--env-id")
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
    """Destroy the default process group if this process created one."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
