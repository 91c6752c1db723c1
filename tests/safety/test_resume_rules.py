"""The --resume rules (rl_transformers/runs/resume.py): frozen flags refused with their saved values, mutable
flags applied (also when they equal the class default), a raised budget keeps the learning rate continuous,
and every trainer saves before it evaluates."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from rl_transformers.algos.dt_config import RESUME_MUTABLE as DT_MUTABLE
from rl_transformers.algos.dt_config import DTConfig
from rl_transformers.algos.ppo import train
from rl_transformers.algos.ppo_config import RESUME_PER_INVOCATION, PPOConfig, TrainConfig
from rl_transformers.policies import PolicyConfig, gtrxl_backbone
from rl_transformers.runs.checkpoint import atomic_save
from rl_transformers.runs.checkpoint_load import read_checkpoint
from rl_transformers.runs.resume import ResumeRefused, merge_resume, parse_cli
from rl_transformers.utils import NonFiniteError
from rl_transformers.utils.config_json import to_jsonable

BATCH = 2 * 16
LR = 1e-3


def tiny(root: Path, updates: int = 4, **kw) -> TrainConfig:
    return TrainConfig(
        env_id=kw.pop("env_id", "rlt/TMazeShort-v0"),
        total_timesteps=updates * BATCH,
        num_envs=2,
        seed=3,
        policy=PolicyConfig(backbone=gtrxl_backbone(16, 1, 2, mem_len=8)),
        ppo=PPOConfig(num_steps=16, seq_len=8, num_minibatches=2, update_epochs=1, learning_rate=LR),
        run_root=str(root),
        progress=False,
        **kw,
    )


def fake_checkpoint(tmp_path: Path, cfg) -> Path:
    """A file holding only a config: enough for the parsing / merging rules."""
    return atomic_save({"config": to_jsonable(cfg)}, tmp_path / "run" / "checkpoints" / "last.pt")


def parse(path: Path, *flags: str) -> TrainConfig:
    return parse_cli(TrainConfig, per_invocation=RESUME_PER_INVOCATION, argv=["--resume", str(path), *flags])


def merged(saved: TrainConfig, given: TrainConfig) -> TrainConfig:
    from rl_transformers.algos.ppo_config import resume_config

    return resume_config(saved, given, source="RUN")


def test_untyped_flags_keep_the_saved_values(tmp_path: Path) -> None:
    saved = tiny(tmp_path, env_id="rlt/RepeatPreviousMulti-v0", eval_every=64)
    given = parse(fake_checkpoint(tmp_path, saved))
    assert merged(saved, given) == dataclasses.replace(saved, resume=given.resume)


def test_frozen_flags_are_refused_with_saved_values(tmp_path: Path) -> None:
    saved = tiny(tmp_path)
    path = fake_checkpoint(tmp_path, saved)
    flags = ["--env-id", "CartPole-v1", "--seed", "1", "--num-envs", "4", "--ppo.learning-rate", "0.1"]
    flags += ["--policy", "lstm", "--backbone.d-model", "32", "--total-timesteps", "999"]
    with pytest.raises(ResumeRefused) as info:
        merged(saved, parse(path, *flags))
    message = str(info.value)
    for part in (
        "--env-id (saved: 'rlt/TMazeShort-v0', given: 'CartPole-v1')",
        "--seed (saved: 3, given: 1)",  # 1 is the class default: still seen as given
        "--num-envs (saved: 2, given: 4)",
        f"--ppo.learning-rate (saved: {LR!r}, given: 0.1)",
        "--policy (saved: 'transformer', given: 'lstm')",
        "--backbone.d-model (saved: 16, given: 32)",
    ):
        assert part in message, part
    assert "--total-timesteps (" not in message  # mutable: not refused
    assert message.startswith("--resume RUN:")


def test_mutable_flags_apply_even_at_their_default(tmp_path: Path) -> None:
    saved = tiny(tmp_path, eval_every=64, save_every=32)
    path = fake_checkpoint(tmp_path, saved)
    out = merged(
        saved, parse(path, "--eval-every", "0", "--total-timesteps", "999", "--keep-checkpoints", "1")
    )
    assert (out.eval_every, out.total_timesteps, out.keep_checkpoints, out.save_every) == (0, 999, 1, 32)


def test_dt_rules() -> None:
    saved = DTConfig(dataset="data.hdf5", total_steps=10, eval_every=5)
    with pytest.raises(ResumeRefused, match=r"--learning-rate \(saved: 0.0001, given: 0.5\)"):
        merge_resume(
            saved,
            dataclasses.replace(saved, learning_rate=0.5),
            mutable=DT_MUTABLE,
            per_invocation=(),
            source="R",
        )
    given = dataclasses.replace(saved, total_steps=20, target_returns=(100.0,), eval_every=0)
    out = merge_resume(saved, given, mutable=DT_MUTABLE, per_invocation=(), source="R")
    assert (out.total_steps, out.target_returns, out.eval_every) == (20, (100.0,), 0)


def lrs(run_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]
    return [r["train/learning_rate"] for r in rows]


def test_raised_budget_keeps_the_learning_rate_continuous(tmp_path: Path) -> None:
    """4-update budget stopped after 2, resumed with 8: lr(u) = lr_2 (1 - (u - 2) / 6) with lr_2 = LR / 2."""
    first = train(tiny(tmp_path, updates=4), callback=lambda tr: tr.update < 2)
    resumed = train(dataclasses.replace(tiny(tmp_path, updates=8), resume=str(first.run_dir)))
    assert resumed.step == 8 * BATCH
    expected = [LR * (1 - u / 4) for u in range(2)] + [LR / 2 * (1 - (u - 2) / 6) for u in range(2, 8)]
    np.testing.assert_allclose(lrs(first.run_dir), expected, rtol=1e-12)
    assert all(a > b for a, b in itertools.pairwise(lrs(first.run_dir)))  # decreasing: no jump back up
    # a second resume keeps the anchor (no re-anchoring when the budget stays)
    ckpt = read_checkpoint(first.run_dir / "checkpoints" / "last.pt")
    assert ckpt["lr_anchor"] == {"update": 2, "lr": pytest.approx(LR / 2)} and ckpt["num_updates"] == 8


def test_allowed_flags_apply_on_resume(tmp_path: Path) -> None:
    first = train(tiny(tmp_path, updates=2, eval_final=False))  # no evaluation before the resume
    resumed = train(
        dataclasses.replace(
            tiny(tmp_path, updates=3, eval_every=BATCH, eval_episodes=1), resume=str(first.run_dir)
        )
    )
    rows = [json.loads(line) for line in (first.run_dir / "progress.jsonl").read_text().splitlines()]
    assert resumed.step == 3 * BATCH and "eval/mean_reward" in rows[-1]
    index = json.loads((first.run_dir / "checkpoints" / "index.json").read_text())
    assert index["best"]["step"] == 3 * BATCH  # the evaluation was attached to the checkpoint saved before it


# -- environments that misbehave --------------------------------------------------------------------------------
class EvalBoom(gym.Wrapper):
    """TMazeShort whose evaluation resets (seeds >= 100_000, see PPOTrainer.evaluate) raise."""

    def reset(self, *, seed=None, options=None):
        if seed is not None and seed >= 100_000:
            raise RuntimeError("evaluation env broke")
        return self.env.reset(seed=seed, options=options)


class NaNObs(gym.Wrapper):
    """TMazeShort returning a NaN observation at its 5th step."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.t = 0

    def step(self, action):
        obs, r, term, trunc, info = self.env.step(action)
        self.t += 1
        if self.t == 5:
            obs = np.full_like(obs, np.nan, dtype=np.float32)
        return obs, r, term, trunc, info


