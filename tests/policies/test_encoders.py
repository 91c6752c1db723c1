"""Observation encoders: every supported space, any leading batch dims, one-hot semantics, image layouts."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces

from rl_transformers.policies.encoders import (
    CNNEncoder,
    CompositeEncoder,
    MLPEncoder,
    OneHotEncoder,
    image_layout,
    make_encoder,
    obs_to_tensor,
)

SPACES = {
    "box": (spaces.Box(-1, 1, (4,)), MLPEncoder),
    "box_2d": (spaces.Box(-1, 1, (3, 5)), MLPEncoder),
    "multibinary": (spaces.MultiBinary(6), MLPEncoder),
    "discrete": (spaces.Discrete(5, start=2), OneHotEncoder),
    "multidiscrete": (spaces.MultiDiscrete([3, 4, 2]), OneHotEncoder),
    "image_hwc_small": (spaces.Box(0, 255, (7, 7, 3), np.uint8), CNNEncoder),
    "image_chw_large": (spaces.Box(0, 255, (4, 40, 40), np.uint8), CNNEncoder),
    "dict": (spaces.Dict({"pos": spaces.Box(-1, 1, (2,)), "key": spaces.Discrete(3)}), CompositeEncoder),
    "tuple": (spaces.Tuple((spaces.Discrete(4), spaces.Box(-1, 1, (3,)))), CompositeEncoder),
}


@pytest.mark.parametrize("name", sorted(SPACES))
@pytest.mark.parametrize("lead", [(5,), (2, 3)], ids=["B", "BT"])
def test_shapes_for_every_space(name: str, lead: tuple[int, ...]) -> None:
    space, cls = SPACES[name]
    space.seed(0)
    enc = make_encoder(space, 8)
    assert isinstance(enc, cls)
    samples = [space.sample() for _ in range(int(np.prod(lead)))]
    if isinstance(space, spaces.Dict):
        batch = {k: np.stack([s[k] for s in samples]).reshape(*lead, *np.shape(samples[0][k])) for k in space}
    elif isinstance(space, spaces.Tuple):
        batch = tuple(
            np.stack([s[i] for s in samples]).reshape(*lead, *np.shape(samples[0][i])) for i in range(2)
        )
    else:
        batch = np.stack(samples).reshape(*lead, *np.shape(samples[0]))
    out = enc(obs_to_tensor(batch, space))
    assert out.shape == (*lead, 8)
    assert torch.isfinite(out).all()


def test_one_hot_is_a_linear_map_of_the_one_hot_vector() -> None:
    space = spaces.MultiDiscrete([3, 4], start=[1, -2])
    enc = make_encoder(space, 5)
    x = torch.tensor([[1, -2], [3, 1], [2, 0]])
    one_hot = torch.cat(
        [torch.nn.functional.one_hot(x[:, 0] - 1, 3), torch.nn.functional.one_hot(x[:, 1] + 2, 4)], 1
    )
    expected = one_hot.float() @ enc.embed.weight + enc.bias
    torch.testing.assert_close(enc(x), expected)


def test_image_layout_detection() -> None:
    assert image_layout(spaces.Box(0, 255, (64, 64, 3), np.uint8)) == "HWC"
    assert image_layout(spaces.Box(0, 255, (3, 64, 64), np.uint8)) == "CHW"
    assert image_layout(spaces.Box(0, 255, (1, 9, 9), np.uint8)) == "CHW"
    assert image_layout(spaces.Box(0, 1, (64, 64, 3), np.float32)) is None  # not uint8: a plain Box
    assert image_layout(spaces.Box(0, 255, (64, 64), np.uint8)) is None


def test_hwc_and_chw_give_the_same_features_for_the_same_image() -> None:
    torch.manual_seed(0)
    hwc = make_encoder(spaces.Box(0, 255, (8, 8, 3), np.uint8), 6)
    chw = make_encoder(spaces.Box(0, 255, (3, 8, 8), np.uint8), 6)
    chw.load_state_dict(hwc.state_dict())
    img = torch.randint(0, 256, (2, 8, 8, 3), dtype=torch.uint8)
    torch.testing.assert_close(hwc(img), chw(img.permute(0, 3, 1, 2)))


def test_unsupported_space_names_the_supported_ones() -> None:
    with pytest.raises(TypeError, match="supported: Box"):
        make_encoder(spaces.Text(5), 4)


def test_running_norm_matches_numpy_over_chunked_updates() -> None:
    """Chan's merge over unequal chunks == mean / (population) variance of everything, in float64."""
    from rl_transformers.policies.encoders import RunningNorm

    rng = np.random.default_rng(0)
    data = rng.normal(3.0, 2.5, size=(130, 2, 3)) * np.array([1.0, 10.0, 0.1])
    norm = RunningNorm((2, 3), clip=5.0)
    x = torch.zeros(4, 2, 3)
    torch.testing.assert_close(norm(x), x)  # identity before any update
    for chunk in np.split(data, [1, 40, 41, 100]):
        norm.update(torch.as_tensor(chunk, dtype=torch.float32))
    np.testing.assert_allclose(norm.mean.numpy(), data.mean(0), rtol=1e-6)
    np.testing.assert_allclose(norm.var.numpy(), data.var(0), rtol=1e-5)
    assert float(norm.count) == 130
    z = norm(torch.as_tensor(data, dtype=torch.float32))
    expected = np.clip((data - data.mean(0)) / np.sqrt(data.var(0) + 1e-8), -5, 5)
    np.testing.assert_allclose(z.numpy(), expected, rtol=1e-4, atol=1e-5)
    assert z.dtype == torch.float32 and float(z.abs().max()) <= 5.0
    with pytest.raises(ValueError, match="clip must be > 0"):
        RunningNorm((3,), clip=0.0)
