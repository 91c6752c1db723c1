"""bench.report: the committed CPU benchmark pages are what ``markdown`` writes from their records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rl_transformers.bench import report

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("folder", ["cpu", "cpu-long"])
def test_the_committed_cpu_pages_rebuild_byte_for_byte(folder: str) -> None:
    results = json.loads(
        (ROOT / "benchmarks" / "results" / folder / "results.json").read_text(encoding="utf-8")
    )
    page = (ROOT / "benchmarks" / "results" / folder / "results.md").read_text(encoding="utf-8")
    assert report.markdown(results) == page
