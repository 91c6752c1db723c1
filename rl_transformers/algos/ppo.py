"""PPO for memory policies (GTrXL, any backbone, LSTM / GRU / MLP baselines), single-process or data-parallel.

PPO (Schulman et al. 2017, arXiv 1707.06347) with the clipped surrogate, optional value clipping, entropy bonus,
per-minibatch advantage normalisation, linear learning-rate annealing, a target-KL stop and gradient-norm
clipping, as in the "37 implementation details" (Huang et al. 2022, ICLR blog track). Memory policies follow
GTrXL (Parisotto et al. 2019, arXiv 1910.06764): one update reads whole training sequences of ``seq_len``
steps (the training window) from the state stored at their first step (the memory window, e.g. XL mem_len, is
separate), see :mod:`rl_transformers.algos.rollout`. Backbone aux losses are weighted (``aux_coef``, ``aux_weights``).

One update, read top to bottom in :meth:`PPOTrainer.learn`: collect a rollout (``num_envs`` x ``num_steps``
steps, one token per env per step under ``torch.inference_mode``) -> GAE -> ``update_epochs`` x
``num_minibatches`` gradient steps -> log (SB3 tags) -> evaluate / checkpoint when due. A run directory
``runs/ppo/<env>/<YYYYmmdd-HHMMSS>-s<seed>/`` holds ``config.json``, TensorBoard events, ``progress.jsonl`` and
``checkpoints/``. Checkpoints hold the model, optimizer, RNG states, the env-step counter, the learning-rate
anchor, and (single process, sync envs) the envs themselves with the rollout loop state as one pickled blob
signed with this user's key (:mod:`rl_transformers.utils.trust`), so a resumed single-process CPU run of one's
own continues bit-exactly; a blob that does not verify is never unpickled (fresh episodes, with a warning).

Evaluation: every ``eval_every`` env steps and, with ``eval_final`` (the default), once more after the last
update, so the summary's ``eval/mean_reward`` and ``best.pt`` consider the final policy (the encoder study
turns it off to keep its protocol: evaluations at multiples of ``eval_every`` only).

Modules: the loss, Adam and the epochs :mod:`~rl_transformers.algos.ppo_update`; logged tags
:mod:`~rl_transformers.algos.ppo_logging`; the checkpoint format and loading a trained policy
:mod:`~rl_transformers.algos.ppo_checkpoint` (what a save holds and how a resume restores it are the trainer's
:meth:`PPOTrainer.checkpoint_state` / :meth:`PPOTrainer.load_checkpoint_state`); config
:mod:`~rl_transformers.algos.ppo_config`; throughput :mod:`~rl_transformers.algos.throughput` (the trainer's
loop without a run directory); the run around the loop :mod:`~rl_transformers.runs.lifecycle`.

Resume (:mod:`rl_transformers.runs.resume`): flags in ``RESUME_MUTABLE`` apply, other changed flags are
refused. Learning-rate rule: the rate anneals linearly from an anchor ``(update u0, rate lr0)`` to 0 at the
last update, ``lr(u) = lr0 * (1 - (u - u0) / (num_updates - u0))``; a fresh run anchors at ``(0,
learning_rate)``. A resume that changes the budget (hence ``num_updates``) re-anchors at the checkpoint's
update with the rate the run had reached there, so the rate never jumps: it continues from that value
down to 0 over the remaining updates. An unchanged budget keeps the anchor (bit-exact continuation). With
``anneal_horizon`` H the rate is a function of the env step alone, ``lr(s) = learning_rate * max(0, 1 - s / H)``,
so two budgets share one schedule and a resume needs no anchor; ``--ppo.no-anneal-lr`` keeps it constant.
"""

from __future__ import annotations

