"""PPO checkpoints: what a save holds, how a resume restores it, and loading a trained policy.

A checkpoint holds tensors and plain data (policy, optimizer, RNG states, counters, the learning-rate anchor,
the env spaces) and, for a single-process run with sync envs, the envs and the rollout loop as ONE pickled blob
signed with this user's key (:mod:`rl_transformers.utils.trust`). On resume the blob is unpickled only when its
signature verifies (or under ``--trust-checkpoint``); otherwise the run continues with fresh episodes and a
warning naming the file. ``load_policy`` never touches the blob.
"""

from __future__ import annotations

import dataclasses
import pickle
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import torch

from rl_transformers.algos.ppo_config import TrainConfig
from rl_transformers.algos.rollout import LoopState, reset_loop
from rl_transformers.algos.run_config import check_module_names, saved_form
from rl_transformers.policies.encoders import tree_map
from rl_transformers.policies.gtrxl import ActorCritic, make_policy
from rl_transformers.utils import (
    capture_rng_state,
    latest_checkpoint,
    linear_schedule,
    load_checkpoint,
    restore_rng_state,
    seed_everything,
    to_jsonable,
)
from rl_transformers.utils.errors import UserError
from rl_transformers.utils.resume import saved_config
from rl_transformers.utils.trust import UntrustedBlob, load_signed, sign_blob

if TYPE_CHECKING:
    from rl_transformers.algos.ppo import PPOTrainer

RESUME_BLOB = "resume_state"
"""Checkpoint key of the signed (envs, loop) blob."""


def _move_loop(loop: LoopState, device: torch.device | str) -> LoopState:
    state = loop.policy_state
    return LoopState(
        obs=tree_map(lambda x: x.to(device), loop.obs),
        episode_start=loop.episode_start.to(device),
        policy_state=state.map(lambda t: t.to(device)) if hasattr(state, "map") else state,
        ep_return=loop.ep_return.copy(),
        ep_length=loop.ep_length.copy(),
    )


def checkpoint_state(tr: PPOTrainer) -> dict[str, Any]:
    """The checkpoint payload of trainer ``tr`` (tensors and plain data, plus the signed env blob)."""
    blob = None
    if isinstance(tr.envs, gym.vector.SyncVectorEnv) and not getattr(tr, "_unpicklable", False):
        try:
            blob = sign_blob((tr.envs.envs, _move_loop(tr.loop, "cpu")), RESUME_BLOB)
        except (pickle.PicklingError, AttributeError, TypeError) as err:
            tr._unpicklable = True  # type: ignore[attr-defined]
            warnings.warn(
                f"the envs of {tr.cfg.env_id!r} cannot be pickled ({err}); checkpoints hold no env "
                "state, a resume starts fresh episodes",
                stacklevel=2,
            )
    return {
        "config": to_jsonable(saved_form(tr.cfg)),
        "policy": tr.policy.state_dict(),
        "optimizer": tr.optimizer.state_dict(),
        "global_step": tr.global_step,
        "update": tr.update,
        "num_updates": tr.num_updates,
        "lr_anchor": {"update": tr.lr_anchor[0], "lr": tr.lr_anchor[1]},
        "spaces": describe_spaces(tr.envs.single_observation_space, tr.envs.single_action_space),
        "rng": capture_rng_state(),
        "generator": tr.generator.get_state(),
        "episode_returns": list(tr.episode_returns),
        "episode_lengths": list(tr.episode_lengths),
        "reward_norm": None if tr.reward_norm is None else tr.reward_norm.state_dict(),
        RESUME_BLOB: blob,
    }


def restore_checkpoint(tr: PPOTrainer, ckpt: dict[str, Any], source: str | Path = "checkpoint") -> None:
    """Restore everything :func:`checkpoint_state` saved (envs and loop only on rank 0 with sync envs,
    and only from a blob signed with this user's key unless ``cfg.trust_checkpoint``)."""
    missing = [k for k in ("policy", "optimizer", "global_step", "update") if k not in ckpt]
    if missing:
        raise UserError(f"checkpoint {source} lacks {missing}: not a PPO checkpoint of rl_transformers")
    load_policy_weights(
        tr.policy,
        ckpt,
        source,
        tr.envs.single_observation_space,
        tr.envs.single_action_space,
        tr.cfg.env_id,
    )
    tr.optimizer.load_state_dict(ckpt["optimizer"])
    tr.global_step = int(ckpt["global_step"])
    tr.update = int(ckpt["update"])
    tr.episode_returns.extend(float(r) for r in ckpt.get("episode_returns", []))
    tr.episode_lengths.extend(int(n) for n in ckpt.get("episode_lengths", []))
    _restore_schedule(tr, ckpt)
    _restore_reward_norm(tr, ckpt, source)
    exact = _restore_envs(tr, ckpt, source)
    if exact:
        try:
            restore_rng_state(ckpt["rng"])
            tr.generator.set_state(ckpt["generator"])
        except (KeyError, TypeError, ValueError, RuntimeError) as err:
            raise UserError(f"checkpoint {source}: its RNG states do not restore ({err})") from None
    else:  # fresh episodes; different seeds than the start so no episode repeats
        seed = tr.cfg.seed + tr.dist.rank * tr.cfg.num_envs + 7919 * tr.update
        tr.loop = reset_loop(tr.envs, tr.policy, seed, tr.device)
        if tr.reward_norm is not None:
            tr.reward_norm.restart_episodes()
        seed_everything(seed, tr.cfg.torch_deterministic)
        tr.generator.manual_seed(seed)


