"""``--allow-env-modules``: every trainer, ``scripts/evaluate.py`` and ``rl_transformers.load`` refuse an env whose
module is outside the allow-list, and accept it once the module is named with the flag.

Each test writes a fresh module into ``tmp_path`` (on ``sys.path``) that touches a marker file when imported and
registers a small env. Refusals must name the flag and leave the marker absent (the module was never imported);
with the flag the same call trains / evaluates and the marker exists. The allow-list is never read from a saved
config: a checkpoint whose config names the module grants nothing.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from envs.resolve import ALLOW_FLAG
from offline_data import Episode, write_d4rl_hdf5
from rl_transformers.agents import load
from rl_transformers.agents.evaluate import evaluate_agent
from rl_transformers.algos.dt_config import RESUME_PER_INVOCATION as DT_PER_INVOCATION
from rl_transformers.algos.dt_config import DTConfig
from rl_transformers.algos.ppo_config import RESUME_PER_INVOCATION as PPO_PER_INVOCATION
from rl_transformers.algos.ppo_config import PPOConfig, TrainConfig
from rl_transformers.policies import PolicyConfig, gtrxl_backbone
from rl_transformers.policies.decision_transformer import dt_backbone_config
from rl_transformers.runs.config import RunConfig
from rl_transformers.utils.errors import UserError

REPO = Path(__file__).resolve().parents[2]
BATCH = 2 * 16  # PPO env steps per update: num_envs x num_steps
REFUSED = rf"refused env spec .*{ALLOW_FLAG}"

MODULE = '''
import pathlib

import gymnasium as gym
import numpy as np

pathlib.Path({marker!r}).touch()  # the side effect a refused module must never get to run


class MarkerEnv(gym.Env):
    """Two random numbers in, reward 1 for action 1: enough for PPO and DT to run."""

    metadata = {{"render_modes": []}}

    def __init__(self):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._obs(), {{}}

    def step(self, action):
        return self._obs(), float(action), False, False, {{}}

    def _obs(self):
        return self.np_random.uniform(-1.0, 1.0, 2).astype(np.float32)


gym.register(id={env_id!r}, entry_point=__name__ + ":MarkerEnv", max_episode_steps=8)
'''


@dataclasses.dataclass
class MarkerModule:
    name: str
    """The module's name (what --allow-env-modules takes)."""
    env_id: str
    """The id the module registers when imported."""
    marker: Path
    """Created when the module is imported."""
    root: Path
    """The directory holding the module (on sys.path)."""

    @property
    def prefixed_id(self) -> str:
        """``module:id``: gymnasium would import the module to find the id."""
        return f"{self.name}:{self.env_id}"

    @property
    def entry_point(self) -> str:
        return f"{self.name}:MarkerEnv"


@pytest.fixture
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MarkerModule]:
    tag = uuid.uuid4().hex[:10]
    found = MarkerModule(f"rlt_allow_{tag}", f"RltAllow{tag}-v0", tmp_path / "marker", tmp_path / "mod")
    found.root.mkdir()
    text = MODULE.format(marker=str(found.marker), env_id=found.env_id)
    (found.root / f"{found.name}.py").write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(found.root))
    yield found
    forget(found)


def forget(module: MarkerModule) -> None:
    """Undo the module's import (as in a fresh process): unregister its env, drop it, remove the marker."""
    sys.modules.pop(module.name, None)
    gym.registry.pop(module.env_id, None)
    module.marker.unlink(missing_ok=True)


def ppo_config(root: Path, env_id: str, **kw: object) -> TrainConfig:
    return TrainConfig(
        env_id=env_id,
        total_timesteps=2 * BATCH,
        num_envs=2,
        seed=3,
        policy=PolicyConfig(backbone=gtrxl_backbone(16, 1, 2, mem_len=8)),
        ppo=PPOConfig(num_steps=16, seq_len=8, num_minibatches=2, update_epochs=1),
        run_root=root,
        progress=False,
        **kw,
    )


