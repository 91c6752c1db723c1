"""Passive T-Maze: cue only at t = 0, optimal/wrong/idle scripted policies, horizon, exact random score."""

from __future__ import annotations

import itertools

import gymnasium as gym
import numpy as np
import pytest

import envs
from envs.tmaze import EAST, NORTH, SOUTH, WEST, TMazeEnv, random_policy_return


def run(env: gym.Env, actions, goal: int | None = None, seed: int = 0):
    """Play a fixed action list; return (observations, rewards, terminated flags, last info)."""
    options = None if goal is None else {"goal": goal}
    obs, _ = env.reset(seed=seed, options=options)
    observations, rewards, terms = [obs], [], []
    info: dict = {}
    for a in actions:
        obs, r, term, trunc, info = env.step(a)
        assert not trunc
        observations.append(obs)
        rewards.append(r)
        terms.append(term)
    return np.stack(observations), np.array(rewards), terms, info


def oracle_episode(env: TMazeEnv, seed: int) -> tuple[float, dict, int]:
    """Remember the cue from the first observation, walk east, turn to the cued side."""
    obs, _ = env.reset(seed=seed)
    cue = obs[0]
    total, done, steps, info = 0.0, False, 0, {}
    while not done:
        at_junction = obs[1] == 1.0
        action = (NORTH if cue > 0 else SOUTH) if at_junction else EAST
        obs, r, term, trunc, info = env.step(action)
        total += r
        steps += 1
        done = term or trunc
    return total, info, steps


@pytest.mark.parametrize("length", [1, 2, 7, 30])
def test_cue_visible_only_at_first_step(length: int) -> None:
    env = TMazeEnv(corridor_length=length)
    rng = np.random.default_rng(length)
    for _ in range(20):
        actions = rng.integers(0, 4, size=length + 1).tolist()
        obs_n, rew_n, _, _ = run(env, actions, goal=1)
        obs_s, rew_s, _, _ = run(env, actions, goal=-1)
        assert obs_n[0, 0] == 1.0 and obs_s[0, 0] == -1.0
        # After t = 0 the two worlds look identical: the goal is not observable any more.
        np.testing.assert_array_equal(obs_n[1:], obs_s[1:])
        assert np.all(obs_n[1:, 0] == 0.0)
        # Rewards only differ at the last step (the choice).
        np.testing.assert_array_equal(rew_n[:-1], rew_s[:-1])


@pytest.mark.parametrize("length", [1, 5, 10, 100])
def test_optimal_policy_succeeds_with_documented_return(length: int) -> None:
    env = TMazeEnv(corridor_length=length)
    for seed in range(6):
        total, info, steps = oracle_episode(env, seed)
        assert info["success"] is True
        assert total == 1.0
        assert steps == length + 1
    for name in ("rlt/TMazeShort-v0", "rlt/TMaze-v0", "rlt/TMazeLong-v0"):
        assert envs.MEMORY_TASKS[name].optimal_score == 1.0


@pytest.mark.parametrize("goal", [1, -1])
def test_wrong_turn_fails_and_right_turn_succeeds(goal: int) -> None:
    env = TMazeEnv(corridor_length=4)
    right = NORTH if goal == 1 else SOUTH
    wrong = SOUTH if goal == 1 else NORTH
    _, rewards, terms, info = run(env, [EAST] * 4 + [wrong], goal=goal)
    assert info["success"] is False and rewards.sum() == 0.0 and terms[-1]
    _, rewards, _, info = run(env, [EAST] * 4 + [right], goal=goal)
    assert info["success"] is True and rewards.tolist() == [0, 0, 0, 0, 1.0]
    # Staying at the junction is a failure too.
    _, rewards, _, info = run(env, [EAST] * 4 + [EAST], goal=goal)
    assert info["success"] is False and rewards.sum() == 0.0


def test_lagging_penalty_follows_ni_et_al() -> None:
    env = TMazeEnv(corridor_length=4)  # penalty -1/4 per step behind schedule
    _, rewards, _, info = run(env, [WEST] * 5, goal=1)
    np.testing.assert_allclose(rewards, [-0.25, -0.25, -0.25, -0.25, 0.0])
    assert info["success"] is False
    # One wasted step at t=1: behind schedule for every later corridor step, cannot reach the junction.
    _, rewards, _, _ = run(env, [NORTH, EAST, EAST, EAST, EAST], goal=1)
    np.testing.assert_allclose(rewards, [-0.25, -0.25, -0.25, -0.25, 0.0])
    _, rewards, _, _ = run(TMazeEnv(corridor_length=4, penalty=0.0), [WEST] * 5, goal=1)
    assert rewards.sum() == 0.0


@pytest.mark.parametrize("length", [1, 3, 10, 50])
def test_corridor_length_sets_episode_length(length: int) -> None:
    env = gym.make("rlt/TMaze-v0", corridor_length=length)
    env.reset(seed=0)
    steps, done = 0, False
    while not done:
        _, _, term, trunc, info = env.step(env.action_space.sample())
        steps += 1
        done = term or trunc
    assert steps == length + 1 and term and not trunc and "success" in info
    assert env.unwrapped.horizon == length + 1
    with pytest.raises(RuntimeError, match="reset"):
        env.unwrapped.step(EAST)


def test_success_only_reported_at_episode_end() -> None:
    env = TMazeEnv(corridor_length=3)
    env.reset(seed=1)
    for _ in range(3):
        *_, info = env.step(EAST)
        assert "success" not in info


