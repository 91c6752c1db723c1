"""The behaviour policy of the dataset builder: Stable-Baselines3 training with resumable checkpoints.

`train_behaviour_policy` trains SAC (Haarnoja et al. 2018, arXiv 1801.01290) for Box actions or PPO
(Schulman et al. 2017, arXiv 1707.06347) for Discrete ones, evaluating deterministically every `eval_freq`
steps. The first evaluation whose mean return reaches the medium level saves `medium.zip` and freezes the
medium-replay episodes (`replay.pt`); training then goes on to `total_timesteps` (`expert.zip`), or stops
there when no expert is needed. Every `checkpoint_freq` steps the training state goes to
`<policy_dir>/train_state.pt` (`offline_data.sb3_state`, no pickle), so a killed training resumes; a
finished one (`training.json` with the same settings fingerprint) is reused as is. `load_policy` builds a
fresh model with the weights of a saved zip (never SB3's pickle-based load).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
from tqdm.auto import tqdm

from offline_data.build_config import SEED_OFFSETS, BuildConfig
from offline_data.episode import Episode
from offline_data.errors import DatasetExistsError
from offline_data.rollouts import EpisodeRecorder, evaluate_returns, make_build_env, sb3_actor
from offline_data.sb3_state import (
    fingerprint,
    load_episodes_file,
    load_policy_weights,
    load_train_state,
    restore_train_state,
    save_episodes_file,
    save_model_zip,
    save_train_state,
)
from rl_transformers.utils.atomic import atomic_file
from rl_transformers.utils.extras import need

__all__ = ["Training", "algo_class", "load_policy", "train_behaviour_policy"]


@dataclass
class Training:
    """What the behaviour-policy training produced (all None / empty when nothing was trained)."""

    medium_path: Path | None = None
    expert_path: Path | None = None
    medium_step: int | None = None
    medium_eval_return: float | None = None
    replay: list[Episode] = field(default_factory=list)
    history: list[tuple[int, float]] = field(default_factory=list)


def algo_class(config: BuildConfig, action_space: gym.spaces.Space) -> Any:
    """The SB3 algorithm class of `config.algo` (auto: SAC for Box actions, PPO otherwise)."""
    need("stable_baselines3", "a behaviour policy (Stable-Baselines3 PPO / SAC)")
    from stable_baselines3 import PPO, SAC

    algo = config.algo
    if algo == "auto":
        algo = "sac" if isinstance(action_space, gym.spaces.Box) else "ppo"
    if algo == "sac" and not isinstance(action_space, gym.spaces.Box):
        raise ValueError(f"SAC needs a Box action space; {config.env_id} has {action_space}. Use algo='ppo'.")
    return SAC if algo == "sac" else PPO


def _algo_kwargs(config: BuildConfig, algo_cls: Any, inference: bool = False) -> dict[str, Any]:
    need("stable_baselines3", "a behaviour policy (Stable-Baselines3 PPO / SAC)")
    from stable_baselines3 import SAC

    if algo_cls is SAC:
        buffer = 1 if inference else config.sac_buffer_size  # a policy only acts: no replay memory
        return {"learning_starts": config.sac_learning_starts, "buffer_size": buffer}
    return {"n_steps": config.ppo_n_steps, "batch_size": config.ppo_batch_size}


def _new_model(config: BuildConfig, algo_cls: Any, env: gym.Env, inference: bool = False) -> Any:
    return algo_cls(
        "MlpPolicy",
        env,
        seed=config.seed,
        device=config.device,
        verbose=0,
        **_algo_kwargs(config, algo_cls, inference),
    )


def load_policy(config: BuildConfig, algo_cls: Any, env: gym.Env, path: Path) -> Any:
    """A fresh SB3 model with the weights of ``path`` (``policy.pth`` only; never SB3's pickle-based load)."""
    model = _new_model(config, algo_cls, env, inference=True)
    load_policy_weights(model, path)
    return model


def _training_fingerprint(config: BuildConfig, algo_cls: Any, stop_at_medium: bool) -> str:
    """What a resumed training must share with the killed one."""
    keep = (
        "env_id", "seed", "total_timesteps", "eval_freq", "n_eval_episodes", "max_episode_steps",
        "ppo_n_steps", "ppo_batch_size", "sac_learning_starts", "sac_buffer_size",
    )  # fmt: skip
    settings = {name: getattr(config, name) for name in keep}
    settings |= {
        "algo": algo_cls.__name__,
        "medium_level": config.medium_level,
        "needs_medium": config.needs_medium,
    }
    return fingerprint(settings | {"stop_at_medium": stop_at_medium})


def _finished_training(policy_dir: Path, fp: str, stop_at_medium: bool) -> Training | None:
    """The result of a finished training with the same fingerprint (policies and replay on disk), else None."""
    summary_path = policy_dir / "training.json"
    if not summary_path.is_file():
        return None
    summary = json.loads(summary_path.read_text())
    if summary.get("fingerprint") != fp or not summary.get("complete"):
        return None
    result = Training(
        medium_step=summary.get("medium_step"),
        medium_eval_return=summary.get("medium_eval_return"),
        history=[tuple(h) for h in summary.get("eval_history", [])],  # type: ignore[misc]
    )
    if (policy_dir / "medium.zip").is_file() and summary.get("medium_step") is not None:
        result.medium_path = policy_dir / "medium.zip"
    if not summary.get("stopped_at_medium"):
        result.expert_path = policy_dir / "expert.zip"
        if not result.expert_path.is_file():
            return None
    if (policy_dir / "replay.pt").is_file():
        result.replay = load_episodes_file(policy_dir / "replay.pt")
    return result


def train_behaviour_policy(
    config: BuildConfig, algo_cls: Any, policy_dir: Path, stop_at_medium: bool = False
) -> Training:
    """Train, resume or reuse the behaviour policy in `policy_dir` (see the module docstring).

    `stop_at_medium`: end at the medium checkpoint (no expert is needed); the policy is saved as
    `last.zip` then, not as the expert.
    """
    need("stable_baselines3", "training a behaviour policy")
    from stable_baselines3.common.callbacks import BaseCallback

    fp = _training_fingerprint(config, algo_cls, stop_at_medium)
    finished = _finished_training(policy_dir, fp, stop_at_medium)
    if finished is not None:
        if config.progress:
            tqdm.write(f"reusing the finished behaviour-policy training in {policy_dir}")
        return finished
    result = Training()
    level = config.medium_level
    train_env = EpisodeRecorder(make_build_env(config))
    eval_env = make_build_env(config)
    model = _new_model(config, algo_cls, train_env)
    state_path = policy_dir / "train_state.pt"
    if state_path.is_file():
        _resume(config, model, state_path, fp, result, train_env)
    resumed_from = int(model.num_timesteps)
    bar = tqdm(
        total=config.total_timesteps,
        initial=resumed_from,
        desc="train " + algo_cls.__name__,
        disable=not config.progress,
    )

    def checkpoint(current: Any) -> None:
        info = {
            "history": result.history,
            "medium_step": result.medium_step,
            "medium_eval_return": result.medium_eval_return,
        }
        save_train_state(state_path, current, fp, info, train_env.episodes if train_env.active else [])

    class Monitor(BaseCallback):
        def _on_step(self) -> bool:
            bar.update(1)
            if self.num_timesteps % config.eval_freq == 0:
                actor = sb3_actor(self.model, deterministic=True)
                ret = float(
                    evaluate_returns(
                        eval_env, actor, config.n_eval_episodes, config.seed + SEED_OFFSETS["eval"]
                    ).mean()
                )
                result.history.append((self.num_timesteps, ret))
                bar.set_postfix(eval_return=f"{ret:.1f}")
                if config.needs_medium and result.medium_path is None and level is not None and ret >= level:
                    _save_medium(self.model, self.num_timesteps, ret, result, train_env, policy_dir)
                    checkpoint(self.model)
                    if stop_at_medium:
                        bar.set_description("medium reached; no expert needed, stopping")
                        return False
            if config.checkpoint_freq and self.num_timesteps % config.checkpoint_freq == 0:
                checkpoint(self.model)
            return True

    remaining = config.total_timesteps - resumed_from
    done_early = stop_at_medium and result.medium_path is not None
    with bar:
        if remaining > 0 and not done_early:
            model.learn(total_timesteps=remaining, callback=Monitor(), reset_num_timesteps=resumed_from == 0)
    if stop_at_medium and result.medium_path is not None:
        save_model_zip(model, policy_dir / "last.zip")  # stopped at the medium step: not an expert
    else:
        result.expert_path = save_model_zip(model, policy_dir / "expert.zip")
    _write_summary(config, algo_cls, policy_dir, result, stop_at_medium, resumed_from, fp)
    state_path.unlink(missing_ok=True)
    train_env.close()
    eval_env.close()
    return result


def _resume(
    config: BuildConfig, model: Any, state_path: Path, fp: str, result: Training, train_env: EpisodeRecorder
) -> None:
    """Restore a killed training from `state_path` into `model`, `result` and `train_env`: the eval history,
    the medium checkpoint if it was reached (then the recorder stops), else the episodes recorded so far.
    `DatasetExistsError` when the state holds a training with other settings (another fingerprint)."""
    state = load_train_state(state_path)
    if state["fingerprint"] != fp:
        raise DatasetExistsError(
            f"{state_path} holds a training with other settings; pass --overwrite to start over, or another "
            "--policy-dir"
        )
    info, recorded = restore_train_state(model, state)
    result.history = [tuple(h) for h in info["history"]]  # type: ignore[misc]
    if info.get("medium_step") is not None:
        result.medium_path = state_path.parent / "medium.zip"
        result.medium_step, result.medium_eval_return = info["medium_step"], info["medium_eval_return"]
        result.replay = load_episodes_file(state_path.parent / "replay.pt")
        train_env.active = False
    else:
        train_env.episodes = recorded
    model.set_random_seed(config.seed + model.num_timesteps)  # new episodes, not the first ones again
    if config.progress:
        tqdm.write(f"resuming the behaviour-policy training from step {model.num_timesteps} ({state_path})")


def _save_medium(
    model: Any, step: int, eval_return: float, result: Training, train_env: EpisodeRecorder, policy_dir: Path
) -> None:
    """The medium checkpoint: the training episodes so far frozen as the medium-replay data (`replay.pt`),
    the policy saved as `medium.zip`, and the recorder stopped."""
    result.replay = list(train_env.episodes)
    save_episodes_file(policy_dir / "replay.pt", result.replay)
    result.medium_path = save_model_zip(model, policy_dir / "medium.zip")
    result.medium_step, result.medium_eval_return = step, eval_return
    train_env.active = False
    train_env.episodes = []


def _write_summary(
    config: BuildConfig,
    algo_cls: Any,
    policy_dir: Path,
    result: Training,
    stop_at_medium: bool,
    resumed_from: int,
    fp: str,
) -> None:
    """`<policy_dir>/training.json`: the finished training's settings, medium checkpoint and eval history,
    marked complete with its fingerprint (what `_finished_training` reuses)."""
    summary = {
        "env_id": config.env_id,
        "algo": algo_cls.__name__,
        "seed": config.seed,
        "total_timesteps": config.total_timesteps,
        "medium_level": config.medium_level,
        "medium_step": result.medium_step,
        "medium_eval_return": result.medium_eval_return,
        "stopped_at_medium": stop_at_medium and result.medium_path is not None,
        "eval_history": result.history,
        "resumed_from_step": resumed_from or None,
        "fingerprint": fp,
        "complete": True,
    }
    with atomic_file(policy_dir / "training.json") as temp:
        temp.write_text(json.dumps(summary, indent=2))
