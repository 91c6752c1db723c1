"""The tuning search space's capacity range: tuning a width keeps the parameter count within the tolerance, so
every encoder is tuned at its matched size; the old half-to-twice range stays available (None)."""

from __future__ import annotations

import math

import pytest

from rl_transformers.study.knobs import Knob
from rl_transformers.study.tuning_space import DEFAULT_REACH, SearchSpace, capacity_range
from rl_transformers.utils.errors import UserError

WIDTH = Knob("hidden_size", "policy", "capacity", 100)


def square(v: int) -> int:
    return v * v


def test_the_capacity_range_is_every_width_within_the_tolerance_and_nothing_else() -> None:
    low, high = capacity_range(SearchSpace(param_tolerance=0.1), WIDTH, square)
    inside = [v for v in range(50, 201) if abs(v * v - 100 * 100) <= 0.1 * 100 * 100]
    assert (low, high) == (inside[0], inside[-1]) == (math.ceil(math.sqrt(0.9) * 100), 104)
    low, high = capacity_range(SearchSpace(param_tolerance=0.5), WIDTH, square)
    assert (low, high) == (71, 122)  # sqrt(0.5) * 100 = 70.7, sqrt(1.5) * 100 = 122.5
    # a count that does not grow with the width (random features are buffers): half to twice, no wider
    assert capacity_range(SearchSpace(), WIDTH, lambda v: 1000) == (50, 200)


def test_other_knobs_an_explicit_range_and_no_tolerance_keep_their_ranges() -> None:
    assert capacity_range(SearchSpace(param_tolerance=None), WIDTH, square) == (50, 200)
    assert capacity_range(SearchSpace(knob=(10, 400)), WIDTH, square) == (10, 400)
    reach = Knob("mem_len", "memory", "reach", 64)
    assert capacity_range(SearchSpace(), reach, square) == DEFAULT_REACH


def test_a_tolerance_that_leaves_one_width_or_is_not_a_fraction_is_refused() -> None:
    with pytest.raises(UserError, match="hidden_size can only be 100") as err:
        capacity_range(SearchSpace(param_tolerance=0.001), WIDTH, square)
    assert err.value.source == "--space.param-tolerance"
    for bad in (0, 1.5, -0.1):
        with pytest.raises(UserError, match="fraction"):
            SearchSpace(param_tolerance=bad)