import functools
import pickle
import sys
import time
import warnings
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rl_transformers import tags as T
from rl_transformers.algos import ppo_checkpoint
from rl_transformers.algos.env_util import check_same_step, make_vec_env
from rl_transformers.algos.evaluation import EpisodeStats, evaluate_episodes
from rl_transformers.algos.ppo_config import TrainConfig, resume_config
from rl_transformers.algos.ppo_logging import record_update
from rl_transformers.algos.ppo_update import make_adam, train_epochs, update_obs_norm
from rl_transformers.algos.reward_norm import RewardNorm
from rl_transformers.algos.rollout import LoopState, collect_rollout, observe, reset_loop
from rl_transformers.algos.storage import RolloutStorage
from rl_transformers.logging import Logger
from rl_transformers.policies.actor_critic import ActorCritic
from rl_transformers.policies.cores import ContextCore, TwinCore
from rl_transformers.policies.gtrxl import make_policy
from rl_transformers.runs.config import saved_form
from rl_transformers.runs.distributed import (
    DistContext,
    broadcast_parameters,
    resolve_device,
)
from rl_transformers.runs.lifecycle import RunResult, RunSpec, load_resume, train_run
from rl_transformers.runs.run import Resumed, Run
from rl_transformers.utils.config_json import to_jsonable
from rl_transformers.utils.errors import UserError
from rl_transformers.utils.rng import capture_rng_state, restore_rng_state
from rl_transformers.utils.training import linear_schedule, seed_everything
from rl_transformers.utils.trust import UntrustedBlob, check_key, load_signed, sign_blob

__all__ = ["PPOTrainer", "train"]

HEADLINE = (T.EP_REW_MEAN, T.EP_LEN_MEAN, T.EVAL_MEAN_REWARD)
"""Tags of the final summary (their last logged values)."""