def marker_dataset(path: Path, spec: dict | None, n: int = 6) -> Path:
    """A D4RL file of MarkerEnv-shaped episodes (8 steps, Discrete(2) actions) whose metadata names ``spec``."""
    rng = np.random.default_rng(0)
    episodes = []
    for _ in range(n):
        actions = rng.integers(0, 2, 8)
        episodes.append(
            Episode.from_observation_sequence(
                rng.uniform(-1, 1, (9, 2)).astype(np.float32),
                actions,
                actions.astype(np.float64),
                np.zeros(8, bool),
                np.r_[np.zeros(7, bool), True],
            )
        )
    meta = {} if spec is None else {"env_spec": json.dumps(spec)}
    return write_d4rl_hdf5(path, episodes, metadata=meta, overwrite=True)


def dt_config(root: Path, dataset: Path, **kw: object) -> DTConfig:
    base = dict(
        dataset=str(dataset),
        backbone=dt_backbone_config(d_model=16, n_layers=1, n_heads=2),
        context_len=4,
        total_steps=4,
        batch_size=8,
        warmup_steps=2,
        log_every=2,
        eval_every=4,
        eval_episodes=2,
        eval_envs=1,
        target_returns=(8.0,),
        run_root=root,
        progress=False,
        seed=3,
    )
    return DTConfig(**(base | kw))


def rewrite_config(checkpoint: Path, **changes: object) -> None:
    """Put ``changes`` into the config a checkpoint stores (as a crafted file would)."""
    ckpt = torch.load(checkpoint, weights_only=True)
    ckpt["config"].update(changes)
    torch.save(ckpt, checkpoint)


# -- the field ------------------------------------------------------------------------------------------------
def test_every_run_config_has_the_field_and_no_saved_config_grants_it() -> None:
    names = {f.name for f in dataclasses.fields(RunConfig)}
    assert "allow_env_modules" in names and ALLOW_FLAG == "--allow-env-modules"
    assert TrainConfig(allow_env_modules=["a.b"]).allow_env_modules == ("a.b",)  # type: ignore[arg-type]
    assert DTConfig(dataset="x", allow_env_modules=("pkg",)).allow_env_modules == ("pkg",)
    assert "allow_env_modules" in PPO_PER_INVOCATION and "allow_env_modules" in DT_PER_INVOCATION
    with pytest.raises(UserError, match=r"--allow-env-modules: 'os system' is not a dotted module name"):
        TrainConfig(allow_env_modules=("os system",))


# -- PPO ------------------------------------------------------------------------------------------------------
def test_ppo_training_refuses_then_accepts_the_module(tmp_path: Path, module: MarkerModule) -> None:
    from rl_transformers.algos.ppo import train

    cfg = ppo_config(tmp_path / "runs", module.prefixed_id, eval_every=BATCH, eval_episodes=2)
    with pytest.raises(UserError, match=REFUSED) as info:
        train(cfg)
    assert module.name in str(info.value) and "--env-id" in str(info.value)
    assert not module.marker.exists() and not (tmp_path / "runs").exists()

    result = train(dataclasses.replace(cfg, allow_env_modules=(module.name,)))
    assert module.marker.exists() and result.step == 2 * BATCH
    assert set(result.evaluations) == {
        BATCH,
        2 * BATCH,
    }  # the evaluation envs come through the allow-list too
    saved = json.loads((result.run_dir / "config.json").read_text())
    last = result.run_dir / "checkpoints" / "last.pt"
    assert (
        saved["allow_env_modules"] == [] == torch.load(last, weights_only=True)["config"]["allow_env_modules"]
    )

    # a checkpoint whose config names the module grants nothing: the resume needs the flag again
    rewrite_config(last, allow_env_modules=[module.name])
    more = dataclasses.replace(cfg, resume=result.run_dir, total_timesteps=3 * BATCH)
    with pytest.raises(UserError, match=REFUSED):
        train(more)
    resumed = train(dataclasses.replace(more, allow_env_modules=(module.name,)))
    assert resumed.step == 3 * BATCH and resumed.run_dir == result.run_dir


