"""PPO for memory policies (GTrXL, any backbone, LSTM / GRU / MLP baselines), single-process or data-parallel.

PPO (Schulman et al. 2017, arXiv 1707.06347) with the clipped surrogate, optional value clipping, entropy bonus,
per-minibatch advantage normalisation, linear learning-rate annealing, a target-KL stop and gradient-norm
clipping, as in the "37 implementation details" (Huang et al. 2022, ICLR blog track). Memory policies follow
GTrXL (Parisotto et al. 2019, arXiv 1910.06764): one update reads whole training sequences of ``seq_len``
steps (the training window) from the state stored at their first step (the memory window, e.g. XL mem_len, is
separate), see :mod:`rl_transformers.algos.rollout`. Backbone aux losses are added with weights
(``aux_coef``, per-name ``aux_weights``).

One update, read top to bottom in :meth:`PPOTrainer.learn`: collect a rollout (``num_envs`` x ``num_steps``
steps, one token per env per step under ``torch.inference_mode``) -> GAE -> ``update_epochs`` x
``num_minibatches`` gradient steps -> log (SB3 tags) -> evaluate / checkpoint when due. A run directory
``runs/ppo/<env>/<YYYYmmdd-HHMMSS>-s<seed>/`` holds ``config.json``, TensorBoard events, ``progress.jsonl`` and
``checkpoints/``. Checkpoints hold the model, optimizer, RNG states, the env-step counter, the learning-rate
anchor, and (single process, sync envs) the envs themselves with the rollout loop state as one pickled blob
signed with this user's key (:mod:`rl_transformers.utils.trust`), so a resumed single-process CPU run of one's
own continues bit-exactly; a blob that does not verify is never unpickled (fresh episodes, with a warning).

Resume (:mod:`rl_transformers.utils.resume`): flags in ``RESUME_MUTABLE`` apply, other changed flags are
refused. Learning-rate rule: the rate anneals linearly from an anchor ``(update u0, rate lr0)`` to 0 at the
last update, ``lr(u) = lr0 * (1 - (u - u0) / (num_updates - u0))``; a fresh run anchors at ``(0,
learning_rate)``. A resume that changes the budget (hence ``num_updates``) re-anchors at the checkpoint's
update with the rate the run had reached there, so the rate never jumps: it continues from that value
down to 0 over the remaining updates. An unchanged budget keeps the anchor (bit-exact continuation).
"""

from __future__ import annotations

import math
import sys
import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rl_transformers import logging as rlt_logging
from rl_transformers.algos.distributed import (
    DistContext,
    allreduce_gradients,
    allreduce_sum,
    broadcast_parameters,
    resolve_device,
)
from rl_transformers.algos.env_util import check_same_step, make_vec_env
from rl_transformers.algos.evaluation import evaluate_policy
from rl_transformers.algos.lifecycle import Run, RunOutcome, load_resume, run_dir_of, session
from rl_transformers.algos.ppo_checkpoint import (  # RESUME_BLOB, load_policy: re-exported
    RESUME_BLOB,  # noqa: F401
    checkpoint_state,
    load_policy,
    restore_checkpoint,
)
from rl_transformers.algos.ppo_config import PPOConfig, TrainConfig, resume_config
from rl_transformers.algos.rollout import RolloutStorage, SequenceBatch, collect_rollout, reset_loop
from rl_transformers.logging import Logger
from rl_transformers.policies.gtrxl import ActorCritic, ContextCore, make_policy
from rl_transformers.utils import (
    NonFiniteError,
    available_cores,
    capture_rng_state,
    linear_schedule,
    restore_rng_state,
    seed_everything,
    set_threads,
)

__all__ = ["PPOTrainer", "TrainResult", "load_policy", "ppo_loss", "run_dir_of", "train"]

HEADLINE = (rlt_logging.EP_REW_MEAN, rlt_logging.EP_LEN_MEAN, rlt_logging.EVAL_MEAN_REWARD)
"""Tags of the final summary (their last logged values)."""


