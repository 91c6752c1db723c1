"""Fixtures of the backbone tests."""

from __future__ import annotations

import pytest

from rl_transformers.backbone.attention import _banded


@pytest.fixture(params=["dense", "blocked"])
def kernel_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a sparse-pattern test on the dense T x S form and on the blocked parts (both must be exact)."""
    monkeypatch.setattr(_banded, "DENSE_PATH", "always" if request.param == "dense" else "never")
    return str(request.param)
