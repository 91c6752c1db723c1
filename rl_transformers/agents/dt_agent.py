"""A trained Decision Transformer (or BC) run, and the stateful rollout wrapper d3rlpy users know.

Chen et al. 2021 (arXiv 2106.01345) act by conditioning on a target return: the return-to-go starts at the
target and each reward is subtracted from it. :meth:`DecisionTransformerAgent.as_stateful_wrapper` gives,
in the spirit of d3rlpy's ``as_stateful_wrapper(target_return)``::

    wrapper = agent.as_stateful_wrapper(target_return=500)
    obs, _ = env.reset(seed=0); reward, done = 0.0, False
    while not done:
        action = wrapper.predict(obs, reward)      # reward: what the previous action earned (ignored at t=0)
        obs, reward, terminated, truncated, _ = env.step(action)
        done = terminated or truncated
    wrapper.reset()                                # before the next episode

Batched envs: ``as_stateful_wrapper(target, num_envs=N)``, observations (N, *obs_shape), rewards (N,), and
``episode_start`` (N,) bool for envs whose episode begins with this observation (a vector env's previous
``terminated | truncated``); their reward is ignored and their context cleared. The wrapper drives the same
:class:`~rl_transformers.policies.dt_rollout.DTAgent` as the trainer's evaluation, so the same seeds
give the same episodes. A model trained with ``--segments N`` carries its backbone memory across the episode
(DTAgent's segment mode); ``reset()`` and ``episode_start`` clear it with the context.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import torch

from rl_transformers.algos.dt_config import DTConfig
from rl_transformers.policies.decision_transformer import DecisionTransformer
from rl_transformers.policies.dt_rollout import DTAgent
from rl_transformers.runs.lifecycle import run_dir_of
from rl_transformers.utils.errors import UserError


class StatefulDTWrapper:
    """``predict(observation, reward)`` per step, ``reset()`` per episode (see the module docstring)."""

    def __init__(
        self,
        model: DecisionTransformer,
        target_return: float | None,
        num_envs: int = 1,
        *,
        mode: Literal["auto", "recompute"] = "auto",
    ) -> None:
        if model.condition_on_return and target_return is None:
            raise UserError("this Decision Transformer is return-conditioned: give a target_return")
        self.model = model
        self.num_envs = int(num_envs)
        self.mode = mode
        self._target = target_return
        self.reset()

    @property
    def target_return(self) -> float | None:
        return self._target

    def set_target(self, target_return: float) -> None:
        """A new target for the episodes that start from now on."""
        self._target = target_return
        self._agent.set_target(target_return)

    def reset(self, mask: np.ndarray | None = None) -> None:
        """Start new episodes: every env (``mask=None``) or the envs of ``mask`` (n_envs,) bool."""
        if mask is None:
            self._agent = DTAgent(self.model, self.num_envs, self._target, mode=self.mode)
            self._acted = np.zeros(self.num_envs, dtype=bool)
            return
        rows = np.asarray(mask, dtype=bool).reshape(self.num_envs)
        self._agent.reset(rows)
        self._acted &= ~rows

    def predict(
        self, observation: Any, reward: float | np.ndarray = 0.0, episode_start: np.ndarray | None = None
    ) -> np.ndarray:
        """The action for ``observation``; ``reward``: what the previous action earned (see module)."""
        n, shape = self.num_envs, tuple(self.model.obs_shape)
        obs = np.asarray(observation)
        single = obs.shape == shape
        if not single and obs.shape != (n, *shape):
            expected = f"{shape} or {(n, *shape)}" if n == 1 else f"{(n, *shape)}"
            raise UserError(
                f"observation of shape {obs.shape} does not fit this wrapper: expected {expected}"
            )
        if single and n != 1:
            raise UserError(f"this wrapper steps {n} envs: give observations of shape {(n, *shape)}")
        rewards = np.broadcast_to(np.asarray(reward, dtype=np.float64).reshape(-1), (n,))
        starts = (
            np.zeros(n, dtype=bool) if episode_start is None else np.asarray(episode_start, bool).reshape(n)
        )
        continuing = self._acted & ~starts
        if continuing.any():
            self._agent.observe(np.where(continuing, rewards, 0.0))
            if not continuing.all():  # new or just-reset rows: (re)start them after the shared time step
                self._agent.reset(~continuing)
        elif (starts & self._acted).any():
            self._agent.reset(starts & self._acted)
        action = self._agent.act(obs.reshape(n, *shape))
        self._acted[:] = True
        if self.model.discrete_actions:
            action = action.astype(np.int64)
        return action[0] if single else action


class DecisionTransformerAgent:
    """A trained DT / BC model with its run's configuration; build it with :func:`rl_transformers.load`.

    Attributes: ``model`` (eval mode), ``config`` (:class:`~rl_transformers.algos.dt_config.DTConfig`),
    ``dataset`` (what the checkpoint records of its data: env id, reference scores), ``checkpoint``,
    ``step``, ``observation_space`` / ``action_space``.
    """

    algo = "dt"

    def __init__(
        self,
        model: DecisionTransformer,
        config: DTConfig,
        dataset: dict[str, Any],
        checkpoint: Path | None = None,
        step: int | None = None,
        env_id: str | None = None,
    ) -> None:
        self.model = model.eval()
        self.config = config
        self.dataset = dict(dataset)
        self.checkpoint = checkpoint
        self.step = step
        self._env_id = env_id
        self.observation_space = model.observation_space
        self.action_space = model.action_space

    @property
    def env_id(self) -> str | None:
        """Evaluation env: the ``env_id`` given to ``load``, else the recorded spec's, the run's ``--env-id``, or
        the dataset's."""
        spec = self.dataset.get("env_spec")
        recorded = spec.get("id") if isinstance(spec, dict) and isinstance(spec.get("id"), str) else None
        return self._env_id or recorded or self.config.env_id or self.dataset.get("env_id")

    def as_stateful_wrapper(
        self, target_return: float | None = None, num_envs: int = 1, **kwargs: Any
    ) -> StatefulDTWrapper:
        """A :class:`StatefulDTWrapper` acting towards ``target_return`` (None for BC runs)."""
        return StatefulDTWrapper(self.model, target_return, num_envs, **kwargs)

    def default_targets(self) -> list[float | None]:
        """The run's ``--target-returns``, else the targets its last evaluation used (``eval/step_<n>.json``)."""
        if not self.model.condition_on_return:
            return [None]
        if self.config.target_returns:
            return list(self.config.target_returns)
        run_dir = run_dir_of(self.checkpoint) if self.checkpoint is not None else None
        evals = sorted((run_dir / "eval").glob("step_*.json"), key=_step_of) if run_dir else []
        if evals:
            episodes = json.loads(evals[-1].read_text(encoding="utf-8")).get("episodes", [])
            return [float(e["target"]) for e in episodes if e.get("target") is not None]
        raise UserError("this run records no target returns: give one (--target-return 500)")

    def make_env_factory(self) -> Any:
        """A constructor ``make_env(**kwargs)`` of the env this run was evaluated on while training, exactly.

        In order: the ``env_id`` given to :func:`rl_transformers.load` (the user restating the env knowingly);
        the full env spec the checkpoint records (:mod:`envs.spec_record`); the run's
        ``--env-id``; for a checkpoint that records no spec, the dataset's own spec when the dataset is still
        readable. Anything else -- a recorded spec that is refused or malformed, a dataset that moved, is
        unreadable or refused -- is a :class:`UserError` naming the cause and the fix, never a fall-back to
        the bare env id. Every env goes through :mod:`envs.resolve` with the ``allow_env_modules`` given to
        :func:`rl_transformers.load`."""
        from envs.spec_record import RESTATE_FIX, recorded_env_factory

        allowed = self.config.allow_env_modules
        if self._env_id:
            return _by_id(self._env_id, allowed)
        if "env_spec" in self.dataset and self.dataset["env_spec"] is not None:
            return recorded_env_factory(self.dataset["env_spec"], f"checkpoint {self.checkpoint}", allowed)
        if self.config.env_id:
            return _by_id(self.config.env_id, allowed)
        try:
            from offline_data.loading import load_episodes

            info = load_episodes(
                self.config.dataset, root=self.config.dataset_root, allow_env_modules=allowed
            ).info
        except (FileNotFoundError, OSError, ValueError) as err:
            raise UserError(
                f"this run's checkpoint records no env spec and its dataset {self.config.dataset!r}, which "
                f"holds the env it was evaluated on, gives none here: {err}. The bare env id "
                f"{self.dataset.get('env_id')!r} may differ from that env (its keyword arguments, its time "
                f"limit); {RESTATE_FIX}"
            ) from None
        if (info.eval_env_spec or info.env_spec) is None:
            raise UserError(
                f"this run's dataset {self.config.dataset!r} records no environment; {RESTATE_FIX}"
            )
        return info.make_env

    def evaluate(
        self,
        targets: Sequence[float | None],
        n_episodes: int,
        seed: int,
        num_envs: int = 10,
    ) -> list[Any]:
        """The trainer's evaluation (:func:`rl_transformers.algos.evaluation.evaluate_dt`): episode i: seed + i."""
        from rl_transformers.algos.evaluation import evaluate_dt as evaluate

        make_env = self.make_env_factory()
        env = make_env()
        try:
            limited = env.spec is not None and env.spec.max_episode_steps is not None
        finally:
            env.close()
        max_steps = None if limited else self.model.max_ep_len
        with torch.no_grad():
            return evaluate(self.model, make_env, targets, n_episodes, seed, num_envs, max_steps)

    def __repr__(self) -> str:
        return (
            f"DecisionTransformerAgent(algo={self.config.algo!r}, env_id={self.env_id!r}, step={self.step})"
        )


def _by_id(env_id: str, allow_env_modules: Sequence[str] = ()) -> Any:
    """``make_env(render_mode=None)`` for a registered id (``rlt/`` ids included), through the safe resolver."""
    from rl_transformers.algos.env_util import make_env_thunk

    def make_env(render_mode: str | None = None) -> gym.Env:
        return make_env_thunk(env_id, None, render_mode=render_mode, allow_env_modules=allow_env_modules)()

    return make_env


def _step_of(path: Path) -> int:
    try:
        return int(path.stem.split("_")[-1])
    except ValueError:
        return -1


__all__ = ["DecisionTransformerAgent", "StatefulDTWrapper"]
