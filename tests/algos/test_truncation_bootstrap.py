"""Truncation bootstraps batched after the rollout == evaluated at their step (the reference path).

``collect_rollout`` keeps the final observation and the pre-reset state rows of every time-limit truncation and
evaluates them all after the last step (one forward per state shape). The reference is the per-step call
(``_per_step_bootstrap=True``): one forward per step with a truncation, as the rollout did before. Envs with
short, unequal time limits truncate at most steps, in groups of varying size, and the policy states change
shape during the rollout (a KV cache filling up, the context window of a non-streaming attention), so
several groups of unequal states are formed. Every buffer must match: the actions, states and values acted on
exactly, the bootstraps / advantages / returns exactly in float64 and to 1e-6 in float32.
"""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
import pytest
import torch
from gymnasium.vector import AutoresetMode

from rl_transformers.algos.env_util import register_rlt_envs
from rl_transformers.algos.rollout import collect_rollout, reset_loop
from rl_transformers.algos.storage import RolloutStorage
from rl_transformers.backbone import BackboneConfig
from rl_transformers.policies.actor_critic import ActorCritic
from rl_transformers.policies.gtrxl import PolicyConfig, make_policy

N_ENVS, N_STEPS, SEQ_LEN = 4, 24, 6
TIME_LIMITS = (2, 3, 4, 5)  # unequal: truncations at most steps, 1 to 4 envs at a time


def make_envs() -> gym.vector.VectorEnv:
    register_rlt_envs()
    return gym.vector.SyncVectorEnv(
        [
            lambda k=k: gym.make("rlt/RepeatPrevious-v0", max_episode_steps=k)  # type: ignore[misc]
            for k in TIME_LIMITS
        ],
        autoreset_mode=AutoresetMode.SAME_STEP,
    )


def _xl(**kw: object) -> PolicyConfig:
    cfg = BackboneConfig(
        d_model=16, n_layers=2, n_heads=2, memory="xl", memory_options={"mem_len": 7}, block="gtrxl", **kw
    )
    return PolicyConfig(backbone=cfg, context_len=7)


POLICIES: dict[str, Callable[[], PolicyConfig]] = {
    "gtrxl-xl": _xl,
    "gtrxl-kv-cache": lambda: PolicyConfig(
        backbone=BackboneConfig(d_model=16, n_layers=2, n_heads=2, position="rope", block="gtrxl"),
        context_len=5,
    ),
    "context-core": lambda: PolicyConfig(
        backbone=BackboneConfig(
            d_model=16,
            n_layers=1,
            n_heads=2,
            attention="linformer",
            causal=False,
            position="none",
            block="pre_ln",
        ),
        context_len=4,
    ),
    "lstm": lambda: PolicyConfig(kind="lstm", hidden_size=16),
    "mlp": lambda: PolicyConfig(kind="mlp", hidden_size=16),
}


def run(policy: ActorCritic, dtype: torch.dtype, per_step: bool, n_rollouts: int = 2) -> list[dict]:
    """Storage contents after each of ``n_rollouts`` consecutive rollouts (same seeds on both paths)."""
    envs = make_envs()
    storage = RolloutStorage(
        N_STEPS,
        N_ENVS,
        SEQ_LEN,
        envs.single_observation_space,
        policy.actor.action_shape,
        policy.actor.action_dtype,
    )
    torch.manual_seed(123)
    loop = reset_loop(envs, policy, seed=7, device="cpu")
    out = []
    for _ in range(n_rollouts):
        loop, episodes = collect_rollout(
            policy, envs, storage, loop, gamma=0.95, gae_lambda=0.9, _per_step_bootstrap=per_step
        )
        out.append(
            {
                "obs": storage.obs.clone(),
                "actions": storage.actions.clone(),
                "log_probs": storage.log_probs.clone(),
                "values": storage.values.clone(),
                "rewards": storage.rewards.clone(),
                "terminated": storage.terminated.clone(),
                "truncated": storage.truncated.clone(),
                "episode_starts": storage.episode_starts.clone(),
                "final_values": storage.final_values.clone(),
                "advantages": storage.advantages.clone(),
                "returns": storage.returns.clone(),
                "states": [s.map(torch.clone) for s in storage.states],
                "episodes": episodes,
                "ep_return": loop.ep_return.copy(),
            }
        )
    envs.close()
    return out


