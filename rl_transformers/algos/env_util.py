"""Environment construction shared by every trainer and evaluator (the role of SB3's ``common/env_util.py``).

:func:`make_env_thunk` resolves an id safely (:func:`envs.resolve.resolve_env`: registered ids, ``rlt/`` tasks,
allow-listed ``module:`` prefixes, clear errors with the closest ids) and checks its kwargs *before* any env is
built; :func:`make_vec_env` stacks copies in a Sync/Async vector env with ``SAME_STEP`` autoreset (what the PPO
rollout needs); the Decision Transformer's evaluation and ``scripts/evaluate.py`` build their envs here too.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
from gymnasium.vector import AutoresetMode

__all__ = ["check_same_step", "make_env_thunk", "make_vec_env", "register_rlt_envs", "video_unavailable"]


def register_rlt_envs() -> None:
    """Register the ``rlt/`` tasks of the ``envs`` package."""
    module = importlib.import_module("envs")
    if not hasattr(module, "register_all"):
        # An editable install made before envs/__init__.py existed resolves ``envs`` to a bare namespace
        # package (its __init__ never runs); register through the registry module directly.
        importlib.import_module("envs.registry").register_all()


def make_env_thunk(
    env_id: str,
    env_kwargs: dict[str, Any] | None = None,
    render_mode: str | None = None,
    allow_env_modules: Sequence[str] = (),
    source: str = "--env-id",
) -> Callable[[], gym.Env]:
    """A picklable constructor for ``gym.make(env_id, **env_kwargs)``.

    The id is resolved now by :func:`envs.resolve.resolve_env` (registered ids only; a ``module:`` prefix
    only for allowed modules; clear errors with the closest ids) and ``env_kwargs`` are checked against the
    constructor, so a bad id or keyword fails here, in the calling process, not inside a vector-env worker.
    """
    from envs.resolve import check_env_kwargs, make_resolved, resolve_env

    spec = resolve_env(env_id, source=source, allow_modules=allow_env_modules)
    kwargs = dict(env_kwargs or {})
    check_env_kwargs(spec, kwargs, source=f"the env kwargs of {env_id!r}")
    if render_mode is not None:
        kwargs["render_mode"] = render_mode

    def thunk() -> gym.Env:
        return make_resolved(spec, source=f"the env kwargs of {env_id!r}", **kwargs)

    return thunk


def make_vec_env(
    env_id: str,
    num_envs: int,
    env_kwargs: dict[str, Any] | None = None,
    vectorization: str = "sync",
    allow_env_modules: Sequence[str] = (),
) -> gym.vector.VectorEnv:
    """``num_envs`` copies of the env in a Sync/AsyncVectorEnv with ``SAME_STEP`` autoreset.

    ``env_id`` goes through :func:`envs.resolve.resolve_env` (``allow_env_modules``: the
    ``--allow-env-modules`` flag); see :func:`make_env_thunk`."""
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    thunk = make_env_thunk(env_id, env_kwargs, allow_env_modules=allow_env_modules)
    fns = [thunk] * num_envs
    if vectorization == "sync":
        return gym.vector.SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    if vectorization == "async":
        return gym.vector.AsyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    raise ValueError(f"vectorization={vectorization!r} is not one of ['async', 'sync']")


def check_same_step(envs: gym.vector.VectorEnv) -> None:
    mode = envs.metadata.get("autoreset_mode")
    if mode != AutoresetMode.SAME_STEP:
        raise ValueError(
            f"vector env autoreset_mode={mode!r}; the rollout needs AutoresetMode.SAME_STEP "
            "(final observations in info['final_obs']); build it with make_vec_env"
        )


def video_unavailable(
    env_id: str, env_kwargs: dict[str, Any] | None = None, allow_env_modules: Sequence[str] = ()
) -> str | None:
    """Why episodes of ``env_id`` cannot be recorded as video (None when they can)."""
    if importlib.util.find_spec("moviepy") is None:
        return "moviepy is not installed (pip install moviepy) - gymnasium's RecordVideo needs it"
    env = make_env_thunk(env_id, env_kwargs, allow_env_modules=allow_env_modules)()
    modes = list(env.metadata.get("render_modes", []))
    env.close()
    if "rgb_array" not in modes:
        return f"{env_id} does not render rgb_array frames (render_modes={modes})"
    return None
