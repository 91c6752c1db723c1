"""The optimisation phase of a PPO update: the clipped-surrogate loss (:func:`ppo_loss`), Adam, the epochs
over a stored rollout (:func:`train_epochs`) and the observation normaliser's merge (:func:`update_obs_norm`).

PPO (Schulman et al. 2017, arXiv 1707.06347) with optional value clipping, an entropy bonus, per-minibatch
advantage normalisation, a target-KL stop and gradient-norm clipping, as in the "37 implementation details"
(Huang et al. 2022, ICLR blog track); backbone aux losses are added with weights (``aux_coef``, per-name
``aux_weights``). Each minibatch is a set of whole training sequences, re-run from their stored states
(:meth:`~rl_transformers.policies.actor_critic.ActorCritic.evaluate_sequence`); under data parallelism the
gradients, the KL and a non-finite flag are all-reduced so every rank takes the same decisions.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, cast

import numpy as np
import torch

from rl_transformers.algos.ppo_config import PPOConfig
from rl_transformers.algos.storage import RolloutStorage, SequenceBatch
from rl_transformers.policies.actor_critic import ActorCritic
from rl_transformers.runs.distributed import DistContext, allreduce_gradients, allreduce_sum
from rl_transformers.utils.training import NonFiniteError

__all__ = ["evaluate_minibatch", "make_adam", "ppo_loss", "train_epochs", "update_obs_norm"]


def ppo_loss(
    new_log_prob: torch.Tensor,
    entropy: torch.Tensor,
    new_value: torch.Tensor,
    aux_losses: dict[str, torch.Tensor],
    batch: SequenceBatch,
    ppo: PPOConfig,
    clip: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped-surrogate PPO loss of one minibatch and its logged terms.

    L = E[max(-A r, -A clip(r, 1-ε, 1+ε))] - c_ent H + c_v · ½ E[max((V-R)², (V_clip-R)²)] + Σ w_k aux_k, with
    r = exp(log π - log π_old), A normalised per minibatch, V_clip = V_old + clip(V - V_old, -ε, ε); ε is
    ``clip`` (the update's annealed range) or ``ppo.clip_coef``.
    """
    eps = ppo.clip_coef if clip is None else clip
    logratio = new_log_prob - batch.log_probs
    ratio = logratio.exp()
    with torch.no_grad():
        approx_kl = ((ratio - 1) - logratio).mean()  # Schulman's k3 estimator of KL(old || new)
        clip_frac = ((ratio - 1.0).abs() > eps).float().mean()
    adv = batch.advantages
    if ppo.norm_adv and adv.numel() > 1:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - eps, 1 + eps)).mean()
    if ppo.clip_vloss:
        v_clipped = batch.values + (new_value - batch.values).clamp(-eps, eps)
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