# -- DT -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("named_by", ["dataset", "env_id"])
def test_dt_training_refuses_then_accepts_the_module(
    tmp_path: Path, module: MarkerModule, named_by: str
) -> None:
    """The env comes from the dataset's stored spec (entry point in the module) or from --env-id module:id."""
    from rl_transformers.algos.dt import train

    if named_by == "dataset":
        spec = {"id": module.env_id, "entry_point": module.entry_point, "max_episode_steps": 8}
        cfg = dt_config(tmp_path / "runs", marker_dataset(tmp_path / "data.hdf5", spec))
    else:
        dataset = marker_dataset(tmp_path / "data.hdf5", None)
        cfg = dt_config(tmp_path / "runs", dataset, env_id=module.prefixed_id)
    with pytest.raises(UserError, match=REFUSED) as info:
        train(cfg)
    source = "data.hdf5" if named_by == "dataset" else "--env-id"
    assert source in str(info.value) and module.name in str(info.value)
    assert not module.marker.exists() and not (tmp_path / "runs").exists()

    result = train(dataclasses.replace(cfg, allow_env_modules=(module.name,)))
    assert module.marker.exists() and result.step == 4
    final = result.evaluations[4]
    assert final["eval/return_mean"] == final["eval/mean_reward"] == final["eval/return_mean@8"]
    assert final["eval/mean_ep_length"] == 8.0  # the module's env (time limit 8) was evaluated
    last = result.run_dir / "checkpoints" / "last.pt"
    assert torch.load(last, weights_only=True)["config"]["allow_env_modules"] == []


# -- rl_transformers.load and scripts/evaluate.py -------------------------------------------------------------
def test_load_and_evaluate_need_the_flag(tmp_path: Path, module: MarkerModule) -> None:
    from rl_transformers.algos.dt import train as train_dt
    from rl_transformers.algos.ppo import train as train_ppo

    allowed = (module.name,)
    ppo_run = train_ppo(ppo_config(tmp_path / "runs", module.prefixed_id, allow_env_modules=allowed)).run_dir
    spec = {"id": module.env_id, "entry_point": module.entry_point, "max_episode_steps": 8}
    dataset = marker_dataset(tmp_path / "data.hdf5", spec)
    dt_run = train_dt(dt_config(tmp_path / "runs", dataset, allow_env_modules=allowed)).run_dir
    # a crafted config naming the module does not authorise it either
    rewrite_config(ppo_run / "checkpoints" / "last.pt", allow_env_modules=[module.name])

    forget(module)  # as a new process: an env registered by the module's import would be trusted (resolve.py)
    with pytest.raises(UserError, match=REFUSED):
        load(ppo_run)
    dt_agent = load(dt_run)  # the model loads; its env is built when evaluating
    with pytest.raises(UserError, match=REFUSED):
        evaluate_agent(dt_agent, episodes=2)
    assert not module.marker.exists()

    ppo_agent = load(ppo_run, allow_env_modules=allowed)
    assert ppo_agent.config.allow_env_modules == allowed
    report = evaluate_agent(ppo_agent, episodes=2, num_envs=1)
    assert report.env_id == module.prefixed_id and len(report.results[0].returns) == 2
    assert module.marker.exists()
    report = evaluate_agent(load(dt_run, allow_env_modules=allowed), episodes=2)
    assert report.results[0].target == 8.0 and report.results[0].lengths == [8, 8]


def test_evaluate_script_flag(tmp_path: Path, module: MarkerModule) -> None:
    """The CLI: refused without the flag (exit 2, message naming it, module not imported), runs with it."""
    from rl_transformers.algos.ppo import train

    cfg = ppo_config(tmp_path / "runs", module.prefixed_id, allow_env_modules=(module.name,))
    run_dir = train(cfg).run_dir
    module.marker.unlink()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(module.root), str(REPO)])}
    base = [sys.executable, str(REPO / "scripts" / "evaluate.py"), str(run_dir), "--episodes", "2"]
    refused = subprocess.run(base, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.startswith("error: refused env spec") and ALLOW_FLAG in refused.stderr
    assert "Traceback" not in refused.stderr and not module.marker.exists()
    ok = subprocess.run(
        [*base, ALLOW_FLAG, module.name], capture_output=True, text=True, env=env, cwd=REPO, timeout=300
    )
    assert ok.returncode == 0, ok.stderr
    assert "over 2 episodes" in ok.stdout and module.marker.exists()
