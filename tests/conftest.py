"""Shared pytest set-up: one thread per worker (tests run with -n 2 on 2 cores), seeded RNGs, gpu marker."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch

torch.set_num_threads(1)
# checkpoint signing key (rl_transformers.utils.trust) in a throw-away directory, never the user's own
os.environ["RLT_HOME"] = tempfile.mkdtemp(prefix="rlt_home_")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