def _restore_reward_norm(tr: PPOTrainer, ckpt: dict[str, Any], source: str | Path) -> None:
    """The reward scaler's statistics (``ppo.norm_reward``); a checkpoint without them starts fresh ones."""
    saved = ckpt.get("reward_norm")
    if tr.reward_norm is None or saved is None:
        return
    try:
        tr.reward_norm.load_state_dict(saved, f"checkpoint {source}")
    except ValueError as err:
        raise UserError(str(err)) from None


def _restore_schedule(tr: PPOTrainer, ckpt: dict[str, Any]) -> None:
    """The learning-rate anchor: saved, or re-anchored where the budget changed (module docstring of ppo)."""
    anchor = ckpt.get("lr_anchor") or {"update": 0, "lr": tr.cfg.ppo.learning_rate}
    tr.lr_anchor = (int(anchor["update"]), float(anchor["lr"]))
    saved_updates = int(ckpt.get("num_updates", tr.num_updates))
    if saved_updates != tr.num_updates:  # budget changed: continue from the rate reached here
        u0, lr0 = tr.lr_anchor
        reached = linear_schedule(lr0, 0.0, (tr.update - u0) / max(saved_updates - u0, 1))
        tr.lr_anchor = (tr.update, reached if tr.cfg.ppo.anneal_lr else tr.cfg.ppo.learning_rate)


def _restore_envs(tr: PPOTrainer, ckpt: dict[str, Any], source: str | Path) -> bool:
    """Put back the pickled envs + loop when allowed; False (fresh episodes) otherwise."""
    if not (tr.dist.is_main and isinstance(tr.envs, gym.vector.SyncVectorEnv)):
        return False
    entry = ckpt.get(RESUME_BLOB)
    legacy = entry is None and isinstance(ckpt.get("envs"), torch.Tensor) and "loop" in ckpt
    if entry is None and not legacy:  # legacy: written before blobs were signed (two unsigned pickles)
        return False
    trust = tr.cfg.trust_checkpoint
    try:
        if legacy:
            if not trust:
                raise UntrustedBlob("it was written by an older version, without a signature")
            envs = load_signed({"data": ckpt["envs"]}, "envs", trust=True)
            loop = load_signed({"data": ckpt["loop"]}, "loop", trust=True)
        else:
            envs, loop = load_signed(entry, RESUME_BLOB, trust=trust)
    except UntrustedBlob as why:
        warnings.warn(
            f"checkpoint {source}: its saved environments are not unpickled ({why}). The run resumes "
            "with fresh episodes (policy, optimizer and counters restored; not bit-exact). If you trust "
            "this file, pass --trust-checkpoint to restore them.",
            stacklevel=3,
        )
        return False
    for env in tr.envs.envs:
        env.close()
    tr.envs.envs = envs
    tr.loop = _move_loop(loop, tr.device)
    return True


def describe_spaces(obs: gym.Space, act: gym.Space) -> dict[str, str]:
    return {"observation": str(obs), "action": str(act)}


def load_policy_weights(
    policy: ActorCritic,
    ckpt: dict[str, Any],
    source: str | Path,
    obs_space: gym.Space,
    act_space: gym.Space,
    env_id: str,
) -> None:
    """``policy.load_state_dict(ckpt["policy"])`` with a clear error when the env's spaces differ from the
    ones the checkpoint was trained on (instead of a raw state_dict size mismatch)."""
    here = describe_spaces(obs_space, act_space)
    saved = ckpt.get("spaces")
    mismatch = isinstance(saved, dict) and saved != here
    if not mismatch:
        try:
            policy.load_state_dict(ckpt["policy"])
            return
        except (RuntimeError, KeyError, TypeError) as err:
            if isinstance(saved, dict):
                raise UserError(f"checkpoint {source}: its policy weights do not load: {err}") from None
    saved_text = (
        f"observation space {saved.get('observation')}, action space {saved.get('action')}"
        if isinstance(saved, dict)
        else "other spaces (the weight shapes differ)"
    )
    raise UserError(
        f"checkpoint {source} was trained on {saved_text}; env {env_id!r} has observation space "
        f"{here['observation']}, action space {here['action']}. Evaluate it on the env it was trained on."
    )


def load_policy(
    path: str | Path, device: str | torch.device = "cpu", allow_env_modules: Sequence[str] = ()
) -> tuple[ActorCritic, TrainConfig]:
    """The policy of a checkpoint (file or run directory) and the run's config (whose ``allow_env_modules`` is
    the one given here, never the file's: it names the modules the run's env may come from)."""
    source = latest_checkpoint(path) or Path(path)
    ckpt = load_checkpoint(source, map_location=device)
    cfg = saved_config(TrainConfig, ckpt, source)
    cfg = dataclasses.replace(saved_form(cfg), allow_env_modules=check_module_names(allow_env_modules))
    if "policy" not in ckpt:
        raise UserError(
            f"checkpoint {source} has no 'policy' weights: not a PPO checkpoint of rl_transformers"
        )
    from rl_transformers.algos.env_util import make_env_thunk

    env = make_env_thunk(cfg.env_id, cfg.env_kwargs, allow_env_modules=cfg.allow_env_modules)()
    obs_space, act_space = env.observation_space, env.action_space
    env.close()
    policy = make_policy(cfg.policy, obs_space, act_space).to(device)
    load_policy_weights(policy, ckpt, source, obs_space, act_space, cfg.env_id)
    return policy, cfg
