"""``rl_transformers.load``: a trained agent from a run directory or a checkpoint file, PPO and DT alike.

Everything is read as data: the checkpoint with torch's safe loader (``weights_only=True``, via
:func:`~rl_transformers.runs.checkpoint_load.load_checkpoint`), the run configuration from the checkpoint's JSON
config (type-checked by :func:`~rl_transformers.utils.config_json.from_dict`). Nothing is unpickled or imported from
the files; pickled env / loop blobs that PPO checkpoints keep for exact resume are ignored.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch

from envs.file_rules import check_file_kwargs
from rl_transformers.agents.dt_agent import DecisionTransformerAgent
from rl_transformers.agents.memory_bound import (
    backbone_bytes,
    backbone_params,
    check_memory,
    check_weights_count,
    policy_bytes,
)
from rl_transformers.agents.ppo_agent import PPOAgent
from rl_transformers.agents.run_listing import missing_run_message
from rl_transformers.runs.checkpoint_load import DT_WHAT, check_finite_weights, check_weights_fit
from rl_transformers.runs.config import check_module_names
from rl_transformers.utils.errors import UserError, choice_hint

Which = Literal["last", "best"]


class CheckpointNotFoundError(UserError, FileNotFoundError):
    """A run directory or checkpoint path that does not exist or holds no checkpoint (a user error)."""


def _checkpoint_file(path: Path, which: Which) -> Path:
    """The checkpoint file a path names: the file itself, or ``<run>/checkpoints/<which>.pt``."""
    from rl_transformers.runs.checkpoint_load import latest_checkpoint

    if which not in ("last", "best"):
        raise UserError(f"checkpoint={which!r}; {choice_hint(which, ['last', 'best'])}")
    if path.is_file():
        return path
    if not path.exists():
        raise CheckpointNotFoundError(missing_run_message(path))  # lists the runs that exist
    directory = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    if (directory / f"{which}.pt").is_file():
        return directory / f"{which}.pt"
    if which == "best":
        raise CheckpointNotFoundError(
            f"{directory}: no best.pt (the run logged no evaluation); use checkpoint='last'"
        )
    found = latest_checkpoint(path)
    if found is None:
        raise CheckpointNotFoundError(f"{path}: no checkpoint found (looked for last.pt and step_<n>.pt)")
    return found


def load(
    path: str | Path,
    device: str | torch.device = "cpu",
    *,
    checkpoint: Which = "last",
    env_id: str | None = None,
    allow_env_modules: Sequence[str] = (),
    max_memory_gib: float | None = None,
) -> PPOAgent | DecisionTransformerAgent:
    """The agent of a run directory (its ``checkpoints/last.pt``, or ``best.pt``) or of a checkpoint file.

    Args:
        path: a run directory (``runs/ppo/<env>/<run>``, ``runs/dt/<dataset>/<run>``) or a ``.pt`` file.
        device: torch device of the agent.
        checkpoint: ``"last"`` or ``"best"`` when ``path`` is a run directory.
        env_id: DT runs only: the evaluation env, when the run's dataset names none.
        allow_env_modules: modules whose environments the run (its env id, its dataset's env spec) may name
            beyond gymnasium, envs, popgym and minigrid (``--allow-env-modules``; envs/resolve.py). Never read
            from the run's files: a run trained with the flag needs it again here.
        max_memory_gib: the largest memory estimate accepted for the model the checkpoint's config describes
            (:mod:`~rl_transformers.agents.memory_bound`; default 4 GiB), checked before anything is built.

    Returns:
        :class:`~rl_transformers.agents.ppo_agent.PPOAgent` (``predict`` as sb3-contrib's RecurrentPPO) for
        PPO runs, :class:`~rl_transformers.agents.dt_agent.DecisionTransformerAgent`
        (``as_stateful_wrapper(target_return)``) for DT / BC runs.
    """
    from rl_transformers.runs.checkpoint_load import load_checkpoint

    allowed = check_module_names(allow_env_modules)
    file = _checkpoint_file(Path(path), checkpoint)
    ckpt = load_checkpoint(file, map_location=device)
    if "model_kwargs" in ckpt and "model" in ckpt:
        return _load_dt(ckpt, file, device, env_id, allowed, max_memory_gib)
    if "policy" in ckpt and "config" in ckpt:
        if env_id is not None:
            raise UserError("env_id= applies to DT runs only; a PPO run evaluates in its own env")
        return _load_ppo(ckpt, file, device, allowed, max_memory_gib)
    raise UserError(
        f"{file}: not a PPO or DT checkpoint of this library (keys: {sorted(ckpt)[:8]}; expected 'policy' + "
        "'config' or 'model' + 'model_kwargs')"
    )


def _config(cls: type, ckpt: dict[str, Any], file: Path, allow_env_modules: tuple[str, ...]) -> Any:
    """The run's config; its per-invocation fields come from this call, never from the file."""
    from rl_transformers.runs.config import saved_form
    from rl_transformers.utils.config_json import from_dict

    try:
        cfg: Any = from_dict(cls, ckpt["config"])
    except (TypeError, ValueError, KeyError) as err:
        raise UserError(f"{file}: its config does not load as {cls.__name__}: {err}") from err
    return dataclasses.replace(saved_form(cfg), allow_env_modules=allow_env_modules)


def _load_ppo(
    ckpt: dict[str, Any],
    file: Path,
    device: str | torch.device,
    allowed: tuple[str, ...],
    max_memory_gib: float | None = None,
) -> PPOAgent:
    from rl_transformers.algos.env_util import make_env_thunk
    from rl_transformers.algos.ppo_config import TrainConfig
    from rl_transformers.policies.gtrxl import make_policy

    cfg = _config(TrainConfig, ckpt, file, allowed)
    check_finite_weights(ckpt["policy"], file, "policy weights")
    check_file_kwargs(cfg.env_kwargs, "its config's env_kwargs", lambda why: UserError(f"{file}: {why}"))
    env = make_env_thunk(cfg.env_id, cfg.env_kwargs, allow_env_modules=cfg.allow_env_modules)()
    try:
        spaces = (env.observation_space, env.action_space)
    finally:
        env.close()
    n_inputs = int(sum(math.prod(getattr(s, "shape", ()) or (1,)) for s in spaces))
    estimate = policy_bytes(cfg.policy, cfg.num_envs, cfg.ppo.seq_len, n_inputs)
    if cfg.policy.kind == "transformer":
        check_weights_count(
            backbone_params(cfg.policy.backbone), ckpt["policy"], str(file), "config's policy"
        )
    check_memory(
        estimate, str(file), f"the policy its config describes (at its {cfg.num_envs} envs)", max_memory_gib
    )
    check_weights_fit(
        lambda: make_policy(cfg.policy, *spaces), ckpt["policy"], file, "policy its config describes"
    )
    policy = make_policy(cfg.policy, *spaces).to(device)
    try:
        policy.load_state_dict(ckpt["policy"])
    except RuntimeError as err:
        raise UserError(f"{file}: its weights do not fit the policy its config describes: {err}") from err
    meta = ckpt.get("checkpoint_meta") or {}
    step = int(ckpt.get("global_step", meta.get("step", 0)))
    return PPOAgent(policy, cfg, device, checkpoint=file, step=step, update=int(ckpt.get("update", 0)))


def _bound_dt(ckpt: dict[str, Any], file: Path, batch: int, max_memory_gib: float | None) -> None:
    """The DT model_kwargs' sizes against the shipped weights and the memory bound, before anything is built."""
    from rl_transformers.backbone.config import BackboneConfig

    kwargs = ckpt["model_kwargs"]
    backbone = BackboneConfig.from_dict(kwargs["backbone"])
    context, max_ep_len = kwargs["context_len"], kwargs["max_ep_len"]
    for name, value in (("context_len", context), ("max_ep_len", max_ep_len)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise UserError(f"{file}: model_kwargs {name} = {value!r} is not a positive integer")
    segments = kwargs.get("segments", 1)
    tokens = 3 * context * (segments if isinstance(segments, int) and segments > 1 else 1)
    table = (max_ep_len + 3 * context) * backbone.d_model  # timestep embedding and the position table
    check_weights_count(backbone_params(backbone) + table, ckpt["model"], str(file), "model_kwargs")
    estimate = backbone_bytes(backbone, batch, tokens, extra_params=table)
    check_memory(
        estimate, str(file), f"the model its model_kwargs describe (at {batch} envs)", max_memory_gib
    )


def _load_dt(
    ckpt: dict[str, Any],
    file: Path,
    device: str | torch.device,
    env_id: str | None,
    allowed: tuple[str, ...],
    max_memory_gib: float | None = None,
) -> DecisionTransformerAgent:
    from rl_transformers.algos.dt_config import DTConfig
    from rl_transformers.policies.decision_transformer import DecisionTransformer

    cfg = _config(DTConfig, ckpt, file, allowed)
    check_finite_weights(ckpt["model"], file, "model weights")
    try:  # any malformed field raises: KeyError, TypeError, ValueError, AttributeError, UserError ...
        _bound_dt(ckpt, file, cfg.eval_envs, max_memory_gib)
        check_weights_fit(
            lambda: DecisionTransformer.from_kwargs(ckpt["model_kwargs"]), ckpt["model"], file, DT_WHAT
        )
        model = DecisionTransformer.from_kwargs(ckpt["model_kwargs"])
    except UserError:
        raise
    except Exception as err:
        raise UserError(
            f"{file}: its model_kwargs do not build a Decision Transformer ({type(err).__name__}: {err})"
        ) from None
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError as err:
        raise UserError(f"{file}: its weights do not fit the model its kwargs describe: {err}") from err
    model = model.to(device).eval()
    return DecisionTransformerAgent(
        model, cfg, ckpt.get("dataset") or {}, checkpoint=file, step=int(ckpt.get("step", 0)), env_id=env_id
    )


__all__ = ["load"]
