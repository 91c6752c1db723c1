"""A trained PPO policy behind sb3-contrib's ``RecurrentPPO.predict`` contract, so Stable-Baselines3 tools
(``stable_baselines3.common.evaluation.evaluate_policy``, custom loops written for recurrent SB3 models) use it
unchanged.

``predict(observation, state=None, episode_start=None, deterministic=False) -> (action, state)`` takes NumPy
observations, one (``observation_space.shape``) or a batch (``(n_envs, *shape)``), and returns actions of the
same batching. ``state`` is opaque: pass back what the previous call returned (``None`` starts new episodes
in every env); ``episode_start`` (n_envs,) bool marks envs whose episode begins with this observation (their
memory is cleared), as a VecEnv's ``dones`` of the previous step. Observation normalisation (``--norm-obs``)
lives inside the policy, so raw env observations are what ``predict`` wants. Box actions are clipped to the
action space. Acting mirrors the trainer's evaluation step for step (the context of non-streaming cores is
trimmed on the training-window grid), so the same seeds give the same returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces

from rl_transformers.algos.ppo_config import TrainConfig
from rl_transformers.policies.actor_critic import ActorCritic
from rl_transformers.policies.encoders import obs_to_tensor
from rl_transformers.utils.errors import UserError


@dataclass(frozen=True)
class PolicyState:
    """What :meth:`PPOAgent.predict` carries between calls (treat as opaque)."""

    core: Any
    """The policy core's state (n_envs rows): XL memory, KV caches, RNN state ..."""
    n_steps: int
    """Calls made with this state (the training-window grid of context cores)."""
    n_envs: int


def _leaf(obs: Any, space: spaces.Space) -> tuple[np.ndarray, spaces.Space]:
    """The first array leaf of a (possibly Dict / Tuple) observation and its space."""
    if isinstance(space, spaces.Dict):
        key = next(iter(space.spaces))
        return _leaf(obs[key], space.spaces[key])
    if isinstance(space, spaces.Tuple):
        return _leaf(obs[0], space.spaces[0])
    return np.asarray(obs), space


def batch_size(observation: Any, space: spaces.Space) -> int | None:
    """``n_envs`` of a batched observation, ``None`` for a single one (SB3's ``is_vectorized_observation``)."""
    arr, leaf = _leaf(observation, space)
    shape = tuple(leaf.shape or ())
    if arr.shape == shape:
        return None
    if arr.ndim == len(shape) + 1 and arr.shape[1:] == shape:
        return int(arr.shape[0])
    raise UserError(
        f"observation of shape {arr.shape} does not fit the policy's observation space {leaf}: expected "
        f"{shape} (one env) or (n_envs, {', '.join(map(str, shape))}) (a batch)"
    )


def _add_batch_dim(observation: Any, space: spaces.Space) -> Any:
    if isinstance(space, spaces.Dict):
        return {k: _add_batch_dim(observation[k], s) for k, s in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(_add_batch_dim(o, s) for o, s in zip(observation, space.spaces))
    return np.asarray(observation)[None]


class PPOAgent:
    """A trained PPO policy (any core: GTrXL / other backbones, LSTM, GRU, MLP) from a run or checkpoint.

    Build it with :func:`rl_transformers.load`. Attributes: ``policy`` (the torch module, eval mode),
    ``config`` (the run's :class:`~rl_transformers.algos.ppo_config.TrainConfig`), ``env_id`` /
    ``env_kwargs``, ``observation_space`` / ``action_space``, ``checkpoint`` (the file loaded) and ``step``.
    """

    algo = "ppo"

    def __init__(
        self,
        policy: ActorCritic,
        config: TrainConfig,
        device: torch.device | str = "cpu",
        checkpoint: Path | None = None,
        step: int | None = None,
        update: int | None = None,
    ) -> None:
        self.policy = policy.eval()
        self.config = config
        self.device = torch.device(device)
        self.checkpoint = checkpoint
        self.step = step
        self.update = update
        self.observation_space = policy.observation_space
        self.action_space = policy.action_space
        self.seq_len = config.ppo.seq_len

    @property
    def env_id(self) -> str:
        return self.config.env_id

    @property
    def env_kwargs(self) -> dict[str, Any]:
        return dict(self.config.env_kwargs)

    def make_env(self, **kwargs: Any) -> gym.Env:
        """The run's environment (``rlt/`` ids included), built through the safe resolver."""
        from rl_transformers.algos.env_util import make_env_thunk

        return make_env_thunk(
            self.env_id, {**self.env_kwargs, **kwargs}, allow_env_modules=self.config.allow_env_modules
        )()

    def initial_state(self, n_envs: int = 1) -> PolicyState:
        return PolicyState(self.policy.initial_state(n_envs, self.device), 0, n_envs)

    def predict(
        self,
        observation: Any,
        state: PolicyState | None = None,
        episode_start: np.ndarray | None = None,
        deterministic: bool = False,
    ) -> tuple[np.ndarray, PolicyState]:
        """Actions for ``observation`` (one or a batch) and the state to pass to the next call (see module)."""
        space = self.observation_space
        n = batch_size(observation, space)
        batched = n is not None
        if not batched:
            observation, n = _add_batch_dim(observation, space), 1
        assert n is not None
        if state is None:
            state = self.initial_state(n)
            starts = np.ones(n, dtype=bool)  # a fresh state begins every env's episode
        else:
            if not isinstance(state, PolicyState):
                raise UserError(
                    f"state must be None or what the previous predict() returned, got {type(state).__name__}"
                )
            if state.n_envs != n:
                raise UserError(f"state holds {state.n_envs} envs but the observation batch has {n}")
            starts = (
                np.zeros(n, dtype=bool)
                if episode_start is None
                else np.asarray(episode_start, dtype=bool).reshape(n)
            )
        obs = obs_to_tensor(observation, space, self.device)
        with torch.inference_mode():
            core = state.core
            if state.n_steps % self.seq_len == 0:  # as the trainer's evaluation: trims context cores
                core = self.policy.segment_start(core)
            start_t = torch.as_tensor(starts, device=self.device)
            out = self.policy.act(obs, core, start_t, deterministic=deterministic)
        action = self.policy.to_env(out.action)
        if not batched:
            action = action[0]
        return action, PolicyState(out.state, state.n_steps + 1, n)

    def evaluate(
        self,
        n_episodes: int,
        seed: int,
        deterministic: bool = True,
        num_envs: int | None = None,
        video_dir: str | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Returns and lengths of ``n_episodes`` episodes with the trainer's evaluation loop."""
        from rl_transformers.algos.evaluation import evaluate_policy

        return evaluate_policy(
            self.policy,
            self.env_id,
            self.env_kwargs,
            n_episodes,
            seed=seed,
            seq_len=self.seq_len,
            deterministic=deterministic,
            device=self.device,
            num_envs=num_envs,
            video_dir=video_dir,
            allow_env_modules=self.config.allow_env_modules,
        )

    def trainer_eval_seed(self) -> int:
        """The seed the trainer's evaluation used for this checkpoint (its logged ``eval/mean_reward``)."""
        return self.config.seed + 100_003 + int(self.update or 0)

    def __repr__(self) -> str:
        return f"PPOAgent(env_id={self.env_id!r}, policy={self.config.policy.kind!r}, step={self.step})"