def _leaves(state: object) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    state.map(lambda t: out.append(t) or t)  # type: ignore[attr-defined]
    return out


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", list(POLICIES))
def test_batched_bootstrap_equals_per_step(name: str, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    envs = make_envs()
    policy = make_policy(POLICIES[name](), envs.single_observation_space, envs.single_action_space).to(dtype)
    envs.close()
    ref = run(policy, dtype, per_step=True)
    new = run(policy, dtype, per_step=False)
    for r, (a, b) in enumerate(zip(ref, new)):
        boot = a["truncated"] & ~a["terminated"]
        assert int(boot.sum()) >= N_STEPS // 2, "the test needs frequent truncations"
        assert int(boot.any(1).sum()) >= N_STEPS // 2
        assert (a["final_values"][boot] != 0).all() and (a["final_values"][~boot] == 0).all()
        for key in ("obs", "actions", "log_probs", "values", "rewards", "terminated", "truncated"):
            assert torch.equal(a[key], b[key]), (name, r, key)
        assert torch.equal(a["episode_starts"], b["episode_starts"])
        assert a["episodes"] == b["episodes"] and (a["ep_return"] == b["ep_return"]).all()
        for sa, sb in zip(a["states"], b["states"]):
            assert len(_leaves(sa)) == len(_leaves(sb))
            assert all(torch.equal(x, y) for x, y in zip(_leaves(sa), _leaves(sb)))
        for key in ("final_values", "advantages", "returns"):
            if dtype == torch.float64:
                assert torch.equal(a[key], b[key]), (name, r, key, (a[key] - b[key]).abs().max())
            else:
                torch.testing.assert_close(b[key], a[key], rtol=1e-6, atol=1e-6)


def test_bootstrap_groups_states_of_unequal_shape() -> None:
    """A KV cache grows during the first steps (XL memory no longer does: it has a fixed width): the pending
    rows form several shape groups, all evaluated."""
    from rl_transformers.algos import rollout

    calls: list[int] = []
    torch.manual_seed(0)
    envs = make_envs()
    policy = make_policy(
        POLICIES["gtrxl-kv-cache"](), envs.single_observation_space, envs.single_action_space
    )
    envs.close()
    value = policy.value

    def counting(obs, state, episode_start=None):  # type: ignore[no-untyped-def]
        calls.append(state.batch_size)
        return value(obs, state, episode_start)

    policy.value = counting  # type: ignore[method-assign]
    run(policy, torch.float32, per_step=False, n_rollouts=1)
    ref_calls = list(calls)
    calls.clear()
    ref = run(policy, torch.float32, per_step=True, n_rollouts=1)[0]
    n_boot = int((ref["truncated"] & ~ref["terminated"]).sum())
    n_steps_with_boot = int((ref["truncated"] & ~ref["terminated"]).any(1).sum())
    assert len(calls) == n_steps_with_boot + 1  # reference: one call per step with a truncation + last value
    assert 2 <= len(ref_calls) - 1 < n_steps_with_boot  # batched: one call per state shape + last value
    assert sum(ref_calls[:-1]) == n_boot and ref_calls[-1] == N_ENVS
    assert rollout._rows_key(policy.initial_state(2)) == rollout._rows_key(policy.initial_state(5))


def _gae_step_by_step(rewards, values, terminated, truncated, final_values, last_value, gamma, lam):  # type: ignore[no-untyped-def]
    """The former per-step form of ``compute_gae`` (every operation inside the loop)."""
    n_steps = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    gae = torch.zeros_like(last_value)
    for t in reversed(range(n_steps)):
        next_value = last_value if t == n_steps - 1 else values[t + 1]
        next_value = torch.where(truncated[t], final_values[t], next_value)
        next_value = torch.where(terminated[t], torch.zeros_like(next_value), next_value)
        delta = rewards[t] + gamma * next_value - values[t]
        not_done = (~(terminated[t] | truncated[t])).to(rewards.dtype)
        gae = delta + gamma * lam * not_done * gae
        advantages[t] = gae
    return advantages, advantages + values


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_vectorised_gae_is_bit_identical_to_step_by_step(dtype: torch.dtype) -> None:
    from rl_transformers.algos.storage import compute_gae

    g = torch.Generator().manual_seed(3)
    t_len, n = 37, 11
    rewards, values, final_values = (torch.randn(t_len, n, generator=g, dtype=dtype) for _ in range(3))
    last_value = torch.randn(n, generator=g, dtype=dtype)
    terminated = torch.rand(t_len, n, generator=g) < 0.15
    truncated = torch.rand(t_len, n, generator=g) < 0.15  # some steps both: termination wins
    for gamma, lam in ((0.99, 0.95), (0.9, 1.0), (0.37, 0.0)):
        got = compute_gae(rewards, values, terminated, truncated, final_values, last_value, gamma, lam)
        ref = _gae_step_by_step(rewards, values, terminated, truncated, final_values, last_value, gamma, lam)
        assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
