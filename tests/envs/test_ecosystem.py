"""Every ``rlt/`` id works with the ecosystem's own tools: SB3 ``make_vec_env`` and ``check_env``,
``gymnasium.make_vec`` and Gymnasium's ``check_env`` (ids of missing optional extras are skipped)."""

from __future__ import annotations

import re
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env as gymnasium_check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env
from stable_baselines3.common.env_util import make_vec_env

import envs
from envs.tmaze import EAST, NORTH, TMazeEnv

IDS = sorted(i for i in gym.registry if i.startswith("rlt/"))


def _make(env_id: str, **kwargs) -> gym.Env:
    extra = envs.MEMORY_TASKS[env_id].extra if env_id in envs.MEMORY_TASKS else None
    if extra is None and "popgym" in env_id:
        extra = "popgym"
    if extra is not None:
        pytest.importorskip(extra)
    return gym.make(env_id, **kwargs)


def test_every_core_id_is_listed() -> None:
    assert {"rlt/TMaze-v0", "rlt/CartPoleNoVel-v0", "rlt/RepeatPrevious-v0"} <= set(IDS)
    assert len(IDS) >= 10


@pytest.mark.parametrize("env_id", IDS)
def test_sb3_make_vec_env_and_gymnasium_make_vec(env_id: str) -> None:
    probe = _make(env_id)  # skips ids whose optional extra is missing
    single = probe.observation_space
    probe.close()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gymnasium warns when SB3 asks an env without images for rgb_array
        vec = make_vec_env(env_id, n_envs=2, seed=0)

    def check_batch(obs: object, space: gym.Space) -> None:  # 2 envs stacked, every key of a Dict space
        if isinstance(space, gym.spaces.Dict):
            assert isinstance(obs, dict) and set(obs) == set(space.spaces)
            for key, sub in space.spaces.items():
                check_batch(obs[key], sub)
        else:
            assert np.asarray(obs).shape[0] == 2 and np.asarray(obs).shape[1:] == space.shape

    check_batch(vec.reset(), single)
    obs, rewards, dones, infos = vec.step(np.stack([vec.action_space.sample() for _ in range(2)]))
    check_batch(obs, single)
    assert rewards.shape == (2,) and dones.shape == (2,) and len(infos) == 2
    vec.close()
    gvec = gym.make_vec(env_id, num_envs=2, vectorization_mode="sync")
    check_batch(gvec.reset(seed=0)[0], single)
    obs, rewards, terminated, truncated, _ = gvec.step(gvec.action_space.sample())
    check_batch(obs, single)
    assert rewards.shape == terminated.shape == truncated.shape == (2,)
    gvec.close()


@pytest.mark.parametrize("env_id", IDS)
def test_env_checkers(env_id: str) -> None:
    env = _make(env_id)
    with warnings.catch_warnings(record=True) as caught:
        # checker advice (unbounded Box, asymmetric actions) is not an error ...
        warnings.simplefilter("always")
        gymnasium_check_env(env, skip_render_check=True)
        sb3_check_env(env, warn=True)
    env.close()
    # ... but an observation outside its space, or of the wrong dtype, is
    wrong = [str(w.message) for w in caught if re.search(r"not within|dtype|expected type", str(w.message))]
    assert not wrong, wrong


def test_tmaze_renders_rgb_frames_showing_the_agent() -> None:
    env = gym.make("rlt/TMaze-v0", corridor_length=3, render_mode="rgb_array")
    env.reset(seed=0, options={"goal": 1})
    frame = env.render()
    assert frame.shape == (3 * 16, 4 * 16, 3) and frame.dtype == np.uint8
    agent = np.array([40, 80, 255])
    assert (frame[16 + 8, 8] == agent).all()  # corridor row, x = 0
    for action in (EAST, EAST, EAST, NORTH):
        env.step(action)
    frame = env.render()
    assert (frame[8, 3 * 16 + 8] == agent).all()  # north arm at the junction
    assert (frame[16 + 8, 8] == (128, 128, 128)).all()  # the cue is gone
    env.close()


def test_tmaze_refuses_unknown_render_mode_with_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"render_mode='video'.*rgb_array"):
        TMazeEnv(render_mode="video")