@pytest.mark.parametrize("length", [1, 2, 3, 4])
@pytest.mark.parametrize("penalty", [None, 0.0, -0.3])
def test_random_policy_return_matches_exhaustive_enumeration(length: int, penalty: float | None) -> None:
    """The closed form behind MEMORY_TASKS equals the average over every action sequence and both goals."""
    env = TMazeEnv(corridor_length=length, penalty=penalty)
    totals = []
    for goal in (1, -1):
        for actions in itertools.product(range(4), repeat=length + 1):
            _, rewards, _, _ = run(env, actions, goal=goal)
            totals.append(rewards.sum())
    assert np.mean(totals) == pytest.approx(random_policy_return(length, penalty), abs=1e-12)


def test_memoryless_policy_is_a_coin_flip() -> None:
    env = TMazeEnv(corridor_length=6)
    successes = []
    for seed in range(400):
        obs, _ = env.reset(seed=seed)
        done = False
        while not done:  # never looks at the cue: always turns north at the junction
            obs, _, done, _, info = env.step(NORTH if obs[1] == 1.0 else EAST)
        successes.append(info["success"])
    assert 0.42 < np.mean(successes) < 0.58


def test_seeded_goal_and_options() -> None:
    env = TMazeEnv()
    goals = [env.reset(seed=s)[0][0] for s in range(40)]
    assert set(goals) == {-1.0, 1.0}
    assert [env.reset(seed=s)[0][0] for s in range(40)] == goals
    assert env.reset(options={"goal": -1})[0][0] == -1.0
    with pytest.raises(ValueError, match="goal"):
        env.reset(options={"goal": 2})


@pytest.mark.parametrize(
    "kwargs", [{"corridor_length": 0}, {"corridor_length": 2.5}, {"penalty": 0.1}, {"goal_reward": 0.0}]
)
def test_invalid_arguments(kwargs: dict) -> None:
    ((name, value),) = kwargs.items()
    with pytest.raises(
        ValueError, match=rf"^{name} .*got {value}$"
    ):  # names the argument and the value given
        TMazeEnv(**kwargs)
    with pytest.raises(ValueError, match="action"):
        env = TMazeEnv()
        env.reset(seed=0)
        env.step(4)


def test_ansi_render_draws_agent() -> None:
    env = TMazeEnv(corridor_length=3, render_mode="ansi")
    env.reset(seed=0, options={"goal": 1})
    env.step(EAST)
    picture = env.render()
    lines = picture.splitlines()
    assert lines[1] == "NA.." and lines[0] == "   G" and lines[2] == "   x"


def test_recoverable_variant_charges_each_wrong_move_once() -> None:
    """AMAGO's penalty, by hand on corridor 4 (penalty -1/4): only non-east moves of the first L steps cost."""
    env = TMazeEnv(corridor_length=4, penalty_on="action")
    # optimal: east 4 times, then the cued turn: no cost, goal reward 1
    _, rewards, _, info = run(env, [EAST] * 4 + [NORTH], goal=1)
    np.testing.assert_allclose(rewards, [0, 0, 0, 0, 1.0])
    assert info["success"] is True
    # lagging then catching up: one west at t=1 costs once, the east moves after it cost nothing (Ni et al.'s
    # variant charges every later corridor step instead); the junction is then out of reach in time
    _, rewards, _, info = run(env, [WEST, EAST, EAST, EAST, NORTH], goal=1)
    np.testing.assert_allclose(rewards, [-0.25, 0, 0, 0, 0])
    _, lag_rewards, _, _ = run(TMazeEnv(corridor_length=4), [WEST, EAST, EAST, EAST, NORTH], goal=1)
    np.testing.assert_allclose(lag_rewards, [-0.25, -0.25, -0.25, -0.25, 0])
    assert info["success"] is False
    # bumping the wall at the junction turn (the last step) is never charged; a wrong turn scores 0
    _, rewards, _, info = run(env, [EAST] * 4 + [SOUTH], goal=1)
    np.testing.assert_allclose(rewards, [0, 0, 0, 0, 0])
    assert info["success"] is False


@pytest.mark.parametrize("length", [1, 2, 3, 4])
def test_recoverable_random_return_matches_exhaustive_enumeration(length: int) -> None:
    env = TMazeEnv(corridor_length=length, penalty_on="action")
    totals = []
    for goal in (1, -1):
        for actions in itertools.product(range(4), repeat=length + 1):
            _, rewards, _, _ = run(env, actions, goal=goal)
            totals.append(rewards.sum())
    expected = random_policy_return(length, penalty_on="action")
    assert np.mean(totals) == pytest.approx(expected, abs=1e-12)
    assert expected == pytest.approx(-0.75 + 0.25 ** (length + 1))


def test_recoverable_ids_and_bad_option() -> None:
    for env_id, length in (
        ("rlt/TMazeAlt-v0", 10),
        ("rlt/TMazeAltLong-v0", 100),
        ("rlt/TMazeAltVeryLong-v0", 400),
    ):
        env = gym.make(env_id).unwrapped
        assert (env.corridor_length, env.penalty_on) == (length, "action")
        assert envs.MEMORY_TASKS[env_id].random_score == pytest.approx(-0.75 + 0.25 ** (length + 1))
    with pytest.raises(ValueError, match="penalty_on must be 'lag' or 'action'"):
        TMazeEnv(penalty_on="lagging")
