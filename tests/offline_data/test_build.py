"""The dataset builder end to end on tiny budgets (CartPole PPO, Pendulum SAC) and its CLI."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from offline_data import D4RL_REF_SCORES, load_episodes
from offline_data.build import build_datasets
from offline_data.build_config import SEED_OFFSETS, BuildConfig

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _cartpole_config(tmp_path: Path, **overrides) -> BuildConfig:
    settings = dict(
        env_id="CartPole-v1",
        medium_return=30.0,
        total_timesteps=768,
        eval_freq=256,
        n_eval_episodes=3,
        num_episodes=3,
        num_ref_episodes=5,
        ppo_n_steps=256,
        ppo_batch_size=64,
        seed=1,
        root=tmp_path / "minari",
        policy_dir=tmp_path / "policies",
        progress=False,
    )
    settings.update(overrides)
    return BuildConfig(**settings)


def _meta(path: Path) -> dict:
    return json.loads((path / "data" / "metadata.json").read_text())


def _random_returns(env_id: str, seed: int, n: int) -> list[float]:
    """Uniform random policy, replicated by hand: action space seeded with `seed`, resets seed + i."""
    env = gym.make(env_id)
    space = gym.spaces.Discrete(2)
    space.seed(seed)
    returns = []
    for i in range(n):
        env.reset(seed=seed + i)
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(space.sample())
            total += reward
            done = terminated or truncated
        returns.append(total)
    return returns


def test_cartpole_ppo_all_kinds(tmp_path: Path) -> None:
    config = _cartpole_config(tmp_path)
    result = build_datasets(config)
    root = config.root
    assert result.dataset_ids["medium"] == "rlt/cartpole/medium-v0"
    loaded = {kind: load_episodes(result.dataset_ids[kind], root=root) for kind in config.kinds}

    # references: measured, equal to a hand replication of the random policy, stored in every dataset
    assert result.ref_scores_source == "measured"
    expected_min = np.mean(_random_returns("CartPole-v1", config.seed + SEED_OFFSETS["ref-random"], 5))
    assert result.ref_min_score == pytest.approx(expected_min, rel=1e-6)
    assert result.ref_max_score > result.ref_min_score
    for kind, (episodes, info) in loaded.items():
        meta = _meta(result.paths[kind])
        assert (meta["ref_min_score"], meta["ref_max_score"]) == (result.ref_min_score, result.ref_max_score)
        assert meta["ref_scores_source"] == "measured" and meta["num_episodes_average_score"] == 5
        assert meta["rlt_build"]["kind"] == kind and kind in meta["description"]
        assert info.env_id == "CartPole-v1" and info.discrete_actions
        assert all(set(np.unique(ep.actions)) <= {0, 1} for ep in episodes)
        assert all(ep.terminations[-1] or ep.truncations[-1] for ep in episodes)
        assert result.mean_returns[kind] == pytest.approx(np.mean([ep.total_return for ep in episodes]))

    # random: seeded resets and actions, as a hand replication gives
    random_eps = loaded["random"].episodes
    seed = config.seed + SEED_OFFSETS["random"]
    assert [ep.seed for ep in random_eps] == [seed, seed + 1, seed + 2]
    assert [ep.total_return for ep in random_eps] == _random_returns("CartPole-v1", seed, 3)

    # medium-expert = medium then expert, episode by episode
    combined = loaded["medium-expert"].episodes
    parts = loaded["medium"].episodes + loaded["expert"].episodes
    assert len(combined) == 6
    for a, b in zip(combined, parts, strict=True):
        np.testing.assert_array_equal(a.observations, b.observations)
        np.testing.assert_array_equal(a.actions, b.actions)
    assert _meta(result.paths["medium-expert"])["combined_datasets"] == [
        "rlt/cartpole/medium-v0",
        "rlt/cartpole/expert-v0",
    ]

    # medium-replay: complete training episodes before the medium checkpoint
    replay = loaded["medium-replay"].episodes
    training = json.loads((config.policy_dir / "training.json").read_text())
    history = training["eval_history"]  # (step, deterministic eval return) every 256 steps
    assert [step for step, _ in history] == [256, 512, 768]
    first = next(i for i, (_, ret) in enumerate(history) if ret >= 30.0)
    assert all(ret < 30.0 for _, ret in history[:first])
    assert (result.medium_step, result.medium_eval_return) == tuple(history[first])
    assert training["medium_step"] == result.medium_step
    assert len(replay) >= 1 and sum(len(ep) for ep in replay) <= result.medium_step

    # medium data sampled from the stochastic policy, not its argmax
    from stable_baselines3 import PPO

    model = PPO.load(result.policies["medium"], device="cpu")
    obs = np.concatenate([ep.observations for ep in loaded["medium"].episodes])
    greedy = model.predict(obs, deterministic=True)[0]
    sampled = np.concatenate([ep.actions for ep in loaded["medium"].episodes])
    assert (greedy != sampled).any()

    # saved policies are reused without training: same policy and seeds give the same data
    reuse = _cartpole_config(
        tmp_path,
        kinds=("medium", "expert"),
        dataset_prefix="reuse/cartpole",
        medium_policy=result.policies["medium"],
        expert_policy=result.policies["expert"],
        ref_min_score=result.ref_min_score,
        ref_max_score=result.ref_max_score,
        policy_dir=tmp_path / "unused",
    )
    reused = build_datasets(reuse)
    assert not reuse.policy_dir.exists() and reused.medium_step is None
    for kind in ("medium", "expert"):
        for a, b in zip(
            load_episodes(reused.dataset_ids[kind], root=root).episodes, loaded[kind].episodes, strict=True
        ):
            np.testing.assert_array_equal(a.actions, b.actions)
    assert "loaded from" in _meta(reused.paths["medium"])["description"]

    # an existing id stops the build before any training
    stamp = (config.policy_dir / "expert.zip").stat().st_mtime_ns
    with pytest.raises(FileExistsError, match=r"rlt/cartpole/random-v0.*--overwrite"):
        build_datasets(config)
    assert (config.policy_dir / "expert.zip").stat().st_mtime_ns == stamp

    # --overwrite rebuilds; the same seed gives the same data
    again = build_datasets(_cartpole_config(tmp_path, overwrite=True))
    for kind in config.kinds:
        reloaded = load_episodes(again.dataset_ids[kind], root=root).episodes
        assert len(reloaded) == len(loaded[kind].episodes)
        for a, b in zip(reloaded, loaded[kind].episodes, strict=True):
            np.testing.assert_array_equal(a.actions, b.actions)
            np.testing.assert_array_equal(a.observations, b.observations)


def test_training_stops_at_medium_when_no_expert_is_needed(tmp_path: Path) -> None:
    """With the references given and no expert kind, the behaviour policy stops at the medium checkpoint."""
    config = _cartpole_config(
        tmp_path,
        kinds=("medium", "medium-replay"),
        ref_min_score=10.0,
        ref_max_score=500.0,
        total_timesteps=2560,
    )
    result = build_datasets(config)
    training = json.loads((config.policy_dir / "training.json").read_text())
    assert training["stopped_at_medium"] is True
    steps = [step for step, _ in training["eval_history"]]
    assert steps[-1] == result.medium_step < config.total_timesteps  # no evaluation after the medium one
    assert all(ret < 30.0 for _, ret in training["eval_history"][:-1])
    assert "expert" not in result.policies and not (config.policy_dir / "expert.zip").exists()
    assert (config.policy_dir / "last.zip").exists()
    replay = load_episodes(result.dataset_ids["medium-replay"], root=config.root).episodes
    assert len(replay) >= 1 and sum(len(ep) for ep in replay) <= result.medium_step


def test_pendulum_sac_replay_and_sampled_actions(tmp_path: Path) -> None:
    config = BuildConfig(
        env_id="Pendulum-v1",
        kinds=("medium", "medium-replay"),
        medium_return=-1e9,  # reached at the first evaluation (step 100)
        total_timesteps=160,
        eval_freq=100,
        n_eval_episodes=1,
        num_episodes=2,
        max_episode_steps=20,
        sac_learning_starts=50,
        ref_min_score=-1500.0,
        ref_max_score=-150.0,
        root=tmp_path / "minari",
        policy_dir=tmp_path / "policies",
        progress=False,
    )
    result = build_datasets(config)
    replay, info = load_episodes("rlt/pendulum/medium-replay-v0", root=config.root)
    assert [len(ep) for ep in replay] == [20] * 5  # the 100 steps before the checkpoint
    assert all(ep.truncations[-1] and not ep.terminations.any() for ep in replay)
    assert isinstance(info.action_space, gym.spaces.Box) and info.eval_env_spec.max_episode_steps == 20
    assert (info.ref_min_score, info.ref_max_score, result.ref_scores_source) == (-1500.0, -150.0, "given")
    medium, _ = load_episodes("rlt/pendulum/medium-v0", root=config.root)
    actions = np.concatenate([ep.actions for ep in medium])
    assert actions.shape == (40, 1) and np.abs(actions).max() <= 2.0
    from stable_baselines3 import SAC

    greedy = SAC.load(result.policies["medium"], device="cpu").predict(
        np.concatenate([ep.observations for ep in medium]), deterministic=True
    )[0]
    assert np.abs(greedy - actions).mean() > 1e-3  # sampled, not the tanh-mean


def test_config_errors(tmp_path: Path) -> None:
    with pytest.raises(
        ValueError, match=r"unknown dataset kind 'medium_replay'.*Did you mean 'medium-replay'"
    ):
        BuildConfig(env_id="Hopper-v5", kinds=("medium_replay",))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"medium_return is required for 'CartPole-v1'"):
        BuildConfig(env_id="CartPole-v1")
    with pytest.raises(ValueError, match="together"):
        BuildConfig(ref_min_score=0.0)
    with pytest.raises(ValueError, match="medium-replay needs the training run"):
        BuildConfig(medium_policy=tmp_path / "m.zip")
    with pytest.raises(ValueError, match="malformed Minari dataset id"):
        BuildConfig(dataset_prefix="bad prefix!")
    # Hopper's default medium level: 1/3 of the way from the D4RL random to expert return
    lo, hi = D4RL_REF_SCORES["hopper"]
    assert BuildConfig().medium_level == pytest.approx(lo + (hi - lo) / 3)
    with pytest.raises(ValueError, match="SAC needs a Box action space"):
        build_datasets(_cartpole_config(tmp_path, algo="sac"))


def test_cli_random_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import tyro

    from offline_data.build_command import main  # rlt make-dataset, scripts/make_dataset.py

    args = ["--env-id", "CartPole-v1", "--kinds", "random", "--num-episodes", "2", "--root", str(tmp_path)]
    args += ["--ref-min-score", "9", "--ref-max-score", "500", "--no-progress", "--dataset-prefix", "cli/cp"]
    main(tyro.cli(BuildConfig, args=args))
    summary = json.loads(capsys.readouterr().out)
    assert summary["datasets"]["random"]["id"] == "cli/cp/random-v0"
    assert summary["ref_scores"] == [9.0, 500.0] and summary["policies"] == {}
    episodes, info = load_episodes("cli/cp/random-v0", root=tmp_path)
    assert len(episodes) == 2 and info.normalized_score(500.0) == pytest.approx(100.0)


def test_hopper_random_with_d4rl_references(tmp_path: Path) -> None:
    pytest.importorskip("mujoco")  # the optional `rl-transformers[mujoco]` extra; beyond it, errors fail
    config = BuildConfig(kinds=("random",), num_episodes=2, root=tmp_path, progress=False)
    result = build_datasets(config)
    episodes, info = load_episodes("rlt/hopper/random-v0", root=tmp_path)
    assert (info.ref_min_score, info.ref_max_score) == tuple(D4RL_REF_SCORES["hopper"])
    assert result.ref_scores_source == "d4rl_table" and info.env_id == "Hopper-v5"
    assert episodes[0].observations.shape[1] == 11 and episodes[0].actions.shape[1] == 3