# -- the trainer --------------------------------------------------------------------------------------------
class PPOTrainer:
    """Owns envs, policy, optimizer, storage and counters (restored from ``resumed``); :meth:`learn` runs the
    loop."""

    def __init__(
        self,
        cfg: TrainConfig,
        dist: DistContext | None = None,
        device: torch.device | None = None,
        resumed: Resumed | None = None,
    ) -> None:
        self.cfg = cfg
        self.dist = dist or DistContext()
        self.device = device or resolve_device(cfg.device, self.dist)
        ppo = cfg.ppo
        cfg.check_aux_weights()
        seed_everything(cfg.seed, cfg.torch_deterministic)  # identical initial parameters on every rank
        self.envs = make_vec_env(
            cfg.env_id, cfg.num_envs, cfg.env_kwargs, cfg.vectorization, cfg.allow_env_modules
        )
        check_same_step(self.envs)
        obs_space, act_space = self.envs.single_observation_space, self.envs.single_action_space
        self.policy: ActorCritic = make_policy(cfg.policy, obs_space, act_space).to(self.device)
        if cfg.init_from is not None and resumed is None:
            self._init_policy(cfg.init_from, obs_space, act_space)
        broadcast_parameters(self.policy, self.dist)
        if cfg.compile:  # compiled acting step and training forward, eager fallback
            from rl_transformers.policies.compile import compile_policy

            compile_policy(self.policy, training=cfg.compile_training)
        self._check_seq_len()
        self.optimizer = make_adam(self.policy, ppo.learning_rate, ppo.adam_eps)
        self.storage = RolloutStorage(
            ppo.num_steps,
            cfg.num_envs,
            ppo.seq_len,
            obs_space,
            self.policy.actor.action_shape,
            self.policy.actor.action_dtype,
            self.device,
        )
        if ppo.num_minibatches > self.storage.num_sequences:
            raise UserError(
                f"num_minibatches={ppo.num_minibatches} (--ppo.num-minibatches) exceeds the "
                f"{self.storage.num_sequences} training sequences per rollout (num_envs * num_steps / seq_len)"
            )
        rank = self.dist.rank
        seed_everything(cfg.seed + rank, cfg.torch_deterministic)
        self.generator = torch.Generator().manual_seed(cfg.seed + rank)
        self.norm_obs_per_step = self._per_step_obs_norm()
        """Observations join the normaliser as they arrive (SB3's VecNormalize) instead of once per rollout."""
        self.loop = self._reset_loop(cfg.seed + rank * cfg.num_envs)
        self.reward_norm = (
            RewardNorm(cfg.num_envs, ppo.gamma, ppo.norm_reward_clip) if ppo.norm_reward else None
        )
        """Reward scaler of this rank's envs (``ppo.norm_reward``), saved in checkpoints; None: raw rewards."""
        self.batch_size = ppo.num_steps * cfg.num_envs * self.dist.world_size
        self.num_updates = cfg.total_timesteps // self.batch_size
        if self.num_updates < 1:
            raise UserError(
                f"total_timesteps={cfg.total_timesteps} (--total-timesteps) is less than one update of "
                f"{self.batch_size} steps (--ppo.num-steps x --num-envs x processes); use at least {self.batch_size}"
            )
        self.global_step = 0
        self.update = 0
        self.lr_anchor: tuple[int, float] = (0, ppo.learning_rate)
        """(update, rate) the linear anneal starts from (see the module docstring)."""
        self.episode_returns: deque[float] = deque(maxlen=100)
        self.episode_lengths: deque[int] = deque(maxlen=100)
        self._unpicklable = False
        """The envs failed to pickle once: later checkpoints hold no env blob (warned once)."""
        if resumed is not None:
            try:
                self.load_checkpoint_state(resumed.checkpoint, resumed.source)
            except BaseException:
                self.close()
                raise
            if self.update >= self.num_updates and self.dist.is_main:
                print(
                    f"resume: the run is already at step {self.global_step} >= --total-timesteps "
                    f"{cfg.total_timesteps}; nothing to train (raise --total-timesteps to continue)",
                    file=sys.stderr,
                )

    def run_spec(self) -> RunSpec:
        """What the run records (:func:`~rl_transformers.runs.lifecycle.train_run`)."""
        return RunSpec(
            algo="ppo",
            name=self.cfg.env_id,
            step=self.global_step,
            model=self.policy,
            best_metric=T.EVAL_MEAN_REWARD if self.cfg.eval_every else None,
            best_label=None,
            hparam_metrics=(T.EP_REW_MEAN, T.EVAL_MEAN_REWARD),
            headline=HEADLINE,
            keep_checkpoints=self.cfg.keep_checkpoints,
            facts={
                "batch_size": self.batch_size,
                "num_updates": self.num_updates,
                "device": str(self.device),
            },
        )

    # -- one update -----------------------------------------------------------------------------------------
    def train_epochs(self, collect_info: bool = False) -> dict[str, float]:
        """PPO epochs over the stored rollout; returns the update's mean statistics
        (:func:`~rl_transformers.algos.ppo_update.train_epochs`)."""
        clip = self.cfg.ppo.clip_at(self.learning_rate())
        return train_epochs(
            self.policy,
            self.optimizer,
            self.storage,
            self.cfg.ppo,
            self.generator,
            self.dist,
            self.global_step,
            collect_info,
            clip,
        )

    # -- logging --------------------------------------------------------------------------------------------
    def _record(self, logger: Logger, metrics: dict[str, float], lr: float, fps: float) -> None:
        ppo = self.cfg.ppo
        record_update(
            logger,
            metrics,
            episode_returns=self.episode_returns,
            episode_lengths=self.episode_lengths,
            learning_rate=lr,
            clip_range=ppo.clip_at(lr),
            n_gradient_steps=self.update * ppo.update_epochs * ppo.num_minibatches,
            fps=fps,
            update=self.update,
            global_step=self.global_step,
        )

    def evaluate(self, n_episodes: int, deterministic: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Returns and lengths of ``n_episodes`` fresh episodes (seeded from the run seed and the step).

        The global RNG states are restored afterwards, so evaluating never changes the training stream."""
        stats = self.evaluate_episodes(n_episodes, deterministic)
        return stats.returns, stats.lengths

    def evaluate_episodes(self, n_episodes: int, deterministic: bool = True) -> EpisodeStats:
        """:meth:`evaluate` with the episodes' success flags where the env reports them."""
        rng = capture_rng_state()
        try:
            return evaluate_episodes(
                self.policy,
                self.cfg.env_id,
                self.cfg.env_kwargs,
                n_episodes,
                seed=self.cfg.seed + 100_003 + self.update,
                seq_len=self.cfg.ppo.seq_len,
                deterministic=deterministic,
                device=self.device,
                allow_env_modules=self.cfg.allow_env_modules,
            )
        finally:
            restore_rng_state(rng)

    # -- checkpoints ----------------------------------------------------------------------------------------
    def learning_rate(self, update: int | None = None) -> float:
        """The rate of ``update`` (default: the current one) under the anchored linear anneal."""
        ppo = self.cfg.ppo
        if not ppo.anneal_lr:
            return ppo.learning_rate
        u = self.update if update is None else update
        if ppo.anneal_horizon is not None:  # budget-independent: the env step where update u starts
            return ppo.horizon_rate(u * self.batch_size)
        u0, lr0 = self.lr_anchor
        return linear_schedule(lr0, 0.0, (u - u0) / max(self.num_updates - u0, 1))

    def checkpoint_state(self) -> dict[str, Any]:
        """Everything a resume needs (tensors and plain data, plus the signed env blob)."""
        blob = None
        if isinstance(self.envs, gym.vector.SyncVectorEnv) and not self._unpicklable:
            try:
                blob = sign_blob(
                    (self.envs.envs, ppo_checkpoint.move_loop(self.loop, "cpu")), ppo_checkpoint.RESUME_BLOB
                )
            except (pickle.PicklingError, AttributeError, TypeError) as err:
                self._unpicklable = True
                warnings.warn(
                    f"the envs of {self.cfg.env_id!r} cannot be pickled ({err}); checkpoints hold no env "
                    "state, a resume starts fresh episodes",
                    stacklevel=2,
                )
        return {
            "config": to_jsonable(saved_form(self.cfg)),
            "policy": self.policy.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "global_step": self.global_step,
            "update": self.update,
            "num_updates": self.num_updates,
            "lr_anchor": {"update": self.lr_anchor[0], "lr": self.lr_anchor[1]},
            "spaces": ppo_checkpoint.describe_spaces(
                self.envs.single_observation_space, self.envs.single_action_space
            ),
            "rng": capture_rng_state(),
            "generator": self.generator.get_state(),
            "episode_returns": list(self.episode_returns),
            "episode_lengths": list(self.episode_lengths),
            "reward_norm": None if self.reward_norm is None else self.reward_norm.state_dict(),
            ppo_checkpoint.RESUME_BLOB: blob,
        }

    def load_checkpoint_state(self, ckpt: dict[str, Any], source: str | Path = "checkpoint") -> None:
        """Restore everything :meth:`checkpoint_state` saved (envs and loop only on rank 0 with sync envs,
        and only from a blob signed with this user's key unless ``cfg.trust_checkpoint``)."""
        missing = [k for k in ("policy", "optimizer", "global_step", "update") if k not in ckpt]
        if missing:
            raise UserError(f"checkpoint {source} lacks {missing}: not a PPO checkpoint of rl_transformers")
        ppo_checkpoint.load_policy_weights(
            self.policy,
            ckpt,
            source,
            self.envs.single_observation_space,
            self.envs.single_action_space,
            self.cfg.env_id,
        )
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.global_step = int(ckpt["global_step"])
        self.update = int(ckpt["update"])
        self.episode_returns.extend(float(r) for r in ckpt.get("episode_returns", []))
        self.episode_lengths.extend(int(n) for n in ckpt.get("episode_lengths", []))
        self._restore_schedule(ckpt)
        self._restore_reward_norm(ckpt, source)
        exact = self._restore_envs(ckpt, source)
        if exact:
            try:
                restore_rng_state(ckpt["rng"])
                self.generator.set_state(ckpt["generator"])
            except (KeyError, TypeError, ValueError, RuntimeError) as err:
                raise UserError(f"checkpoint {source}: its RNG states do not restore ({err})") from None
        else:  # fresh episodes; different seeds than the start so no episode repeats
            seed = self.cfg.seed + self.dist.rank * self.cfg.num_envs + 7919 * self.update
            self.loop = self._reset_loop(seed)
            if self.reward_norm is not None:
                self.reward_norm.restart_episodes()
            seed_everything(seed, self.cfg.torch_deterministic)
            self.generator.manual_seed(seed)

    def _init_policy(self, path: str, obs_space: gym.Space, act_space: gym.Space) -> None:
        try:
            source, step = ppo_checkpoint.init_policy(
                self.policy, path, obs_space, act_space, self.cfg.env_id
            )
        except BaseException:
            self.close()
            raise
        if self.dist.is_main:
            print(f"init: policy weights from {source} (saved at env step {step:,})", file=sys.stderr)

    def _check_seq_len(self) -> None:
        seq_len, core = self.cfg.ppo.seq_len, self.policy.core
        core = core.actor if isinstance(core, TwinCore) else core
        if isinstance(core, ContextCore) and seq_len > core.context_len:
            raise UserError(
                f"seq_len={seq_len} (--ppo.seq-len) must be <= context_len={core.context_len} for "
                "non-streaming attentions (the policy keeps at most 2 x context_len tokens)"
            )

    def _per_step_obs_norm(self) -> bool:
        """``ppo.norm_obs_update`` "step" with a normaliser: start it from SB3's prior (one process only)."""
        norm = self.policy.obs_norm
        if self.cfg.ppo.norm_obs_update != "step" or norm is None:
            return False
        if self.dist.world_size > 1:
            raise UserError(
                "--ppo.norm-obs-update step normalises each process's own observations as they arrive; with "
                f"{self.dist.world_size} processes use --ppo.norm-obs-update rollout (statistics all-reduced)"
            )
        norm.start_like_vecnormalize()
        return True

    def _reset_loop(self, seed: int) -> LoopState:
        """Fresh episodes; their first observations join a per-step normaliser (as VecNormalize's reset)."""
        loop = reset_loop(self.envs, self.policy, seed, self.device)
        if self.norm_obs_per_step:
            observe(self.policy.obs_norm, loop.obs)
        return loop

    def _restore_reward_norm(self, ckpt: dict[str, Any], source: str | Path) -> None:
        """The reward scaler's statistics (``ppo.norm_reward``); a checkpoint without them starts fresh ones."""
        saved = ckpt.get("reward_norm")
        if self.reward_norm is None or saved is None:
            return
        try:
            self.reward_norm.load_state_dict(saved, f"checkpoint {source}")
        except ValueError as err:
            raise UserError(str(err)) from None

    def _restore_schedule(self, ckpt: dict[str, Any]) -> None:
        """The learning-rate anchor: saved, or re-anchored where the budget changed (module docstring of ppo)."""
        anchor = ckpt.get("lr_anchor") or {"update": 0, "lr": self.cfg.ppo.learning_rate}
        self.lr_anchor = (int(anchor["update"]), float(anchor["lr"]))
        saved_updates = int(ckpt.get("num_updates", self.num_updates))
        if saved_updates != self.num_updates:  # budget changed: continue from the rate reached here
            u0, lr0 = self.lr_anchor
            reached = linear_schedule(lr0, 0.0, (self.update - u0) / max(saved_updates - u0, 1))
            self.lr_anchor = (self.update, reached if self.cfg.ppo.anneal_lr else self.cfg.ppo.learning_rate)

    def _restore_envs(self, ckpt: dict[str, Any], source: str | Path) -> bool:
        """Put back the pickled envs + loop when allowed; False (fresh episodes) otherwise."""
        if not (self.dist.is_main and isinstance(self.envs, gym.vector.SyncVectorEnv)):
            return False
        entry = ckpt.get(ppo_checkpoint.RESUME_BLOB)
        if entry is None:
            if "envs" in ckpt and "loop" in ckpt:  # 0.1's layout: two unsigned pickles, never read
                warnings.warn(
                    f"checkpoint {source}: its saved environments were written by an older version (unsigned "
                    "pickles), which this version does not read. The run resumes with fresh episodes (policy, "
                    "optimizer and counters restored; not bit-exact).",
                    stacklevel=3,
                )
            return False
        try:
            envs, loop = load_signed(entry, ppo_checkpoint.RESUME_BLOB, trust=self.cfg.trust_checkpoint)
        except UntrustedBlob as why:
            warnings.warn(
                f"checkpoint {source}: its saved environments are not unpickled ({why}). The run resumes "
                "with fresh episodes (policy, optimizer and counters restored; not bit-exact). If you trust "
                "this file, pass --trust-checkpoint to restore them.",
                stacklevel=3,
            )
            return False
        for env in self.envs.envs:
            env.close()
        self.envs.envs = envs
        self.loop = ppo_checkpoint.move_loop(loop, self.device)
        return True

    # -- the loop -------------------------------------------------------------------------------------------
    def learn(self, run: Run, callback: Callable[[PPOTrainer], bool | None] | None = None) -> RunResult:
        """Run updates until total_timesteps. ``callback(trainer)`` after each update; False stops the run.

        Each update, cleanrl's phases: anneal the learning rate, collect a rollout, train the epochs, log, then
        checkpoint and evaluate when due (:meth:`Run.end_iteration`: saved before evaluating), the final policy
        too with ``eval_final``."""
        cfg, ppo, logger = self.cfg, self.cfg.ppo, run.logger
        start_time, start_step = time.perf_counter(), self.global_step
        run.progress_bar(self.num_updates * self.batch_size, self.global_step, unit="step")
        with run.loop():
            # resumed from a checkpoint whose evaluation a kill cut short: run it first
            if run.evaluation_lost(self.global_step):
                run.end_iteration(self.global_step, self._payload, evaluate=self._evaluation)
            while self.update < self.num_updates:
                # 1. learning rate
                lr = self.learning_rate()
                for group in self.optimizer.param_groups:
                    group["lr"] = lr
                # 2. rollout, 3. optimise (observations normalised by the trainer under norm_obs_update "step")
                collect_info = ppo.info_every > 0 and self.update % ppo.info_every == 0
                with self.policy.inputs_normalised(self.norm_obs_per_step) as obs_norm:
                    self.loop, episodes = collect_rollout(
                        self.policy,
                        self.envs,
                        self.storage,
                        self.loop,
                        ppo.gamma,
                        ppo.gae_lambda,
                        env_id=cfg.env_id,
                        global_step=self.global_step,
                        reward_norm=self.reward_norm,
                        obs_norm=obs_norm,
                    )
                    metrics = self.train_epochs(collect_info=collect_info and logger is not None)
                if not self.norm_obs_per_step:
                    update_obs_norm(self.policy, self.storage, self.dist)
                for ret, length in episodes:
                    self.episode_returns.append(ret)
                    self.episode_lengths.append(length)
                self.update += 1
                self.global_step += self.batch_size
                # 4. log
                fps = (self.global_step - start_step) / max(time.perf_counter() - start_time, 1e-9)
                if logger is not None:
                    self._record(logger, metrics, lr, fps)
                # 5. checkpoint, then evaluate, when due; write the log row
                final = self.update == self.num_updates
                eval_due = bool(cfg.eval_every) and (
                    _crossed(self.global_step, self.batch_size, cfg.eval_every) or (final and cfg.eval_final)
                )
                save_due = bool(cfg.save_every) and _crossed(
                    self.global_step, self.batch_size, cfg.save_every
                )
                run.end_iteration(
                    self.global_step,
                    self._payload,
                    save=save_due,
                    evaluate=self._evaluation if eval_due else None,
                )
                recent = f"{np.mean(self.episode_returns):.3g}" if self.episode_returns else "n/a"
                run.advance(self.batch_size, fps=f"{fps:.0f}", ret=recent)
                if run.should_stop(callback is not None and callback(self) is False):
                    break
        return RunResult(
            algo="ppo",
            run_dir=run.dir,
            step=self.global_step,
            interrupted=run.interrupted,
            target_reached=run.target_reached,
            metrics=run.finish(self.global_step, self._payload),
            evaluations=run.evaluations,
            sources=run.sources(),
            best=run.best(),
            episode_returns=list(self.episode_returns),
        )

    def _payload(self) -> dict[str, Any] | None:
        """The checkpoint payload on rank 0 (other ranks save nothing)."""
        return self.checkpoint_state() if self.dist.is_main else None

    def _evaluation(self) -> tuple[dict[str, float], float]:
        """Greedy evaluation: logged scalars and the value that ranks best.pt."""
        stats = self.evaluate_episodes(self.cfg.eval_episodes)
        mean = float(stats.returns.mean())
        values = {T.EVAL_MEAN_REWARD: mean, T.EVAL_MEAN_EP_LENGTH: float(stats.lengths.mean())}
        if (
            stats.success_rate is not None
        ):  # envs that report success (T-Maze, MiniGrid Memory), as SB3 logs it
            values[T.EVAL_SUCCESS_RATE] = stats.success_rate
        return values, mean

    def close(self) -> None:
        self.envs.close()


def _crossed(step: int, batch: int, every: int) -> bool:
    """True when ``step`` passed a multiple of ``every`` during the last ``batch`` steps."""
    return step // every > (step - batch) // every


# -- entry point --------------------------------------------------------------------------------------------
def train(
    cfg: TrainConfig,
    run_dir: Path | None = None,
    callback: Callable[[PPOTrainer], bool | None] | None = None,
) -> RunResult:
    """Build (or resume) a run, train it, close it (:func:`~rl_transformers.runs.lifecycle.train_run`). Only
    rank 0 writes the run directory.

    With ``cfg.resume`` the saved config is merged with ``cfg`` by :func:`resume_config` (changed frozen
    fields are refused; see :mod:`rl_transformers.runs.resume`)."""
    check_key()  # the env-state blob of checkpoints is signed: a bad key stops the run now, not at its first save
    merge = functools.partial(load_resume, cls=TrainConfig, merge=_merge)
    return train_run(cfg, merge, PPOTrainer, run_dir, callback)


def _merge(saved: TrainConfig, given: TrainConfig, source: Path) -> TrainConfig:
    return resume_config(saved, given, str(source))
