"""Action heads: log-probs / entropies against torch.distributions, sampling frequencies, Box clipping."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces
from torch import distributions as D

from rl_transformers.policies.heads import make_action_head


def test_categorical_matches_torch() -> None:
    head = make_action_head(spaces.Discrete(4), 3)
    h = torch.randn(5, 7, 3)
    dist = head(h)
    ref = D.Categorical(logits=head.linear(h))
    a = ref.sample()
    torch.testing.assert_close(dist.log_prob(a), ref.log_prob(a))
    torch.testing.assert_close(dist.entropy(), ref.entropy())
    assert torch.equal(dist.mode(), ref.probs.argmax(-1))


def test_categorical_sampling_frequencies() -> None:
    torch.manual_seed(0)
    head = make_action_head(spaces.Discrete(3), 2)
    with torch.no_grad():
        head.linear.weight.zero_()
        head.linear.bias.copy_(torch.log(torch.tensor([0.2, 0.3, 0.5])))
    dist = head(torch.zeros(40_000, 2))
    freq = torch.bincount(dist.sample(), minlength=3).float() / 40_000
    torch.testing.assert_close(freq, torch.tensor([0.2, 0.3, 0.5]), atol=0.01, rtol=0)


def test_multicategorical_sums_independent_parts() -> None:
    head = make_action_head(spaces.MultiDiscrete([3, 2, 4]), 3)
    h = torch.randn(6, 3)
    dist = head(h)
    logits = head.linear(h).split([3, 2, 4], -1)
    refs = [D.Categorical(logits=x) for x in logits]
    a = torch.stack([r.sample() for r in refs], -1)
    torch.testing.assert_close(dist.log_prob(a), sum(r.log_prob(a[:, i]) for i, r in enumerate(refs)))
    torch.testing.assert_close(dist.entropy(), sum(r.entropy() for r in refs))
    assert dist.sample().shape == (6, 3)


def test_gaussian_matches_torch_and_has_state_independent_std() -> None:
    head = make_action_head(spaces.Box(-1, 1, (2,)), 3, log_std_init=-0.5)
    h = torch.randn(4, 5, 3)
    dist = head(h)
    ref = D.Independent(D.Normal(head.linear(h).view(4, 5, 2), torch.full((2,), float(np.exp(-0.5)))), 1)
    a = ref.sample() * 3  # far outside the bounds: log-probs are of the unclipped action
    torch.testing.assert_close(dist.log_prob(a), ref.log_prob(a))
    torch.testing.assert_close(dist.entropy(), ref.entropy())
    assert head.log_std.shape == (2,)  # one parameter per action dim, not a function of h


def test_box_actions_are_clipped_only_for_the_env() -> None:
    space = spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([1.0, 2.0], np.float32))
    head = make_action_head(space, 2)
    a = torch.tensor([[3.0, -1.0], [0.5, 1.5]])
    env_a = head.to_env(a)
    np.testing.assert_allclose(env_a, [[1.0, 0.0], [0.5, 1.5]])
    assert env_a.dtype == np.float32
    assert a[0, 0] == 3.0  # the stored action is untouched


def test_bernoulli_and_discrete_start() -> None:
    head = make_action_head(spaces.MultiBinary(3), 2)
    h = torch.randn(5, 2)
    dist = head(h)
    ref = D.Independent(D.Bernoulli(logits=head.linear(h)), 1)
    a = ref.sample()
    torch.testing.assert_close(dist.log_prob(a), ref.log_prob(a))
    torch.testing.assert_close(dist.entropy(), ref.entropy())
    disc = make_action_head(spaces.Discrete(3, start=-1), 2)
    assert disc.to_env(torch.tensor([0, 2])).tolist() == [-1, 1]


def test_unsupported_action_space() -> None:
    with pytest.raises(TypeError, match="supported: Discrete"):
        make_action_head(spaces.Text(3), 2)