@dataclass
class TrainResult(RunOutcome):
    """A PPO run's outcome (``step``: environment steps)."""

    episode_returns: list[float] = field(default_factory=list)
    """Returns of the last (up to 100) training episodes (their mean is the last rollout/ep_rew_mean)."""

    @property
    def global_step(self) -> int:
        return self.step

    @property
    def stopped_early(self) -> bool:
        return self.interrupted


# -- the loss -----------------------------------------------------------------------------------------------
def ppo_loss(
    new_log_prob: torch.Tensor,
    entropy: torch.Tensor,
    new_value: torch.Tensor,
    aux_losses: dict[str, torch.Tensor],
    batch: SequenceBatch,
    ppo: PPOConfig,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped-surrogate PPO loss of one minibatch and its logged terms.

    L = E[max(-A r, -A clip(r, 1-ε, 1+ε))] - c_ent H + c_v · ½ E[max((V-R)², (V_clip-R)²)] + Σ w_k aux_k, with
    r = exp(log π - log π_old), A normalised per minibatch, V_clip = V_old + clip(V - V_old, -ε, ε).
    """
    logratio = new_log_prob - batch.log_probs
    ratio = logratio.exp()
    with torch.no_grad():
        approx_kl = ((ratio - 1) - logratio).mean()  # Schulman's k3 estimator of KL(old || new)
        clip_frac = ((ratio - 1.0).abs() > ppo.clip_coef).float().mean()
    adv = batch.advantages
    if ppo.norm_adv and adv.numel() > 1:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - ppo.clip_coef, 1 + ppo.clip_coef)).mean()
    if ppo.clip_vloss:
        v_clipped = batch.values + (new_value - batch.values).clamp(-ppo.clip_coef, ppo.clip_coef)
        v_loss = 0.5 * torch.max((new_value - batch.returns) ** 2, (v_clipped - batch.returns) ** 2).mean()
    else:
        v_loss = 0.5 * ((new_value - batch.returns) ** 2).mean()
    ent = entropy.mean()
    loss = pg_loss - ppo.ent_coef * ent + ppo.vf_coef * v_loss
    terms = {
        "pg": float(pg_loss.detach()),
        "v": float(v_loss.detach()),
        "ent": float(ent.detach()),
        "kl": float(approx_kl),
        "clip": float(clip_frac),
    }
    for name, value in aux_losses.items():
        loss = loss + ppo.aux_weight(name) * value
        terms[f"aux/{name}"] = float(value.detach())
    terms["loss"] = float(loss.detach())
    return loss, terms


# -- the trainer --------------------------------------------------------------------------------------------
class PPOTrainer:
    """Owns envs, policy, optimizer, storage and counters; :meth:`learn` runs the loop."""

    def __init__(
        self, cfg: TrainConfig, dist: DistContext | None = None, device: torch.device | None = None
    ) -> None:
        self.cfg = cfg
        self.dist = dist or DistContext()
        self.device = device or resolve_device(cfg.device, self.dist)
        ppo = cfg.ppo
        cfg.check_aux_weights()
        seed_everything(cfg.seed, cfg.torch_deterministic)  # identical initial parameters on every rank
        self.envs = make_vec_env(cfg.env_id, cfg.num_envs, cfg.env_kwargs, cfg.vectorization)
        check_same_step(self.envs)
        obs_space, act_space = self.envs.single_observation_space, self.envs.single_action_space
        self.policy: ActorCritic = make_policy(cfg.policy, obs_space, act_space).to(self.device)
        broadcast_parameters(self.policy, self.dist)
        if isinstance(self.policy.core, ContextCore) and ppo.seq_len > self.policy.core.context_len:
            raise ValueError(
                f"seq_len={ppo.seq_len} must be <= context_len={self.policy.core.context_len} for "
                "non-streaming attentions (the policy keeps at most 2 x context_len tokens)"
            )
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
            raise ValueError(
                f"num_minibatches={ppo.num_minibatches} exceeds the {self.storage.num_sequences} training "
                f"sequences per rollout (num_envs * num_steps / seq_len)"
            )
        rank = self.dist.rank
        seed_everything(cfg.seed + rank, cfg.torch_deterministic)
        self.generator = torch.Generator().manual_seed(cfg.seed + rank)
        self.loop = reset_loop(self.envs, self.policy, cfg.seed + rank * cfg.num_envs, self.device)
        self.batch_size = ppo.num_steps * cfg.num_envs * self.dist.world_size
        self.num_updates = cfg.total_timesteps // self.batch_size
        if self.num_updates < 1:
            raise ValueError(
                f"total_timesteps={cfg.total_timesteps} is less than one update of {self.batch_size} steps "
                f"(num_steps * num_envs * world_size)"
            )
        self.global_step = 0
        self.update = 0
        self.lr_anchor: tuple[int, float] = (0, ppo.learning_rate)
        """(update, rate) the linear anneal starts from (see the module docstring)."""
        self.episode_returns: deque[float] = deque(maxlen=100)
        self.episode_lengths: deque[int] = deque(maxlen=100)

    # -- one update -----------------------------------------------------------------------------------------
    def _evaluate_batch(
        self, mb: SequenceBatch
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict, dict]:
        """New log-probs, entropies, values (B, W) of a minibatch, plus aux losses and info."""
        b, w = mb.log_probs.shape
        new_lp = mb.log_probs.new_empty(b, w)
        ent = mb.log_probs.new_empty(b, w)
        val = mb.log_probs.new_empty(b, w)
        aux: dict[str, torch.Tensor] = {}
        info: dict[str, Any] = {}
        for rows, state in mb.state_groups:
            sel = mb.select(rows)
            out = self.policy.evaluate_sequence(sel["obs"], sel["actions"], state, sel["episode_starts"])
            new_lp = new_lp.index_put((rows,), out.log_prob)
            ent = ent.index_put((rows,), out.entropy)
            val = val.index_put((rows,), out.value)
            frac = len(rows) / b
            for name, value in out.aux_losses.items():
                aux[name] = aux.get(name, 0.0) + frac * value
            info = info or out.info
        return new_lp, ent, val, aux, info

    def train_epochs(self, collect_info: bool = False) -> dict[str, float]:
        """PPO epochs over the stored rollout; returns the update's mean statistics."""
        ppo = self.cfg.ppo
        stats: dict[str, list[float]] = defaultdict(list)
        infos: dict[str, list[float]] = defaultdict(list)
        params = [p for p in self.policy.parameters() if p.requires_grad]
        kl_stop = False
        for epoch in range(ppo.update_epochs):
            for i, mb in enumerate(self.storage.minibatches(ppo.num_minibatches, self.generator)):
                self.policy.collect_info = collect_info and epoch == 0 and i == 0
                new_lp, entropy, new_v, aux, info = self._evaluate_batch(mb)
                self.policy.collect_info = False
                loss, terms = ppo_loss(new_lp, entropy, new_v, aux, mb, ppo)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                loss_value = terms["loss"]
                nonfinite = 0.0 if math.isfinite(loss_value) else 1.0
                shared = allreduce_gradients(
                    self.policy, self.dist, torch.tensor([terms["kl"], nonfinite], dtype=torch.float64)
                )
                grad_norm = torch.nn.utils.clip_grad_norm_(params, ppo.max_grad_norm)
                if shared[1] > 0 or not torch.isfinite(grad_norm):
                    what = "loss" if shared[1] > 0 else "gradient norm"
                    raise NonFiniteError(
                        what, self.global_step, f"loss={loss_value}, grad_norm={float(grad_norm)}"
                    )
                if ppo.target_kl is not None and float(shared[0]) > 1.5 * ppo.target_kl:
                    kl_stop = True
                    break
                self.optimizer.step()
                for key, value in terms.items():
                    stats[key].append(value)
                stats["grad_norm"].append(float(grad_norm))
                for key, value in info.items():
                    if isinstance(value, (int, float)) or (
                        isinstance(value, torch.Tensor) and value.numel() == 1
                    ):
                        infos[key].append(float(value))
            if kl_stop:
                break
        returns = self.storage.returns.flatten()
        values = self.storage.values.flatten()
        var = float(returns.var()) if returns.numel() > 1 else 0.0
        explained = float("nan") if var == 0 else 1.0 - float((returns - values).var()) / var
        out = {k: float(np.mean(v)) for k, v in stats.items() if v}
        out["explained_variance"] = explained
        out["n_steps"] = float(len(stats["loss"]))
        out.update({f"info:{k}": float(np.mean(v)) for k, v in infos.items()})
        return out

    # -- logging --------------------------------------------------------------------------------------------
    def _record(self, logger: Logger, metrics: dict[str, float], lr: float, fps: float) -> None:
        L = rlt_logging
        if self.episode_returns:
            logger.record(L.EP_REW_MEAN, float(np.mean(self.episode_returns)))
            logger.record(L.EP_LEN_MEAN, float(np.mean(self.episode_lengths)))
        names = {
            "loss": L.LOSS,
            "pg": L.POLICY_GRADIENT_LOSS,
            "v": L.VALUE_LOSS,
            "kl": L.APPROX_KL,
            "clip": L.CLIP_FRACTION,
            "grad_norm": L.GRAD_NORM,
        }
        for key, tag in names.items():
            if key in metrics:
                logger.record(tag, metrics[key])
        if "ent" in metrics:
            logger.record(L.ENTROPY_LOSS, -metrics["ent"])
        logger.record(L.EXPLAINED_VARIANCE, metrics["explained_variance"])
        logger.record(L.LEARNING_RATE, lr)
        logger.record(L.CLIP_RANGE, self.cfg.ppo.clip_coef)
        logger.record(L.N_UPDATES, self.update * self.cfg.ppo.update_epochs * self.cfg.ppo.num_minibatches)
        logger.record(L.FPS, fps)
        logger.record(L.ITERATIONS, self.update)
        logger.record(L.TOTAL_TIMESTEPS, self.global_step)
        for key, value in metrics.items():
            if key.startswith("aux/"):
                logger.record(f"backbone/{key}", value)
            elif key.startswith("info:"):
                name = key[5:]
                logger.record(name if name.startswith("backbone/") else f"backbone/{name}", value)

    def evaluate(self, n_episodes: int, deterministic: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Returns and lengths of ``n_episodes`` fresh episodes (seeded from the run seed and the step).

        The global RNG states are restored afterwards, so evaluating never changes the training stream."""
        rng = capture_rng_state()
        try:
            return self._evaluate(n_episodes, deterministic)
        finally:
            restore_rng_state(rng)

    def _evaluate(self, n_episodes: int, deterministic: bool) -> tuple[np.ndarray, np.ndarray]:
        return evaluate_policy(
            self.policy,
            self.cfg.env_id,
            self.cfg.env_kwargs,
            n_episodes,
            seed=self.cfg.seed + 100_003 + self.update,
            seq_len=self.cfg.ppo.seq_len,
            deterministic=deterministic,
            device=self.device,
        )

    # -- checkpoints ----------------------------------------------------------------------------------------
    def learning_rate(self, update: int | None = None) -> float:
        """The rate of ``update`` (default: the current one) under the anchored linear anneal."""
        ppo = self.cfg.ppo
        if not ppo.anneal_lr:
            return ppo.learning_rate
        u = self.update if update is None else update
        u0, lr0 = self.lr_anchor
        return linear_schedule(lr0, 0.0, (u - u0) / max(self.num_updates - u0, 1))

    def checkpoint_state(self) -> dict[str, Any]:
        """Everything a resume needs (see :mod:`rl_transformers.algos.ppo_checkpoint`)."""
        return checkpoint_state(self)

    def load_checkpoint_state(self, ckpt: dict[str, Any], source: str | Path = "checkpoint") -> None:
        """Restore what :meth:`checkpoint_state` saved (see :func:`restore_checkpoint`)."""
        restore_checkpoint(self, ckpt, source)

    # -- the loop -------------------------------------------------------------------------------------------
    def learn(self, run: Run, callback: Callable[[PPOTrainer], bool | None] | None = None) -> TrainResult:
        """Run updates until total_timesteps. ``callback(trainer)`` after each update; False stops the run.

        Each update, cleanrl's phases: anneal the learning rate, collect a rollout, train the epochs, log, then
        checkpoint and evaluate when due (:meth:`Run.end_iteration`: saved before evaluating)."""
        cfg, ppo, logger = self.cfg, self.cfg.ppo, run.logger
        start_time, start_step = time.perf_counter(), self.global_step
        run.progress_bar(self.num_updates * self.batch_size, self.global_step, unit="step")
        with run.loop():
            while self.update < self.num_updates:
                # 1. learning rate
                lr = self.learning_rate()
                for group in self.optimizer.param_groups:
                    group["lr"] = lr
                # 2. rollout
                self.loop, episodes = collect_rollout(
                    self.policy,
                    self.envs,
                    self.storage,
                    self.loop,
                    ppo.gamma,
                    ppo.gae_lambda,
                    env_id=cfg.env_id,
                    global_step=self.global_step,
                )
                for ret, length in episodes:
                    self.episode_returns.append(ret)
                    self.episode_lengths.append(length)
                # 3. optimise
                collect_info = ppo.info_every > 0 and self.update % ppo.info_every == 0
                metrics = self.train_epochs(collect_info=collect_info and logger is not None)
                self._update_obs_norm()
                self.update += 1
                self.global_step += self.batch_size
                # 4. log
                fps = (self.global_step - start_step) / max(time.perf_counter() - start_time, 1e-9)
                if logger is not None:
                    self._record(logger, metrics, lr, fps)
                # 5. checkpoint, then evaluate, when due; write the log row
                eval_due = bool(cfg.eval_every) and _crossed(
                    self.global_step, self.batch_size, cfg.eval_every
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
        return TrainResult(
            algo="ppo",
            run_dir=run.dir,
            step=self.global_step,
            interrupted=run.interrupted,
            metrics=run.finish(self.global_step, self._payload),
            evaluations=run.evaluations,
            episode_returns=list(self.episode_returns),
        )

    def _payload(self) -> dict[str, Any] | None:
        """The checkpoint payload on rank 0 (other ranks save nothing)."""
        return self.checkpoint_state() if self.dist.is_main else None

    def _evaluation(self) -> tuple[dict[str, float], float]:
        """Greedy evaluation: logged scalars and the value that ranks best.pt."""
        rets, lens = self.evaluate(self.cfg.eval_episodes)
        mean = float(rets.mean())
        return {rlt_logging.EVAL_MEAN_REWARD: mean, rlt_logging.EVAL_MEAN_EP_LENGTH: float(lens.mean())}, mean

    def _update_obs_norm(self) -> None:
        """Merge this rollout's observations into the policy's normaliser (after the epochs, so the update
        trained on exactly the statistics that acted); ranks merge the same all-reduced moments."""
        norm = self.policy.obs_norm
        if norm is None:
            return
        n, total, total_sq = norm.moments(self.storage.obs)
        flat = allreduce_sum(torch.cat([n.view(1), total.reshape(-1), total_sq.reshape(-1)]), self.dist)
        size = total.numel()
        norm.update_from_moments(
            flat[0], flat[1 : 1 + size].view_as(total), flat[1 + size :].view_as(total_sq)
        )

    def close(self) -> None:
        self.envs.close()


def make_adam(module: torch.nn.Module, lr: float, eps: float) -> torch.optim.Adam:
    """Adam with the fused kernel where torch has one for these parameters (several times faster on CPU for
    the many small tensors of a policy), else the multi-tensor one."""
    try:
        return torch.optim.Adam(module.parameters(), lr=lr, eps=eps, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.Adam(module.parameters(), lr=lr, eps=eps, foreach=True)


def _crossed(step: int, batch: int, every: int) -> bool:
    """True when ``step`` passed a multiple of ``every`` during the last ``batch`` steps."""
    return step // every > (step - batch) // every


# -- entry point --------------------------------------------------------------------------------------------
def train(
    cfg: TrainConfig,
    run_dir: Path | None = None,
    callback: Callable[[PPOTrainer], bool | None] | None = None,
) -> TrainResult:
    """Build (or resume) a run, train it, close it (:mod:`rl_transformers.algos.lifecycle`). Only rank 0 writes
    the run directory.

    With ``cfg.resume`` the saved config is merged with ``cfg`` by :func:`resume_config` (changed frozen
    fields are refused; see :mod:`rl_transformers.utils.resume`)."""
    resumed = load_resume(cfg, TrainConfig, lambda saved, given, src: resume_config(saved, given, str(src)))
    cfg = resumed.config if resumed is not None else cfg
    with session(cfg.device, cfg.threads) as (dist, device):
        trainer = PPOTrainer(cfg, dist, device)
        run = None
        try:
            if resumed is not None:
                trainer.load_checkpoint_state(resumed.checkpoint, resumed.source)
                if trainer.update >= trainer.num_updates and dist.is_main:
                    print(
                        f"resume: the run is already at step {trainer.global_step} >= --total-timesteps "
                        f"{cfg.total_timesteps}; nothing to train (raise --total-timesteps to continue)",
                        file=sys.stderr,
                    )
            run = Run(
                cfg,
                algo="ppo",
                name=cfg.env_id,
                dist=dist,
                step=trainer.global_step,
                resumed=resumed,
                run_dir=run_dir,
                best_metric=rlt_logging.EVAL_MEAN_REWARD if cfg.eval_every else None,
                hparam_metrics=(rlt_logging.EP_REW_MEAN, rlt_logging.EVAL_MEAN_REWARD),
                headline=HEADLINE,
                keep_checkpoints=cfg.keep_checkpoints,
            )
            facts = {
                "batch_size": trainer.batch_size,
                "num_updates": trainer.num_updates,
                "device": str(device),
            }
            run.announce(trainer.policy, facts)
            return trainer.learn(run, callback)
        finally:
            if run is not None:
                run.close()
            trainer.close()


# -- loading and measuring ----------------------------------------------------------------------------------
def measure_throughput(cfg: TrainConfig, updates: int = 5, warmup: int = 1) -> dict[str, float]:
    """Env steps per second of rollouts alone and of whole PPO updates (rollout + training), after warm-up."""
    set_threads(cfg.threads or available_cores())
    trainer = PPOTrainer(cfg, device=resolve_device(cfg.device, DistContext()))
    ppo = cfg.ppo
    rollout_s = train_s = 0.0
    try:
        for i in range(warmup + updates):
            t0 = time.perf_counter()
            trainer.loop, _ = collect_rollout(
                trainer.policy, trainer.envs, trainer.storage, trainer.loop, ppo.gamma, ppo.gae_lambda
            )
            t1 = time.perf_counter()
            trainer.train_epochs()
            t2 = time.perf_counter()
            if i >= warmup:
                rollout_s += t1 - t0
                train_s += t2 - t1
    finally:
        trainer.close()
    steps = updates * trainer.batch_size
    return {
        "rollout_steps_per_s": steps / rollout_s,
        "train_steps_per_s": steps / train_s,
        "steps_per_s": steps / (rollout_s + train_s),
        "threads": float(torch.get_num_threads()),
        "num_envs": float(cfg.num_envs),
        "parameters": float(sum(p.numel() for p in trainer.policy.parameters())),
    }
