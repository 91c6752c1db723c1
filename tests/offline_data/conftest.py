"""A Minari root inside tmp_path for every test that asks for it."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def minari_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """MINARI_DATASETS_PATH pointed into tmp_path (nothing touches ~/.minari)."""
    root = tmp_path / "minari"
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    return root