def make_adam(module: torch.nn.Module, lr: float, eps: float) -> torch.optim.Adam:
    """Adam with the fused kernel where torch has one for these parameters (several times faster on CPU for
    the many small tensors of a policy), else the multi-tensor one."""
    try:
        return torch.optim.Adam(module.parameters(), lr=lr, eps=eps, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.Adam(module.parameters(), lr=lr, eps=eps, foreach=True)


def evaluate_minibatch(
    policy: ActorCritic, mb: SequenceBatch
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict, dict]:
    """New log-probs, entropies, values (B, W) of a minibatch, plus aux losses and info."""
    b, w = mb.log_probs.shape
    if len(mb.state_groups) == 1:
        rows, state = mb.state_groups[0]
        if rows.shape[0] == b and torch.equal(rows.cpu(), torch.arange(b)):  # every row, in order: no gathers
            out = policy.evaluate_sequence(mb.obs, mb.actions, state, mb.episode_starts)
            return out.log_prob, out.entropy, out.value, dict(out.aux_losses), out.info
    new_lp = mb.log_probs.new_empty(b, w)
    ent = mb.log_probs.new_empty(b, w)
    val = mb.log_probs.new_empty(b, w)
    aux: dict[str, torch.Tensor] = {}
    info: dict[str, Any] = {}
    for rows, state in mb.state_groups:
        sel = mb.select(rows)
        out = policy.evaluate_sequence(sel["obs"], sel["actions"], state, sel["episode_starts"])
        new_lp = new_lp.index_put((rows,), out.log_prob)
        ent = ent.index_put((rows,), out.entropy)
        val = val.index_put((rows,), out.value)
        frac = len(rows) / b
        for name, value in out.aux_losses.items():
            aux[name] = aux.get(name, 0.0) + frac * value
        info = info or out.info
    return new_lp, ent, val, aux, info


def train_epochs(
    policy: ActorCritic,
    optimizer: torch.optim.Optimizer,
    storage: RolloutStorage,
    ppo: PPOConfig,
    generator: torch.Generator,
    dist: DistContext,
    global_step: int,
    collect_info: bool = False,
    clip: float | None = None,
) -> dict[str, float]:
    """PPO epochs over the stored rollout; returns the update's mean statistics (loss terms, ``grad_norm``,
    ``explained_variance``, ``n_steps`` and, with ``collect_info``, the backbone's ``info:<name>``
    diagnostics of the first minibatch); ``clip``: this update's clip range (default ``ppo.clip_coef``). A
    non-finite loss or gradient norm raises :class:`NonFiniteError` (``global_step``: where, for the message)."""
    stats: dict[str, list[float]] = defaultdict(list)
    infos: dict[str, list[float]] = defaultdict(list)
    params = [p for p in policy.parameters() if p.requires_grad]
    kl_stop = False
    for epoch in range(ppo.update_epochs):
        for i, mb in enumerate(storage.minibatches(ppo.num_minibatches, generator)):
            policy.collect_info = collect_info and epoch == 0 and i == 0
            new_lp, entropy, new_v, aux, info = evaluate_minibatch(policy, mb)
            policy.collect_info = False
            loss, terms = ppo_loss(new_lp, entropy, new_v, aux, mb, ppo, clip)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            loss_value = terms["loss"]
            nonfinite = 0.0 if math.isfinite(loss_value) else 1.0
            shared = allreduce_gradients(
                policy, dist, torch.tensor([terms["kl"], nonfinite], dtype=torch.float64)
            )
            grad_norm = torch.nn.utils.clip_grad_norm_(params, ppo.max_grad_norm)
            if shared[1] > 0 or not torch.isfinite(grad_norm):
                what = "loss" if shared[1] > 0 else "gradient norm"
                raise NonFiniteError(what, global_step, f"loss={loss_value}, grad_norm={float(grad_norm)}")
            if ppo.target_kl is not None and float(shared[0]) > 1.5 * ppo.target_kl:
                kl_stop = True
                break
            optimizer.step()
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
    returns = storage.returns.flatten()
    values = storage.values.flatten()
    var = float(returns.var()) if returns.numel() > 1 else 0.0
    explained = float("nan") if var == 0 else 1.0 - float((returns - values).var()) / var
    out = {k: float(np.mean(v)) for k, v in stats.items() if v}
    out["explained_variance"] = explained
    out["n_steps"] = float(len(stats["loss"]))
    out.update({f"info:{k}": float(np.mean(v)) for k, v in infos.items()})
    return out


def update_obs_norm(policy: ActorCritic, storage: RolloutStorage, dist: DistContext) -> None:
    """Merge this rollout's observations into the policy's normaliser (after the epochs, so the update trained
    on exactly the statistics that acted); ranks merge the same all-reduced moments."""
    norm = policy.obs_norm
    if norm is None:
        return
    n, total, total_sq = norm.moments(cast(torch.Tensor, storage.obs))
    flat = allreduce_sum(torch.cat([n.view(1), total.reshape(-1), total_sq.reshape(-1)]), dist)
    size = total.numel()
    norm.update_from_moments(flat[0], flat[1 : 1 + size].view_as(total), flat[1 + size :].view_as(total_sq))
