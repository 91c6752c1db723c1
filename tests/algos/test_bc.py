"""BC and %BC baselines through the DT trainer: no return token, top-fraction filtering, untargeted eval tags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rl_transformers.algos.bc import as_bc, bc_config, train_bc
from rl_transformers.algos.dt_config import DTConfig
from tests.algos.test_dt import cartpole_dataset, tiny_config


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cartpole_dataset(
        tmp_path_factory.mktemp("bc") / "cartpole.hdf5", n_good=2, n_random=10, max_steps=60
    )


def test_bc_config_and_conversion() -> None:
    config = bc_config("data.hdf5", 0.1, context_len=5)
    assert (config.algo, config.bc_top_fraction, config.context_len) == ("bc", 0.1, 5)
    dt = DTConfig(dataset="data.hdf5", target_returns=(1.0,), total_steps=7)
    bc = as_bc(dt, 0.25)
    assert (bc.algo, bc.bc_top_fraction, bc.total_steps, bc.target_returns) == ("bc", 0.25, 7, None)


def test_bc_trains_without_return_token(dataset: Path, tmp_path: Path) -> None:
    fields = tiny_config(dataset, tmp_path, total_steps=4, eval_every=0, eval_episodes=1).__dict__
    fields = {k: v for k, v in fields.items() if k not in ("dataset", "algo", "bc_top_fraction")}
    result = train_bc(str(dataset), **fields)
    model = result.model
    assert not model.condition_on_return and model.embed_return is None and model.tokens_per_step == 2
    assert result.run_dir.parent.parent.name == "bc"
    final = result.evaluations[4]
    assert "eval/return_mean" in final and not any("@" in key for key in final)
    assert json.loads((result.run_dir / "config.json").read_text())["algo"] == "bc"


def test_percent_bc_keeps_only_the_best_episodes(dataset: Path, tmp_path: Path) -> None:
    full = train_bc(str(dataset), 1.0, **_small(tmp_path / "full"))
    top = train_bc(str(dataset), 0.3, **_small(tmp_path / "top"))
    assert full.data_summary["episodes"] == 12
    # the 2 good-controller episodes (return 60 each) hold 120 of the steps; 30% keeps only those
    assert top.data_summary["episodes"] < full.data_summary["episodes"]
    assert top.data_summary["return_min"] == 60.0
    assert top.data_summary["steps"] <= 0.3 * full.data_summary["steps"] + 1


def _small(tmp_path: Path) -> dict:
    return {"run_root": tmp_path, "total_steps": 1, "eval_episodes": 0, "progress": False, "batch_size": 4}
