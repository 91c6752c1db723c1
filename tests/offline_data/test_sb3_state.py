"""Builder policy files without pickle: SB3 training state round trip (SAC), policy weights from SB3 zips."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from offline_data.errors import DatasetError
from offline_data.sb3_state import (
    load_policy_weights,
    load_train_state,
    restore_train_state,
    save_model_zip,
    save_train_state,
)
from tests.offline_data.helpers import record_raw


def test_sac_training_state_round_trip(tmp_path: Path) -> None:
    from stable_baselines3 import SAC

    model = SAC(
        "MlpPolicy", "Pendulum-v1", learning_starts=32, buffer_size=500, batch_size=16, seed=0, device="cpu"
    )
    model.learn(96)
    recorded = [raw.to_episode() for raw in record_raw("Pendulum-v1", 2, 0, max_episode_steps=5)]
    path = tmp_path / "train_state.pt"
    save_train_state(path, model, "fp", {"history": [[64, -1.5]]}, recorded)
    fresh = SAC(
        "MlpPolicy", "Pendulum-v1", learning_starts=32, buffer_size=500, batch_size=16, seed=1, device="cpu"
    )
    info, episodes = restore_train_state(fresh, load_train_state(path))
    assert info == {"history": [[64, -1.5]]} and fresh.num_timesteps == 96
    assert fresh._n_updates == model._n_updates > 0
    for a, b in zip(fresh.policy.state_dict().values(), model.policy.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(fresh.log_ent_coef, model.log_ent_coef, rtol=0, atol=0)
    assert (
        fresh.actor.optimizer.state_dict()["state"][0]["step"]
        == model.actor.optimizer.state_dict()["state"][0]["step"]
    )
    assert fresh.replay_buffer.pos == model.replay_buffer.pos == 96
    np.testing.assert_array_equal(
        fresh.replay_buffer.observations[:96], model.replay_buffer.observations[:96]
    )
    np.testing.assert_array_equal(fresh.replay_buffer.actions[:96], model.replay_buffer.actions[:96])
    assert [len(e) for e in episodes] == [len(e) for e in recorded]
    np.testing.assert_array_equal(episodes[1].observations, recorded[1].observations)
    # the state file is plain tensors: a weights-only load reads it, and other files are refused
    (tmp_path / "other.pt").write_bytes(b"not a torch file")
    with pytest.raises(DatasetError, match="cannot be read"):
        load_train_state(tmp_path / "other.pt")


def test_policy_weights_come_from_policy_pth_only(tmp_path: Path) -> None:
    from stable_baselines3 import PPO

    model = PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, seed=0, device="cpu")
    path = save_model_zip(model, tmp_path / "policy.zip")
    fresh = PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, seed=5, device="cpu")
    load_policy_weights(fresh, path)
    obs = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32)
    np.testing.assert_array_equal(
        fresh.predict(obs, deterministic=True)[0], model.predict(obs, deterministic=True)[0]
    )
    wide = PPO(
        "MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, policy_kwargs={"net_arch": [8]}, device="cpu"
    )
    with pytest.raises(DatasetError, match="does not fit a default SB3 PPO MlpPolicy"):
        load_policy_weights(wide, path)
    (tmp_path / "x.zip").write_text("plain text")
    with pytest.raises(DatasetError, match="not a Stable-Baselines3 zip"):
        load_policy_weights(fresh, tmp_path / "x.zip")