def make_eval_boom(**kwargs) -> gym.Env:
    return EvalBoom(gym.make("rlt/TMazeShort-v0", **kwargs))


def make_nan_obs(**kwargs) -> gym.Env:
    return NaNObs(gym.make("rlt/TMazeShort-v0", **kwargs))


def _register(name: str, entry_point) -> str:
    from rl_transformers.algos.env_util import make_env_thunk

    make_env_thunk("rlt/TMazeShort-v0")  # registers the rlt/ tasks
    env_id = f"rlt_test/{name}-v0"
    if env_id not in gym.registry:
        gym.register(env_id, entry_point=entry_point)
    return env_id


def test_ppo_saves_before_an_evaluation_error(tmp_path: Path) -> None:
    env_id = _register("EvalBoom", make_eval_boom)
    with pytest.raises(RuntimeError, match="evaluation env broke"):
        train(tiny(tmp_path, updates=2, env_id=env_id, eval_every=2 * BATCH))
    last = next(tmp_path.glob("ppo/*/*/checkpoints/last.pt"))
    assert read_checkpoint(last)["global_step"] == 2 * BATCH  # the training before the evaluation is kept


def test_nonfinite_observation_is_blamed_on_the_env(tmp_path: Path) -> None:
    env_id = _register("NaNObs", make_nan_obs)
    with pytest.raises(NonFiniteError) as info:
        train(tiny(tmp_path, updates=2, env_id=env_id))
    message = str(info.value)
    assert env_id in message and "env index 0 (of 2; also [1])" in message and "rollout step 4" in message
    assert "non-finite observation" in message and "loss" not in message.split(";")[0]
