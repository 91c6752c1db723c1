"""The timestep-embedding size of a DT run (dt_setup.episode_embedding_rows)."""

from __future__ import annotations

import pytest

from rl_transformers.algos.dt_setup import episode_embedding_rows
from rl_transformers.utils.errors import UserError


def test_default_covers_the_longest_episode_and_the_time_limit() -> None:
    assert episode_embedding_rows(None, 201, None) == 201
    assert episode_embedding_rows(None, 201, 500) == 500
    assert episode_embedding_rows(None, 600, 500) == 600


def test_a_given_size_at_or_above_the_longest_episode_is_kept() -> None:
    assert episode_embedding_rows(201, 201, None) == 201
    assert episode_embedding_rows(1000, 201, 500) == 1000


def test_a_given_size_below_the_longest_episode_is_refused_with_the_fix() -> None:
    with pytest.raises(
        UserError, match=r"--max-ep-len: 50 is below the dataset's longest episode \(201 steps\)"
    ) as err:
        episode_embedding_rows(50, 201, 500)
    assert "--max-ep-len >= 201" in str(err.value)
