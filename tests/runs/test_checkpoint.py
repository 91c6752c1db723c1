"""Tests for rl_transformers.runs.checkpoint: atomic saves, RNG state round trip, the checkpoint manager."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rl_transformers.runs.checkpoint import CheckpointManager, atomic_save
from rl_transformers.runs.checkpoint_load import latest_checkpoint, load_checkpoint
from rl_transformers.utils import capture_rng_state, restore_rng_state


def _draws() -> tuple[Any, ...]:
    # random.gauss and np.random.normal keep a cached second value: part of the state to restore
    return (
        random.random(),
        random.gauss(0.0, 1.0),
        np.random.rand(3).tolist(),
        np.random.normal(size=3).tolist(),
        torch.rand(3).tolist(),
        torch.randint(0, 1000, (2,)).tolist(),
    )


def test_atomic_save_round_trip_leaves_no_temp_file(tmp_path: Path) -> None:
    obj = {"weights": torch.arange(6.0).reshape(2, 3), "step": 12}
    path = atomic_save(obj, tmp_path / "sub" / "ckpt.pt")
    assert sorted(p.name for p in path.parent.iterdir()) == ["ckpt.pt"]
    loaded = load_checkpoint(path)
    assert torch.equal(loaded["weights"], obj["weights"]) and loaded["step"] == 12


@pytest.mark.parametrize("error", [RuntimeError("disk full"), KeyboardInterrupt()], ids=["error", "ctrl-c"])
def test_interrupted_save_keeps_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: BaseException
) -> None:
    path = tmp_path / "last.pt"
    atomic_save({"version": 1}, path)
    real_save = torch.save

    def failing_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        real_save({"version": 2, "big": torch.zeros(1000)}, f)  # half the bytes are on disk ...
        raise error  # ... when the save dies

    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(type(error)):
        atomic_save({"version": 2}, path)
    monkeypatch.undo()
    assert load_checkpoint(path) == {"version": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]


def test_rng_state_restores_identical_draws(tmp_path: Path) -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    _draws()  # move away from the seeded position so a re-seed would not accidentally match
    random.gauss(0.0, 1.0)  # leave a cached gaussian in python's and ...
    np.random.normal()  # ... numpy's state
    state = capture_rng_state()
    first = _draws()
    second = _draws()
    assert first != second  # the draws do depend on the state
    # through a real checkpoint, loaded with the safe (weights_only) loader
    atomic_save({"rng": state}, tmp_path / "rng.pt")
    restore_rng_state(load_checkpoint(tmp_path / "rng.pt")["rng"])
    assert _draws() == first
    # and through JSON-like containers (lists instead of tuples)
    plain = json.loads(
        json.dumps({k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in state.items()})
    )
    restore_rng_state(plain)
    assert _draws() == first
    assert _draws() == second


def test_manager_keeps_last_n_and_labels_best_and_last(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, keep_last=2, metric="eval/normalized_score", mode="max")
    metrics = {1000: 10.0, 2000: 30.0, 3000: float("nan"), 4000: 20.0}
    for step, value in metrics.items():
        manager.save({"model": torch.full((2,), float(step)), "step": step}, step, value)
    directory = tmp_path / "checkpoints"
    assert manager.kept_steps() == [3000, 4000]
    assert sorted(p.name for p in directory.iterdir()) == [
        "best.pt",
        "index.json",
        "last.pt",
        "step_3000.pt",
        "step_4000.pt",
    ]
    last, best = manager.load("last"), manager.load("best")
    assert last["step"] == 4000 and torch.equal(last["model"], torch.full((2,), 4000.0))
    assert best["step"] == 2000  # NaN never counts as best; 20 < 30
    assert best["checkpoint_meta"] == {"step": 2000, "metric": "eval/normalized_score", "metric_value": 30.0}
    assert last["checkpoint_meta"]["metric_value"] == 20.0
    index = json.loads((directory / "index.json").read_text())
    assert index["best"] == {"file": "best.pt", "step": 2000, "metric_value": 30.0}
    assert index["last"]["step"] == 4000 and index["steps"] == [3000, 4000]
    assert latest_checkpoint(tmp_path) == directory / "last.pt"

    # a resumed run remembers the best value: 25 does not replace best.pt, 35 does
    resumed = CheckpointManager(tmp_path, keep_last=2, metric="eval/normalized_score", mode="max")
    assert (resumed.best_step, resumed.best_value, resumed.last_step) == (2000, 30.0, 4000)
    resumed.save({"step": 5000}, 5000, 25.0)
    assert resumed.load("best")["step"] == 2000
    resumed.save({"step": 6000}, 6000, 35.0)
    assert resumed.load("best")["step"] == 6000 and resumed.load(5000)["step"] == 5000


def test_manager_min_mode_without_step_files(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, keep_last=0, metric="eval/loss", mode="min")
    for step, value in [(1, 3.0), (2, 1.0), (3, 2.0)]:
        manager.save({"step": step}, step, value)
    assert manager.kept_steps() == []
    assert manager.load("last")["step"] == 3 and manager.load("best")["step"] == 2
    with pytest.raises(ValueError, match="metric"):
        CheckpointManager(tmp_path / "other").save({"step": 1}, 1, metric_value=1.0)


def test_latest_checkpoint_picks_highest_step_numerically(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path) is None
    for step in (9, 10, 2):
        atomic_save({"step": step}, tmp_path / "checkpoints" / f"step_{step}.pt")
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "step_10.pt"
    assert load_checkpoint(tmp_path)["step"] == 10
    explicit = tmp_path / "checkpoints" / "step_2.pt"
    assert latest_checkpoint(explicit) == explicit
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "missing")
