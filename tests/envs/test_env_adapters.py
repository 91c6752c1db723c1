"""POPGym and MiniGrid Memory adapters (skipped without the extras) and their missing-extra errors."""

from __future__ import annotations

import sys

import gymnasium as gym
import numpy as np
import pytest

import envs
from envs.minigrid_adapter import make_minigrid_memory
from envs.popgym_adapter import make_popgym

# ---------------------------------------------------------------- missing extras


@pytest.mark.parametrize(
    ("modules", "build", "extra"),
    [
        (("popgym", "popgym.envs"), lambda: gym.make("rlt/popgym-RepeatPreviousEasy-v0"), "popgym"),
        (
            ("minigrid", "minigrid.envs", "minigrid.envs.memory"),
            lambda: gym.make("rlt/MiniGridMemory-v0"),
            "minigrid",
        ),
    ],
)
def test_missing_extra_names_the_pip_command(monkeypatch, modules, build, extra: str) -> None:
    for name in modules:  # a None entry in sys.modules makes `import name` fail, installed or not
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError, match=rf"pip install rl-transformers\[{extra}\]"):
        build()


# ---------------------------------------------------------------- POPGym


def test_popgym_observation_is_one_hot_of_the_original() -> None:
    popgym_envs = pytest.importorskip("popgym.envs")
    env = make_popgym("RepeatPreviousEasy")
    raw = popgym_envs.RepeatPreviousEasy()
    assert env.observation_space == gym.spaces.Box(0.0, 1.0, (4,), np.float32)
    obs, _ = env.reset(seed=5)
    raw_obs, _ = raw.reset(seed=5)
    for _ in range(20):
        np.testing.assert_array_equal(obs, np.eye(4, dtype=np.float32)[raw_obs])
        obs, r, *_ = env.step(1)
        raw_obs, raw_r, *_ = raw.step(1)
        assert r == raw_r
    tup = make_popgym("popgym-AutoencodeEasy-v0")  # Tuple(Discrete(2), Discrete(4)) -> 6 floats
    assert tup.observation_space.shape == (6,)


def test_popgym_oracle_reaches_documented_optimum() -> None:
    pytest.importorskip("popgym")
    env = gym.make("rlt/popgym-RepeatPreviousEasy-v0")
    k = env.unwrapped.k
    for seed in range(3):
        obs, _ = env.reset(seed=seed)
        seen, total, done = [], 0.0, False
        while not done:
            seen.append(int(np.argmax(obs)))
            # POPGym's k counts the current card: the target is the card dealt k-1 steps before this one.
            action = seen[-k] if len(seen) >= k else 0
            obs, r, term, trunc, _ = env.step(action)
            total += r
            done = term or trunc
        assert total == pytest.approx(envs.MEMORY_TASKS["rlt/popgym-RepeatPreviousEasy-v0"].optimal_score)


def test_popgym_bad_name_suggests() -> None:
    pytest.importorskip("popgym")
    with pytest.raises(ValueError, match="RepeatPreviousEasy"):
        make_popgym("RepeatPreviusEasy")


# ---------------------------------------------------------------- MiniGrid Memory


def test_minigrid_spaces() -> None:
    pytest.importorskip("minigrid")
    env = gym.make("rlt/MiniGridMemory-v0")
    assert set(env.observation_space.spaces) == {"image", "direction"}
    assert env.observation_space["image"].shape == (7, 7, 3)
    assert env.action_space == gym.spaces.Discrete(3)
    flat = gym.make("rlt/MiniGridMemory-v0", flatten=True, reduced_actions=False)
    assert flat.observation_space.shape == (151,) and flat.action_space == gym.spaces.Discrete(7)
    obs, _ = env.reset(seed=0)
    flat_obs, _ = flat.reset(seed=0)
    np.testing.assert_array_equal(flat_obs[4:], obs["image"].ravel().astype(np.float32))  # sorted keys
    assert flat_obs[obs["direction"]] == 1.0 and flat_obs[:4].sum() == 1.0
    with pytest.raises(ValueError, match="odd"):
        make_minigrid_memory(size=8)


LEFT, RIGHT, FORWARD = 0, 1, 2


def _minigrid_plan(env: gym.Env, correct: bool) -> list[int]:
    """Shortest plan that looks at the cue first: [turn to look, turn back] unless it starts beside it."""
    u = env.unwrapped
    x0 = int(u.agent_pos[0])
    target = u.success_pos if correct else u.failure_pos
    plan = [] if x0 == 1 else [LEFT, RIGHT]  # facing north from x0 <= 4 shows the cue at (1, 2)
    plan += [FORWARD] * (target[0] - x0)  # east along the hallway to the split column
    plan += [LEFT if target[1] < u.agent_pos[1] else RIGHT, FORWARD]
    return plan


def test_minigrid_optimal_and_wrong_object() -> None:
    pytest.importorskip("minigrid")
    env = gym.make("rlt/MiniGridMemory-v0")
    returns: dict[int, float] = {}
    for seed in range(60):
        env.reset(seed=seed)
        x0 = int(env.unwrapped.agent_pos[0])
        if x0 == 1:
            assert env.unwrapped.agent_sees(1, 2)
        plan = _minigrid_plan(env, correct=True)
        for i, a in enumerate(plan):
            if i == 0 and x0 != 1:
                env.step(a)
                assert env.unwrapped.agent_sees(1, 2)  # the look-around really shows the cue
                continue
            _, r, term, _, info = env.step(a)
        assert term and info["success"] is True
        assert r == pytest.approx(1 - 0.9 * len(plan) / 245)
        returns[x0] = r
    assert sorted(returns) == [1, 2, 3, 4]  # start column uniform in 1..4
    mean_optimal = float(np.mean(list(returns.values())))
    assert mean_optimal == pytest.approx(envs.MEMORY_TASKS["rlt/MiniGridMemory-v0"].optimal_score, abs=5e-4)
    env.reset(seed=0)
    for a in _minigrid_plan(env, correct=False):
        _, r, term, _, info = env.step(a)
    assert term and r == 0.0 and info["success"] is False
