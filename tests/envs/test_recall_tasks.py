"""RepeatPrevious (Discrete / MultiDiscrete), CountRecall and ContinuousRecall: oracles, memoryless, chance."""

from __future__ import annotations

from collections import deque

import gymnasium as gym
import numpy as np
import pytest

import envs
from envs.continuous_recall import ContinuousRecallEnv
from envs.count_recall import CountRecallEnv
from envs.repeat_previous import MultiRepeatPreviousEnv, RepeatPreviousEnv


def play(env: gym.Env, policy, seed: int) -> tuple[float, list[float]]:
    """Run one episode of ``policy(obs, history) -> action``; history holds past observations."""
    obs, _ = env.reset(seed=seed)
    history: list[np.ndarray] = []
    rewards, done = [], False
    while not done:
        history.append(obs)
        obs, r, term, trunc, _ = env.step(policy(obs, history))
        rewards.append(r)
        done = term or trunc
    return float(sum(rewards)), rewards


# ---------------------------------------------------------------- RepeatPrevious


@pytest.mark.parametrize("delay", [0, 1, 4, 31])
def test_repeat_previous_oracle_gets_maximum(delay: int) -> None:
    env = RepeatPreviousEnv(n_symbols=4, delay=delay, episode_length=32)

    def oracle(obs, history):  # remembers the symbol stream and reads it `delay` steps back
        return int(np.argmax(history[-1 - delay])) if len(history) > delay else 0

    for seed in range(5):
        total, rewards = play(env, oracle, seed)
        assert total == pytest.approx(1.0)
        assert len(rewards) == 32
        assert all(r == 0.0 for r in rewards[:delay])
        assert all(r == pytest.approx(1 / (32 - delay)) for r in rewards[delay:])


def test_repeat_previous_memoryless_guesser_is_at_chance() -> None:
    env = gym.make("rlt/RepeatPrevious-v0")
    totals = [play(env, lambda obs, h: int(np.argmax(obs)), seed)[0] for seed in range(150)]
    assert abs(np.mean(totals) - 0.25) < 0.03  # std of the mean ~0.0064
    wrong = [
        play(env, lambda obs, h: (int(np.argmax(h[-5])) + 1) % 4 if len(h) > 4 else 0, s)[0] for s in range(3)
    ]
    assert wrong == [0.0, 0.0, 0.0]


def test_repeat_previous_observation_is_one_hot_then_zeros() -> None:
    env = RepeatPreviousEnv(n_symbols=5, delay=1, episode_length=3)
    obs, _ = env.reset(seed=0)
    for _ in range(3):
        assert obs.sum() == 1.0 and set(np.unique(obs)) <= {0.0, 1.0}
        obs, _, term, _, _ = env.step(0)
    assert term and obs.sum() == 0.0 and env.observation_space.contains(obs)


def test_multi_repeat_previous_heads_score_independently() -> None:
    env = gym.make("rlt/RepeatPreviousMulti-v0")
    assert env.action_space == gym.spaces.MultiDiscrete([4, 4])
    delays = env.unwrapped.delays
    assert delays == (1, 4)

    def answers(history, correct: tuple[bool, bool]):
        out = []
        for d, ok in zip(delays, correct):
            true = int(np.argmax(history[-1 - d])) if len(history) > d else 0
            out.append(true if ok else (true + 1) % 4)
        return np.array(out)

    assert play(env, lambda o, h: answers(h, (True, True)), 0)[0] == pytest.approx(1.0)
    assert play(env, lambda o, h: answers(h, (True, False)), 0)[0] == pytest.approx(0.5)
    assert play(env, lambda o, h: answers(h, (False, True)), 0)[0] == pytest.approx(0.5)
    assert play(env, lambda o, h: answers(h, (False, False)), 0)[0] == 0.0


@pytest.mark.parametrize(
    "kwargs", [{"delay": 32}, {"delay": -1}, {"n_symbols": 1}, {"episode_length": 0}, {"delay": 1.5}]
)
def test_repeat_previous_invalid_arguments(kwargs: dict) -> None:
    ((name, value),) = kwargs.items()
    with pytest.raises(ValueError, match=rf"^{name} .*{value}"):  # names the argument and the value given
        RepeatPreviousEnv(**kwargs)


