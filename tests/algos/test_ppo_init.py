"""--init-from: a run that starts from another run's policy weights (a curriculum or fine-tuning stage)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from rl_transformers.algos.ppo import PPOTrainer, train
from rl_transformers.algos.ppo_config import TrainConfig
from rl_transformers.policies import PolicyConfig, gtrxl_backbone
from rl_transformers.utils.errors import UserError
from tests.algos.test_ppo import BATCH, final_params, tiny


def normalised(tmp_path: Path, d_model: int = 16, mem_len: int = 8, **kw) -> TrainConfig:
    policy = PolicyConfig(backbone=gtrxl_backbone(d_model, 1, 2, mem_len=mem_len), norm_obs=True)
    return dataclasses.replace(tiny(tmp_path, **kw), policy=policy)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = train(normalised(tmp_path_factory.mktemp("source"), updates=3)).run_dir
    assert run_dir is not None
    return run_dir


def test_starts_from_the_saved_weights_with_a_fresh_optimizer(tmp_path: Path, source: Path) -> None:
    # another corridor and a longer memory: neither changes the weights
    cfg = normalised(tmp_path, mem_len=24, env_kwargs={"corridor_length": 9}, init_from=str(source))
    trainer = PPOTrainer(cfg)
    try:
        saved = final_params(source)
        state = trainer.policy.state_dict()
        assert state.keys() == saved.keys()
        assert all(torch.equal(state[k], saved[k]) for k in saved)
        assert any(k.startswith("obs_norm.") for k in saved)  # the normaliser's statistics come along
        fresh = PPOTrainer(dataclasses.replace(cfg, init_from=None))
        fresh.close()
        assert not all(torch.equal(fresh.policy.state_dict()[k], saved[k]) for k in saved)
        assert trainer.optimizer.state_dict()["state"] == {} and trainer.global_step == 0
    finally:
        trainer.close()


def test_the_run_records_its_source_and_resumes_without_reloading(tmp_path: Path, source: Path) -> None:
    cfg = normalised(tmp_path / "split", updates=4, init_from=str(source))
    first = train(cfg, callback=lambda tr: tr.update < 2)
    assert first.interrupted and first.run_dir is not None
    assert json.loads((first.run_dir / "config.json").read_text())["init_from"] == str(source)
    resumed = train(dataclasses.replace(cfg, resume=str(first.run_dir)))
    straight = train(normalised(tmp_path / "straight", updates=4, init_from=str(source)))
    assert resumed.step == straight.step == 4 * BATCH
    a, b = final_params(resumed.run_dir), final_params(straight.run_dir)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_other_weights_or_no_checkpoint_are_user_errors(tmp_path: Path, source: Path) -> None:
    with pytest.raises(UserError, match="do not load") as err:
        PPOTrainer(normalised(tmp_path, d_model=32, init_from=str(source)))
    assert str(source) in str(err.value)
    with pytest.raises(UserError, match="no checkpoint there"):
        PPOTrainer(normalised(tmp_path, init_from=str(tmp_path / "missing")))
