"""Decision Transformer trainer: loss falls, seeded determinism, bit-exact resume, checkpoints, evaluation.

Datasets are built here from gymnasium CartPole with scripted policies (a good PD-like controller and a
uniform random one) and written as D4RL-format HDF5 files; nothing is downloaded.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from offline_data import Episode, write_d4rl_hdf5, write_minari_dataset
from rl_transformers.algos.dt import train
from rl_transformers.algos.dt_checkpoint import load_policy
from rl_transformers.algos.dt_config import DTConfig
from rl_transformers.algos.dt_setup import default_return_scale, target_label
from rl_transformers.algos.evaluation import evaluate_dt as evaluate
from rl_transformers.policies.decision_transformer import dt_backbone_config

CARTPOLE_REFS = (20.0, 500.0)


def good_policy(obs: np.ndarray, rng: np.random.Generator) -> int:
    return int(obs[2] + 0.5 * obs[3] > 0)


def random_policy(obs: np.ndarray, rng: np.random.Generator) -> int:
    return int(rng.integers(2))


def collect(
    policy, n: int, seed: int, env_id: str = "CartPole-v1", max_steps: int | None = None
) -> list[Episode]:
    """n episodes of ``policy``; episode i resets with seed + i."""
    env = gym.make(env_id, **({} if max_steps is None else {"max_episode_steps": max_steps}))
    rng = np.random.default_rng(seed)
    episodes = []
    for i in range(n):
        obs, _ = env.reset(seed=seed + i)
        seq, actions, rewards, terms, truncs = [obs], [], [], [], []
        done = False
        while not done:
            action = policy(obs, rng)
            obs, r, terminated, truncated, _ = env.step(action)
            seq.append(obs)
            actions.append(action)
            rewards.append(r)
            terms.append(terminated)
            truncs.append(truncated)
            done = terminated or truncated
        episodes.append(
            Episode.from_observation_sequence(
                np.array(seq),
                np.array(actions),
                np.array(rewards),
                np.array(terms),
                np.array(truncs),
                seed=seed + i,
            )
        )
    env.close()
    return episodes


def cartpole_dataset(
    path: Path, n_good: int = 3, n_random: int = 20, max_steps: int = 100, seed: int = 0
) -> Path:
    """A CartPole-v1 D4RL file (time limit ``max_steps``) from a good and a random policy, with ref scores."""
    episodes = collect(good_policy, n_good, seed, max_steps=max_steps)
    episodes += collect(random_policy, n_random, seed + 1000, max_steps=max_steps)
    meta = {"env_id": "CartPole-v1", "ref_min_score": CARTPOLE_REFS[0], "ref_max_score": CARTPOLE_REFS[1]}
    return write_d4rl_hdf5(path, episodes, metadata=meta, overwrite=True)


def tiny_config(dataset: Path, tmp_path: Path, **overrides) -> DTConfig:
    base = dict(
        dataset=str(dataset),
        backbone=dt_backbone_config(d_model=16, n_layers=1, n_heads=2),
        context_len=4,
        total_steps=8,
        batch_size=8,
        warmup_steps=4,
        learning_rate=1e-3,
        log_every=1,
        eval_every=4,
        eval_episodes=1,
        eval_envs=1,
        save_every=100,
        keep_checkpoints=10,
        run_root=tmp_path / "runs",
        progress=False,
        seed=0,
    )
    base.update(overrides)
    return DTConfig(**base)


def progress_rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cartpole_dataset(tmp_path_factory.mktemp("data") / "cartpole.hdf5")


def test_training_loss_falls(tmp_path: Path) -> None:
    """Mostly good-controller data: its action is a function of the state, so the loss must fall well below ln 2."""
    dataset = cartpole_dataset(tmp_path / "good.hdf5", n_good=4, n_random=2)
    config = tiny_config(
        dataset, tmp_path, total_steps=150, batch_size=16, log_every=25, eval_every=0, eval_episodes=0
    )
    result = train(config)
    losses = [r["train/loss"] for r in progress_rows(result.run_dir) if "train/loss" in r]
    assert len(losses) == 6
    assert losses[0] > 0.6 and losses[-1] < 0.6 * losses[0], (
        losses
    )  # cross-entropy of 2 actions starts near ln 2


def test_two_seeded_runs_are_identical(dataset: Path, tmp_path: Path) -> None:
    a = train(tiny_config(dataset, tmp_path / "a"))
    b = train(tiny_config(dataset, tmp_path / "b"))
    assert progress_rows(a.run_dir) == progress_rows(b.run_dir)
    for (name, pa), pb in zip(a.model.state_dict().items(), b.model.state_dict().values()):
        assert torch.equal(pa, pb), name
    c = train(tiny_config(dataset, tmp_path / "c", seed=1))
    assert progress_rows(c.run_dir) != progress_rows(a.run_dir)


def test_resume_continues_bit_exactly(dataset: Path, tmp_path: Path) -> None:
    """Stop after update 4 (a checkpoint), resume to 8: same weights, optimizer and logged losses."""
    full = train(tiny_config(dataset, tmp_path / "full", save_every=4))
    copy = tmp_path / "copy"
    shutil.copytree(full.run_dir, copy)
    for name in ("step_8.pt", "last.pt", "best.pt", "index.json"):
        (copy / "checkpoints" / name).unlink(missing_ok=True)
    resumed = train(
        tiny_config(dataset, tmp_path / "full", total_steps=8, resume=copy / "checkpoints" / "step_4.pt")
    )
    assert resumed.run_dir == copy and resumed.step == 8
    for (name, pa), pb in zip(full.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(pa, pb), name
    assert progress_rows(copy) == progress_rows(full.run_dir)
    opt_full = torch.load(full.run_dir / "checkpoints" / "step_8.pt", weights_only=True)["optimizer"]
    opt_res = torch.load(copy / "checkpoints" / "step_8.pt", weights_only=True)["optimizer"]
    for sa, sb in zip(opt_full["state"].values(), opt_res["state"].values()):
        assert torch.equal(sa["exp_avg"], sb["exp_avg"]) and torch.equal(sa["exp_avg_sq"], sb["exp_avg_sq"])


def test_resume_runs_the_evaluation_a_kill_cut_short(dataset: Path, tmp_path: Path) -> None:
    """The checkpoint of an evaluation step is written before the evaluation: a run killed between the two (no
    evaluation file, no logged row of that step) and resumed there evaluates that step first, with the result the
    uninterrupted run had."""
    full = train(tiny_config(dataset, tmp_path / "full", total_steps=6, eval_every=2, eval_episodes=2))
    copy = tmp_path / "copy"
    shutil.copytree(full.run_dir, copy)
    for name in ("step_6.pt", "last.pt", "best.pt", "index.json"):
        (copy / "checkpoints" / name).unlink(missing_ok=True)
    for step in (4, 6):
        (copy / "eval" / f"step_{step}.json").unlink()
    rows = [r for r in map(json.loads, (copy / "progress.jsonl").read_text().splitlines()) if r["step"] < 4]
    (copy / "progress.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))  # nor its logged row
    resumed = train(
        tiny_config(
            dataset, tmp_path / "full", total_steps=6, eval_every=2, eval_episodes=2,
            resume=copy / "checkpoints" / "step_4.pt",
        )
    )  # fmt: skip
    assert sorted(resumed.evaluations) == [4, 6]
    for step in (2, 4, 6):
        assert (copy / "eval" / f"step_{step}.json").read_text() == (
            full.run_dir / "eval" / f"step_{step}.json"
        ).read_text()


def test_checkpoints_best_and_last_and_eval_logs(dataset: Path, tmp_path: Path) -> None:
    config = tiny_config(
        dataset, tmp_path, total_steps=6, eval_every=2, eval_episodes=2, target_returns=(100.0, 10.0)
    )
    result = train(config)
    run = result.run_dir
    assert run.parent.parent.name == "dt" and run.parent.name == "cartpole" and run.name.endswith("-s0")
    index = json.loads((run / "checkpoints" / "index.json").read_text())
    values = {s: v["eval/return_mean"] for s, v in result.evaluations.items()}
    assert sorted(values) == [2, 4, 6]
    best_step = max(values, key=lambda s: (values[s], -s))
    assert index["last"]["step"] == 6 and index["best"]["step"] == best_step
    assert index["best"]["metric_value"] == values[best_step]
    best = torch.load(run / "checkpoints" / "best.pt", weights_only=True)
    assert best["step"] == best_step and best["checkpoint_meta"]["metric"] == "eval/return_mean"
    # eval tags for both targets; normalized score from the dataset's references
    last = result.evaluations[6]
    for target in (100.0, 10.0):
        ret = last[f"eval/return_mean{target_label(target)}"]
        norm = last[f"eval/normalized_score{target_label(target)}"]
        assert norm == pytest.approx(100 * (ret - CARTPOLE_REFS[0]) / (CARTPOLE_REFS[1] - CARTPOLE_REFS[0]))
    assert last["eval/return_mean"] == last["eval/return_mean@100"]
    episodes = json.loads((run / "eval" / "step_6.json").read_text())["episodes"]
    assert [e["target"] for e in episodes] == [100.0, 10.0] and len(episodes[0]["returns"]) == 2
    # the checkpoint alone rebuilds the policy (normalisation included)
    policy = load_policy(run)
    assert torch.equal(policy.state_mean, result.model.state_mean.cpu())
    assert policy.return_scale == pytest.approx(0.01)  # CartPole-100: max return ~100 -> 1/100
    assert json.loads((run / "config.json").read_text())["context_len"] == 4


def test_evaluate_uses_fixed_seeds_and_targets(dataset: Path, tmp_path: Path) -> None:
    result = train(tiny_config(dataset, tmp_path, total_steps=2, eval_episodes=0))
    make = lambda: gym.make("CartPole-v1", max_episode_steps=50)  # noqa: E731
    r1 = evaluate(result.model, make, [50.0, 5.0], n_episodes=3, seed=123, num_envs=2)
    r2 = evaluate(result.model, make, [50.0, 5.0], n_episodes=3, seed=123, num_envs=3)
    for a, b in zip(r1, r2):
        assert a.target == b.target and a.returns.tolist() == b.returns.tolist()
        assert (a.lengths <= 50).all() and a.returns.tolist() == a.lengths.astype(float).tolist()


def test_eval_seeds_used_by_the_data_are_refused(tmp_path: Path) -> None:
    """A Minari dataset records its reset seeds: evaluation seeds that collide are refused."""
    episodes = collect(random_policy, 3, 1_000_000, max_steps=30)
    root = tmp_path / "minari"
    write_minari_dataset("test/cartpole/clash-v0", episodes, env="CartPole-v1", root=root)
    config = tiny_config(Path("test/cartpole/clash-v0"), tmp_path, dataset_root=root)
    with pytest.raises(ValueError, match="eval-seed"):
        train(config)
    train(dataclasses.replace(config, eval_seed=2_000_000, total_steps=1))  # disjoint seeds are fine


def test_default_return_scale() -> None:
    assert default_return_scale(np.array([3000.0, 100.0]), "Hopper-v5") == 1e-3
    assert default_return_scale(np.array([12000.0]), "rlt/halfcheetah/medium-v0") == 1e-3
    assert default_return_scale(np.array([500.0, 9.0]), "CartPole-v1") == 1e-2
    assert default_return_scale(np.array([-1500.0, -150.0]), "Pendulum-v1") == 1e-3
    assert default_return_scale(np.array([0.5]), None) == 1.0


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="algo"):
        DTConfig(dataset="x", algo="cql")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="bc_top_fraction"):
        DTConfig(dataset="x", bc_top_fraction=0.0)
    with pytest.raises(ValueError, match="causal"):
        DTConfig(dataset="x", backbone=dt_backbone_config(causal=False))


def test_continuous_actions_train_and_evaluate(tmp_path: Path) -> None:
    """Pendulum (Box actions in [-2, 2]): masked-MSE training and rollouts run end to end."""
    rng = np.random.default_rng(0)
    env = gym.make("Pendulum-v1", max_episode_steps=30)
    episodes = []
    for i in range(4):
        obs, _ = env.reset(seed=i)
        seq, acts, rews = [obs], [], []
        for _ in range(30):
            a = np.clip(-2.0 * obs[2:3] + 0.3 * rng.normal(size=1), -2, 2).astype(np.float32)
            obs, r, *_ = env.step(a)
            seq.append(obs)
            acts.append(a)
            rews.append(r)
        flags = np.zeros(30, bool)
        flags[-1] = True
        episodes.append(
            Episode.from_observation_sequence(
                np.array(seq), np.array(acts), np.array(rews), np.zeros(30, bool), flags
            )
        )
    env.close()
    path = write_d4rl_hdf5(tmp_path / "pendulum.hdf5", episodes, metadata={"env_id": "Pendulum-v1"})
    result = train(
        tiny_config(
            path, tmp_path, total_steps=40, log_every=10, eval_every=0, eval_episodes=1, learning_rate=3e-3
        )
    )
    losses = [r["train/loss"] for r in progress_rows(result.run_dir) if "train/loss" in r]
    assert losses[-1] < losses[0]
    assert result.model.squash and float(result.model.action_high) == 2.0
    assert np.isfinite(result.evaluations[40]["eval/return_mean"])


class _EvalBoom(gym.Wrapper):
    """CartPole whose evaluation resets (seeds >= DTConfig.eval_seed) raise."""

    def reset(self, *, seed=None, options=None):
        if seed is not None and seed >= 1_000_000:
            raise RuntimeError("evaluation env broke")
        return self.env.reset(seed=seed, options=options)


def _make_eval_boom(**kwargs) -> gym.Env:
    return _EvalBoom(gym.make("CartPole-v1", max_episode_steps=100, **kwargs))


def test_saves_before_an_evaluation_error(dataset: Path, tmp_path: Path) -> None:
    """An evaluation that raises loses no training: the checkpoint of that step is already written."""
    env_id = "rlt_test/CartPoleEvalBoom-v0"
    if env_id not in gym.registry:
        gym.register(env_id, entry_point=_make_eval_boom)
    with pytest.raises(RuntimeError, match="evaluation env broke"):
        train(tiny_config(dataset, tmp_path, env_id=env_id, total_steps=8, eval_every=4))
    last = next(tmp_path.glob("runs/dt/*/*/checkpoints/last.pt"))
    assert torch.load(last, weights_only=True)["step"] == 4


def test_eval_scalars_tags_by_hand() -> None:
    """Per-target tags, the first target without suffix and under PPO's eval tags, normalised scores from the
    references; BC (target None) has no suffix."""
    from types import SimpleNamespace

    from rl_transformers.algos.dt_logging import eval_scalars
    from rl_transformers.algos.evaluation import EvalResult

    info = SimpleNamespace(
        ref_min_score=0.0, ref_max_score=10.0, normalized_score=lambda r: 100 * (np.asarray(r) - 0.0) / 10.0
    )
    results = [
        EvalResult(100.0, np.array([1.0, 3.0]), np.array([5, 7])),
        EvalResult(10.0, np.array([4.0, 4.0]), np.array([2, 2])),
    ]
    got = eval_scalars(results, info)
    assert got == {
        "eval/return_mean@100": 2.0,
        "eval/return_std@100": 1.0,
        "eval/ep_length_mean@100": 6.0,
        "eval/normalized_score@100": 20.0,
        "eval/normalized_score": 20.0,
        "eval/return_mean": 2.0,
        "eval/mean_reward": 2.0,
        "eval/mean_ep_length": 6.0,
        "eval/return_mean@10": 4.0,
        "eval/return_std@10": 0.0,
        "eval/ep_length_mean@10": 2.0,
        "eval/normalized_score@10": 40.0,
    }
    no_refs = SimpleNamespace(ref_min_score=None, ref_max_score=None)
    bc = eval_scalars([EvalResult(None, np.array([6.0]), np.array([3]))], no_refs)
    assert bc == {
        "eval/return_mean": 6.0,
        "eval/return_std": 0.0,
        "eval/ep_length_mean": 3.0,
        "eval/mean_reward": 6.0,
        "eval/mean_ep_length": 3.0,
    }


def test_success_rate_from_episode_flags() -> None:
    """``eval/success_rate`` is the share of episodes whose last info says success (SB3's ``is_success`` first,
    else ``success``); an episode without a flag counts as a failure; no flag at all logs no rate."""
    from types import SimpleNamespace

    from rl_transformers.algos.dt_logging import eval_scalars
    from rl_transformers.algos.evaluation import EvalResult, success_flag

    assert success_flag({"is_success": True, "success": False}) == 1.0
    assert success_flag({"success": np.bool_(False)}) == 0.0
    assert np.isnan(success_flag({"TimeLimit.truncated": True}))
    no_refs = SimpleNamespace(ref_min_score=None, ref_max_score=None)
    flags = np.array([1.0, np.nan, 0.0, 1.0])
    got = eval_scalars([EvalResult(1.0, np.zeros(4), np.ones(4, dtype=np.int64), flags)], no_refs)
    assert got["eval/success_rate@1"] == 0.5 and got["eval/success_rate"] == 0.5
    assert "eval/success_rate" not in eval_scalars([EvalResult(1.0, np.zeros(2), np.ones(2))], no_refs)


def test_cosine_decay_is_the_logged_rate_and_resumes(dataset: Path, tmp_path: Path) -> None:
    """lr_decay='cosine': the logged rate follows warm-up then cosine to 0; a resume continues it bit-exactly."""
    import math

    config = tiny_config(dataset, tmp_path / "full", lr_decay="cosine", eval_every=0, save_every=4)
    full = train(config)
    rates = [r["train/learning_rate"] for r in progress_rows(full.run_dir) if "train/learning_rate" in r]
    factors = [
        min((s + 1) / 4, 1.0) if s < 4 else 0.5 * (1 + math.cos(math.pi * (s - 4) / 4)) for s in range(8)
    ]
    assert len(rates) == 8
    # each row logs the rate the next update will use: factors of steps 1..8 (0 at the end)
    assert rates == pytest.approx([1e-3 * f for f in factors[1:]] + [0.0], abs=1e-12)
    copy = tmp_path / "copy"
    shutil.copytree(full.run_dir, copy)
    for name in ("step_8.pt", "last.pt", "best.pt", "index.json"):
        (copy / "checkpoints" / name).unlink(missing_ok=True)
    resumed = train(dataclasses.replace(config, resume=copy / "checkpoints" / "step_4.pt"))
    for (name, pa), pb in zip(full.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(pa, pb), name
