"""Fixtures of the backbone tests."""

from __future__ import annotations

import pytest

from rl_transformers.backbone.attention import _dense


@pytest.fixture(params=["dense", "blocked", "fused"])
def kernel_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a sparse-pattern test on the dense T x S form, the blocked parts and the chunked fused-kernel forms
    (tiny chunks, so every length has several); all must be exact. Entries without a fused form fall back to
    the blocked parts under "fused"."""
    monkeypatch.setattr(_dense, "DENSE_PATH", "always" if request.param == "dense" else "never")
    if request.param == "fused":
        monkeypatch.setattr(_dense, "FUSED_MIN_LEN", 0)
        monkeypatch.setattr(_dense, "FUSED_CHUNK", 3)
    else:
        monkeypatch.setattr(_dense, "FUSED_MIN_LEN", 10**9)
    return str(request.param)
