"""FloatFlattenObservation / MaskObservation: hand-computed vectors, gymnasium's flatten as a reference."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.utils.env_checker import check_env

from envs.wrappers import (
    FloatFlattenObservation,
    MaskObservation,
    flat_dim,
    flatten_space_float,
    flatten_value,
)


def test_hand_computed_vectors() -> None:
    np.testing.assert_array_equal(flatten_value(spaces.Discrete(3, start=1), 2), [0, 1, 0])
    np.testing.assert_array_equal(flatten_value(spaces.MultiDiscrete([2, 3]), [1, 2]), [0, 1, 0, 0, 1])
    md_start = spaces.MultiDiscrete([2, 2], start=[-1, 5])
    np.testing.assert_array_equal(flatten_value(md_start, [-1, 6]), [1, 0, 0, 1])
    np.testing.assert_array_equal(flatten_value(spaces.MultiBinary(3), [1, 0, 1]), [1, 0, 1])
    tup = spaces.Tuple((spaces.Discrete(2), spaces.Box(-2, 2, (2,))))
    np.testing.assert_array_equal(flatten_value(tup, (1, np.array([0.5, -1.0]))), [0, 1, 0.5, -1.0])
    dct = spaces.Dict({"b": spaces.Discrete(2), "a": spaces.Box(0, 9, (1, 2), np.uint8)})
    # gymnasium's Dict sorts its keys: "a" comes first.
    out = flatten_value(dct, {"b": 0, "a": np.array([[3, 4]], np.uint8)})
    np.testing.assert_array_equal(out, [3, 4, 1, 0])
    assert out.dtype == np.float32


SPACES = {
    "discrete": spaces.Discrete(5),
    "multidiscrete": spaces.MultiDiscrete([3, 2, 4]),
    "multibinary": spaces.MultiBinary(4),
    "box_uint8": spaces.Box(0, 255, (2, 3), np.uint8),
    "tuple": spaces.Tuple((spaces.Discrete(2), spaces.MultiDiscrete([2, 3]))),
    "dict": spaces.Dict({"x": spaces.Discrete(3), "y": spaces.Box(-1, 1, (2,)), "z": spaces.MultiBinary(2)}),
    "nested": spaces.Dict({"t": spaces.Tuple((spaces.Discrete(2), spaces.Dict({"u": spaces.Discrete(3)})))}),
}


@pytest.mark.parametrize("name", list(SPACES))
def test_matches_gymnasium_flatten_and_stays_in_space(name: str) -> None:
    space = SPACES[name]
    space.seed(0)
    box = flatten_space_float(space)
    assert box.dtype == np.float32 and box.shape == (flat_dim(space),)
    for _ in range(20):
        x = space.sample()
        ours = flatten_value(space, x)
        reference = np.asarray(spaces.flatten(space, x), dtype=np.float32)  # gymnasium's one-hot layout
        np.testing.assert_array_equal(ours, reference)
        assert box.contains(ours)


def test_unsupported_space_error_lists_supported() -> None:
    with pytest.raises(TypeError, match="supported spaces: Box, Discrete"):
        flatten_space_float(spaces.Text(5))


class _StructuredEnv(gym.Env):
    """Tuple observation with a Text part in a Dict, to exercise drop_keys and check_env."""

    metadata = {"render_modes": []}

    def __init__(self) -> None:
        self.observation_space = spaces.Dict(
            {"pos": spaces.Discrete(4), "mission": spaces.Text(8), "bits": spaces.MultiBinary(2)}
        )
        self.action_space = spaces.Discrete(2)
        self._pos = 0

    def _obs(self):
        return {"pos": self._pos, "mission": "go", "bits": np.array([self._pos % 2, 1], np.int8)}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._pos = int(self.np_random.integers(4))
        return self._obs(), {}

    def step(self, action):
        self._pos = (self._pos + int(action)) % 4
        return self._obs(), 0.0, self._pos == 3, False, {}


def test_wrapper_drop_keys_and_check_env() -> None:
    env = FloatFlattenObservation(_StructuredEnv(), drop_keys=("mission",))
    assert env.observation_space.shape == (6,)
    obs, _ = env.reset(seed=0)
    pos = env.unwrapped._pos
    expected = np.zeros(6, np.float32)
    expected[:2] = [pos % 2, 1]  # "bits" comes first (Dict keys are sorted: bits, pos)
    expected[2 + pos] = 1
    np.testing.assert_array_equal(obs, expected)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*different from the unwrapped.*")
        warnings.filterwarnings("ignore", message=".*environment.*spec.*")
        check_env(env, skip_render_check=True)
    with pytest.raises(KeyError, match="nope"):
        FloatFlattenObservation(_StructuredEnv(), drop_keys=("nope",))
    with pytest.raises(TypeError, match="Text"):
        FloatFlattenObservation(_StructuredEnv())


def test_mask_observation() -> None:
    env = MaskObservation(gym.make("CartPole-v1"), keep=[2, 0])
    obs, _ = env.reset(seed=0)
    np.testing.assert_array_equal(obs, np.asarray(env.unwrapped.state, np.float32)[[2, 0]])
    with pytest.raises(ValueError, match="outside"):
        MaskObservation(gym.make("CartPole-v1"), keep=[4])
    with pytest.raises(TypeError, match="1-D Box"):
        MaskObservation(FloatFlattenObservation(_StructuredEnv(), ("mission",)).env, keep=[0])
