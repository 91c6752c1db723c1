"""Rollout storage on a scripted env whose observations encode (env index, step in episode, episode id).

Checks that sequences, stored memory windows, episode starts / resets, truncation bootstraps and minibatches
are exactly what the scripted episode schedule says they should be.
"""

from __future__ import annotations

from typing import cast

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from rl_transformers.algos.rollout import collect_rollout, observe, reset_loop
from rl_transformers.algos.storage import RolloutStorage, compute_gae
from rl_transformers.backbone import BackboneConfig
from rl_transformers.policies import GTrXLPolicy
from rl_transformers.policies.encoders import RunningNorm

N_ENVS, N_STEPS, SEQ_LEN, MEM_LEN = 3, 24, 8, 5


def episode_length(env: int, episode: int) -> int:
    return 2 + (3 * env + 5 * episode) % 7


def episode_terminates(episode: int) -> bool:
    return episode % 2 == 0  # odd episodes are truncated (time limit)


class ScriptedEnv(gym.Env[np.ndarray, np.int64]):
    """obs = [env index, step in episode, episode id]; fixed episode lengths; reward = step + 1."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.observation_space = spaces.Box(-1e6, 1e6, (3,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.episode = -1
        self.t = 0

    def _obs(self) -> np.ndarray:
        return np.array([self.index, self.t, self.episode], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.episode += 1
        self.t = 0
        return self._obs(), {}

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict]:
        reward = float(self.t + 1)
        self.t += 1
        end = self.t == episode_length(self.index, self.episode)
        terminated = end and episode_terminates(self.episode)
        return self._obs(), reward, terminated, end and not terminated, {}


def expected_stream(env: int, n_steps: int) -> list[tuple[int, int]]:
    """(step in episode, episode id) of the observations the policy acts on, in order."""
    out, episode = [], 0
    while len(out) < n_steps:
        out += [(t, episode) for t in range(episode_length(env, episode))]
        episode += 1
    return out[:n_steps]


@pytest.fixture
def setup() -> tuple[gym.vector.VectorEnv, GTrXLPolicy]:
    torch.manual_seed(0)
    envs = gym.vector.SyncVectorEnv(
        [lambda i=i: ScriptedEnv(i) for i in range(N_ENVS)], autoreset_mode=AutoresetMode.SAME_STEP
    )
    cfg = BackboneConfig(
        d_model=8,
        n_layers=1,
        n_heads=2,
        position="rope",
        memory="xl",
        memory_options={"mem_len": MEM_LEN},
        block="gtrxl",
    )
    policy = GTrXLPolicy(envs.single_observation_space, envs.single_action_space, cfg)
    return envs, policy


def make_storage(envs: gym.vector.VectorEnv, policy: GTrXLPolicy) -> RolloutStorage:
    return RolloutStorage(
        N_STEPS,
        N_ENVS,
        SEQ_LEN,
        envs.single_observation_space,
        policy.actor.action_shape,
        policy.actor.action_dtype,
    )


def test_sequences_starts_and_memory_windows(setup) -> None:
    envs, policy = setup
    storage = make_storage(envs, policy)
    loop = reset_loop(envs, policy, seed=0, device="cpu")
    for rollout in range(2):  # the second rollout continues the first one's episodes and memory
        loop, episodes = collect_rollout(policy, envs, storage, loop, gamma=0.9, gae_lambda=0.8)
        for e in range(N_ENVS):
            stream = expected_stream(e, 2 * N_STEPS)[rollout * N_STEPS : (rollout + 1) * N_STEPS]
            steps = torch.tensor([s for s, _ in stream], dtype=torch.float32)
            eps = torch.tensor([k for _, k in stream], dtype=torch.float32)
            torch.testing.assert_close(storage.obs[:, e, 0], torch.full((N_STEPS,), float(e)))
            torch.testing.assert_close(storage.obs[:, e, 1], steps)
            torch.testing.assert_close(storage.obs[:, e, 2], eps)
            assert torch.equal(storage.episode_starts[:, e], steps == 0)
            # an episode ends at t when the next observation starts a new one
            nxt = expected_stream(e, 2 * N_STEPS + 1)[rollout * N_STEPS + 1 : (rollout + 1) * N_STEPS + 1]
            ends = torch.tensor([s == 0 for s, _ in nxt])
            term = torch.tensor([s == 0 and episode_terminates(k - 1) for s, k in nxt])
            assert torch.equal(storage.terminated[:, e], term)
            assert torch.equal(storage.truncated[:, e], ends & ~term)
            # stored XL memory at each sequence start, after the start's reset flag (which the training pass
            # applies, as acting did): the last min(M, s) steps of the current episode
            for g in range(N_STEPS // SEQ_LEN):
                s = int(steps[g * SEQ_LEN])
                stored = storage.states[g].reset(storage.episode_starts[g * SEQ_LEN])
                mem = stored.memory
                valid, pos = mem.valid[e], mem.pos[e]
                k = min(MEM_LEN, s)
                assert int(valid.sum()) == k
                if k:
                    assert bool(valid[-k:].all())
                    assert pos[-k:].tolist() == list(range(s - k, s))
                assert int(stored.pos[e]) == s  # backbone position counter = steps since reset
        # truncation bootstraps are exactly where truncated (and only there)
        assert torch.equal(storage.final_values != 0, storage.truncated & ~storage.terminated)
        # the finished episodes reported: one per episode end in this rollout, with its scripted length
        ended = []
        for e in range(N_ENVS):
            nxt = expected_stream(e, 2 * N_STEPS + 1)[rollout * N_STEPS + 1 : (rollout + 1) * N_STEPS + 1]
            ended += [episode_length(e, k - 1) for s, k in nxt if s == 0]
        assert sorted(n for _, n in episodes) == sorted(ended) and ended


def test_final_values_and_gae_replayed_step_by_step(setup) -> None:
    envs, policy = setup
    storage = make_storage(envs, policy)
    loop0 = reset_loop(envs, policy, seed=0, device="cpu")
    loop, _ = collect_rollout(policy, envs, storage, loop0, gamma=0.9, gae_lambda=0.8)
    # Independent replay: act on the stored observations from an empty state and recompute V(final obs)
    # where the scripted schedule truncates (final obs = [env, L, episode]).
    state = policy.initial_state(N_ENVS)
    expected_final = torch.zeros(N_STEPS, N_ENVS)
    with torch.no_grad():
        for t in range(N_STEPS):
            out = policy.act(storage.obs[t], state, storage.episode_starts[t])
            torch.testing.assert_close(out.value, storage.values[t])
            for e in torch.nonzero(storage.truncated[t]).flatten().tolist():
                final = storage.obs[t, e].clone()
                final[1] += 1
                expected_final[t, e] = policy.value(final[None], out.state.index_select(torch.tensor([e])))[0]
            # the rollout acted with the sampled actions we stored: continue from the same state
            state = out.state
        last_value = policy.value(loop.obs, state, loop.episode_start)
    torch.testing.assert_close(storage.final_values, expected_final)
    adv, ret = compute_gae(
        storage.rewards,
        storage.values,
        storage.terminated,
        storage.truncated,
        expected_final,
        last_value,
        0.9,
        0.8,
    )
    torch.testing.assert_close(storage.advantages, adv)
    torch.testing.assert_close(storage.returns, ret)


def test_minibatches_cover_sequences_with_their_states(setup) -> None:
    envs, policy = setup
    storage = make_storage(envs, policy)
    loop = reset_loop(envs, policy, seed=0, device="cpu")
    loop, _ = collect_rollout(policy, envs, storage, loop, gamma=0.9, gae_lambda=0.8)
    seqs = storage.sequences()
    seen = []
    n_groups = []
    for mb in storage.minibatches(3, torch.Generator().manual_seed(1)):
        n_groups.append(len(mb.state_groups))
        for rows, state in mb.state_groups:
            for j, r in enumerate(rows.tolist()):
                obs = mb.obs[r]
                e, first_step = int(obs[0, 0]), obs[:, 1]
                # find the sequence id from the observations: env e, grid g where the stored obs match
                matches = [
                    g for g in range(N_STEPS // SEQ_LEN) if torch.equal(seqs["obs"][g * N_ENVS + e], obs)
                ]
                assert len(matches) == 1
                g = matches[0]
                seen.append(g * N_ENVS + e)
                ref = storage.states[g].index_select(torch.tensor([e]))
                assert torch.equal(state.memory.pos[j], ref.memory.pos[0])
                assert torch.equal(state.memory.h[j], ref.memory.h[0])
                assert torch.equal(mb.episode_starts[r], first_step == 0)
    assert sorted(seen) == list(range(storage.num_sequences))
    # XL memory has a fixed width (empty columns masked), so every stored state has one shape: one group per
    # minibatch. States of different shapes (a growing KV cache) are grouped: test_truncation_bootstrap.py.
    assert n_groups == [1, 1, 1]


def test_storage_validates_shapes() -> None:
    with pytest.raises(ValueError, match="multiple of seq_len"):
        RolloutStorage(10, 2, 4, spaces.Box(-1, 1, (2,)), (), torch.long)
    storage = RolloutStorage(8, 2, 4, spaces.Box(-1, 1, (2,)), (), torch.long)
    with pytest.raises(ValueError, match="multiples of seq_len"):
        storage.store_state(3, None)
    with pytest.raises(ValueError, match="num_minibatches"):
        next(storage.minibatches(5))


class DictEnv(gym.Env):
    """Dict observations {"x": Box(2), "k": Discrete(3)}; episodes of 3 steps, every other one truncated."""

    def __init__(self) -> None:
        self.observation_space = spaces.Dict(
            {"x": spaces.Box(-1, 1, (2,), np.float32), "k": spaces.Discrete(3)}
        )
        self.action_space = spaces.Box(-1, 1, (1,), np.float32)
        self.t, self.episode = 0, 0

    def _obs(self) -> dict:
        return {"x": np.array([self.t, self.episode], np.float32) / 10, "k": self.t % 3}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        self.t, self.episode = 0, self.episode + 1
        return self._obs(), {}

    def step(self, action: np.ndarray) -> tuple[dict, float, bool, bool, dict]:
        assert self.action_space.contains(action)  # Box actions reach the env clipped to the bounds
        self.t += 1
        end = self.t == 3
        return self._obs(), float(action[0]), end and self.episode % 2 == 0, end and self.episode % 2 == 1, {}


def test_dict_observations_and_box_actions() -> None:
    torch.manual_seed(0)
    envs = gym.vector.SyncVectorEnv([DictEnv, DictEnv], autoreset_mode=AutoresetMode.SAME_STEP)
    cfg = BackboneConfig(
        d_model=8, n_layers=1, n_heads=2, memory="xl", memory_options={"mem_len": 4}, block="gtrxl"
    )
    policy = GTrXLPolicy(envs.single_observation_space, envs.single_action_space, cfg, log_std_init=1.0)
    storage = RolloutStorage(8, 2, 4, envs.single_observation_space, (1,), torch.float32)
    _, episodes = collect_rollout(policy, envs, storage, reset_loop(envs, policy, 0, "cpu"), 0.9, 0.9)
    assert set(storage.obs) == {"k", "x"} and storage.obs["k"].dtype == torch.long
    assert storage.truncated.any() and (storage.final_values != 0).sum() == storage.truncated.sum()
    assert storage.actions.abs().max() > 1  # stored actions are the unclipped samples
    assert len(episodes) == 4 and all(n == 3 for _, n in episodes)
    for mb in storage.minibatches(2):
        for rows, state in mb.state_groups:
            sel = mb.select(rows)
            out = policy.evaluate_sequence(sel["obs"], sel["actions"], state, sel["episode_starts"])
            torch.testing.assert_close(out.log_prob, mb.log_probs[rows], atol=1e-5, rtol=1e-5)


def _sb3_normalised_obs(actions: np.ndarray, seed: int, gamma: float) -> np.ndarray:
    """The observations stable_baselines3's VecNormalize hands the learner (reset, then each step) when
    CartPole-v1 copies take the scripted ``actions`` (T, N)."""
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    n = actions.shape[1]
    venv = VecNormalize(DummyVecEnv([lambda: gym.make("CartPole-v1")] * n), norm_reward=False, gamma=gamma)
    venv.seed(seed)
    out = [venv.reset()]
    for a in actions:
        obs, _, _, _ = venv.step(a)
        out.append(obs)
    return np.array(out[:-1])


def test_per_step_observation_normalisation_equals_sb3_vecnormalize() -> None:
    """norm_obs_update "step": every observation joins the statistics on arrival and the storage keeps what the
    policy acted on, normalised then: SB3's VecNormalize on the same CartPole episodes."""
    torch.manual_seed(0)
    n_envs, n_steps = 3, 40
    envs = gym.vector.SyncVectorEnv(
        [lambda: gym.make("CartPole-v1")] * n_envs, autoreset_mode=AutoresetMode.SAME_STEP
    )
    space = envs.single_observation_space
    policy = GTrXLPolicy(space, envs.single_action_space, BackboneConfig(d_model=8, n_layers=1, n_heads=2))
    policy.enable_obs_norm()
    cast(RunningNorm, policy.obs_norm).start_like_vecnormalize()
    storage = RolloutStorage(n_steps, n_envs, 8, space, policy.actor.action_shape, policy.actor.action_dtype)
    stored, actions = [], []
    with policy.inputs_normalised() as norm:
        assert norm is not None and policy.obs_norm is None
        loop = reset_loop(envs, policy, seed=5, device="cpu")
        observe(norm, loop.obs)
        for _ in range(2):  # across rollouts: the carried observation is not counted twice
            loop, _ = collect_rollout(policy, envs, storage, loop, 0.98, 0.8, obs_norm=norm)
            stored.append(storage.obs.clone())
            actions.append(storage.actions.clone())
    assert policy.obs_norm is norm  # back for evaluation and checkpoints
    assert float(norm.count) == pytest.approx(n_envs * (2 * n_steps + 1) + 1e-4)
    expected = _sb3_normalised_obs(torch.cat(actions).numpy().astype(np.int64), seed=5, gamma=0.98)
    got = torch.cat(stored).numpy()
    assert np.abs(got).max() > 1.5  # normalised, not raw CartPole observations
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
