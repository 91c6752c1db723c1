"""experiments/memory_tasks/update_stats.py against a hand-built progress log."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

from experiments.memory_tasks import update_stats
from rl_transformers.utils.errors import UserError


def hand_log() -> list[dict[str, float]]:
    """Rollout rows every 100 steps (returns 0.0, 0.1, ..., 0.9) and update rows in between."""
    rows: list[dict[str, float]] = []
    coin = math.log(2) / 11  # corridor 10
    for i in range(10):
        rows.append({"step": 100 * i, "rollout/ep_rew_mean": i / 10})
        entropy = coin * (2 if i % 2 else 0.5)  # odd updates above the coin-flip level, even ones below
        rows.append({"step": 100 * i, "train/approx_kl": float(i), "train/clip_fraction": 0.1 * i,
                     "train/entropy_loss": -entropy})  # fmt: skip
    return rows


def test_figures_of_a_hand_built_log() -> None:
    figures = update_stats.summarise(hand_log(), corridor=10, window=(300, 800))
    assert figures["turned_at"] == 400  # the first return >= 0.4
    assert figures["return_range"] == pytest.approx([0.3, 0.7])
    assert figures["updates"] == 5  # steps 300, 400, 500, 600, 700
    assert figures["approx_kl"] == 5.0
    assert figures["clip_fraction"] == pytest.approx(0.5)
    assert figures["coin_share"] == pytest.approx(3 / 5)  # updates 3, 5 and 7 of the five are odd
    assert figures["entropy"] == pytest.approx(math.log(2) / 11 * 2)


def test_an_empty_window_has_no_medians() -> None:
    figures = update_stats.summarise(hand_log(), corridor=10, window=(5000, 6000), turned=2.0)
    assert figures["turned_at"] is None
    assert figures["return_range"] is None and figures["entropy"] is None and figures["updates"] == 0


def test_gzipped_and_plain_logs_read_alike(tmp_path: Path) -> None:
    text = "".join(json.dumps(row) + "\n" for row in hand_log())
    (tmp_path / "p.jsonl").write_text(text, encoding="utf-8")
    with gzip.open(tmp_path / "p.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write(text)
    assert update_stats.read_log(tmp_path / "p.jsonl") == update_stats.read_log(tmp_path / "p.jsonl.gz")
    assert update_stats.read_log(tmp_path / "p.jsonl") == hand_log()


def test_a_missing_log_and_a_broken_line_are_named(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="does not exist"):
        update_stats.read_log(tmp_path / "nothing.jsonl")
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"step": 1}\n\n{"step": \n', encoding="utf-8")
    with pytest.raises(UserError, match=r"broken.jsonl, line 3: not a JSON row"):
        update_stats.read_log(broken)
