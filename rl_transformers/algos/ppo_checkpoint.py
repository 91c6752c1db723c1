"""PPO checkpoints: the format's helpers and loading a trained policy (the trainer saves and restores:
:meth:`~rl_transformers.algos.ppo.PPOTrainer.checkpoint_state`).

A checkpoint holds tensors and plain data (policy, optimizer, RNG states, counters, the learning-rate anchor,
the env spaces) and, for a single-process run with sync envs, the envs and the rollout loop as ONE pickled blob
signed with this user's key (:mod:`rl_transformers.utils.trust`). On resume the blob is unpickled only when its
signature verifies (or under ``--trust-checkpoint``); otherwise the run continues with fresh episodes and a
warning naming the file. ``load_policy`` never touches the blob.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch

from rl_transformers.algos.ppo_config import TrainConfig
from rl_transformers.algos.rollout import LoopState
from rl_transformers.policies.actor_critic import ActorCritic
from rl_transformers.policies.encoders import tree_map
from rl_transformers.policies.gtrxl import make_policy
from rl_transformers.runs.checkpoint_load import latest_checkpoint, load_checkpoint
from rl_transformers.runs.config import check_module_names, saved_form
from rl_transformers.runs.resume import saved_config
from rl_transformers.utils.errors import UserError

RESUME_BLOB = "resume_state"
"""Checkpoint key of the signed (envs, loop) blob."""


def move_loop(loop: LoopState, device: torch.device | str) -> LoopState:
    state = loop.policy_state
    return LoopState(
        obs=tree_map(lambda x: x.to(device), loop.obs),
        episode_start=loop.episode_start.to(device),
        policy_state=state.map(lambda t: t.to(device)) if hasattr(state, "map") else state,
        ep_return=loop.ep_return.copy(),
        ep_length=loop.ep_length.copy(),
    )


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


def init_policy(
    policy: ActorCritic, path: str | Path, obs_space: gym.Space, act_space: gym.Space, env_id: str
) -> tuple[Path, int]:
    """Load the policy weights of the PPO checkpoint ``path`` (a file, or a run directory's latest) into
    ``policy`` (``--init-from``); returns the file and the env step it was saved at."""
    source = latest_checkpoint(path) if Path(path).exists() else None
    if source is None:
        raise UserError(
            f"--init-from {path}: no checkpoint there (a step_<n>.pt / last.pt file or a run directory)"
        )
    ckpt = load_checkpoint(source, map_location=next(policy.parameters()).device)
    if not isinstance(ckpt, dict) or "policy" not in ckpt:
        raise UserError(f"--init-from {source}: no 'policy' weights; not a PPO checkpoint of rl_transformers")
    load_policy_weights(policy, ckpt, source, obs_space, act_space, env_id)
    return source, int(ckpt.get("global_step", 0))


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