def test_repeat_previous_rejects_bad_actions() -> None:
    env = MultiRepeatPreviousEnv()
    env.reset(seed=0)
    with pytest.raises(ValueError, match="answers"):
        env.step(np.array([0, 4]))
    with pytest.raises(ValueError, match="answers"):
        env.step(np.array([0, 1, 2]))


# ---------------------------------------------------------------- CountRecall


def test_count_recall_oracle_counts_from_observations() -> None:
    env = CountRecallEnv(n_symbols=4, episode_length=16)

    def oracle(obs, history):  # independent count over the remembered value one-hots
        values = np.argmax(np.stack(history)[:, :4], axis=1)
        query = int(np.argmax(obs[4:]))
        return int(np.sum(values == query))

    for seed in range(5):
        total, rewards = play(env, oracle, seed)
        assert total == pytest.approx(1.0) and len(rewards) == 16


def test_count_recall_random_and_memoryless_are_far_below_optimum() -> None:
    env = gym.make("rlt/CountRecall-v0")
    env.action_space.seed(0)
    random_totals = [play(env, lambda o, h: env.action_space.sample(), s)[0] for s in range(300)]
    assert abs(np.mean(random_totals) - 1 / 17) < 0.015  # exact chance 1/(T+1); s.e. ~0.0033
    # Memoryless: answer 1 iff the current value equals the query (ignores the past).
    memoryless = [play(env, lambda o, h: int(np.argmax(o[:4]) == np.argmax(o[4:])), s)[0] for s in range(50)]
    assert np.mean(memoryless) < 0.4


# ---------------------------------------------------------------- ContinuousRecall


@pytest.mark.parametrize("delay", [0, 1, 5, 50])
def test_continuous_recall_oracle_is_exact(delay: int) -> None:
    env = ContinuousRecallEnv(delay=delay)
    for seed in range(5):
        obs, _ = env.reset(seed=seed)
        cue = obs[0]
        assert obs[1] == (1.0 if delay == 0 else 0.0)
        steps, done = 0, False
        while not done:
            obs, r, done, _, info = env.step(
                np.array([cue if obs[1] == 1.0 or delay == 0 else -1.0], np.float32)
            )
            steps += 1
            if not done:
                assert r == 0.0 and obs[0] == 0.0
        assert steps == delay + 1 and r == 0.0 and info["abs_error"] == 0.0


def test_continuous_recall_scores_of_random_and_memoryless() -> None:
    env = gym.make("rlt/ContinuousRecall-v0")
    env.action_space.seed(1)
    rnd = [play(env, lambda o, h: env.action_space.sample(), s)[0] for s in range(1500)]
    zero = [play(env, lambda o, h: np.zeros(1, np.float32), s)[0] for s in range(1500)]
    assert abs(np.mean(rnd) - (-2 / 3)) < 0.04  # s.e. ~0.012
    assert abs(np.mean(zero) - (-1 / 2)) < 0.04  # s.e. ~0.0075
    assert envs.MEMORY_TASKS["rlt/ContinuousRecall-v0"].random_score == pytest.approx(-2 / 3)


def test_continuous_recall_clips_actions() -> None:
    env = ContinuousRecallEnv(delay=0)
    obs, _ = env.reset(seed=2)
    _, r, _, _, _ = env.step(np.array([5.0]))
    assert r == pytest.approx(-(1.0 - obs[0]))


def test_repeat_previous_fifo_oracle() -> None:
    """A bounded FIFO of delay + 1 symbols is all the memory the task needs."""
    env = RepeatPreviousEnv(n_symbols=3, delay=2, episode_length=10)
    obs, _ = env.reset(seed=4)
    fifo: deque[int] = deque(maxlen=3)
    total, done = 0.0, False
    while not done:
        fifo.append(int(np.argmax(obs)))
        obs, r, done, _, _ = env.step(fifo[0] if len(fifo) == 3 else 0)
        total += r
    assert total == pytest.approx(1.0)
