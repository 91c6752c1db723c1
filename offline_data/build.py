"""Build D4RL-style offline datasets locally as Minari datasets (Fu et al. 2020, arXiv 2004.07219).

One Stable-Baselines3 behaviour policy is trained on a Gymnasium task (SAC for Box actions, PPO for
Discrete) with a deterministic evaluation every `eval_freq` steps. The first evaluation whose mean return
reaches `medium_return` saves the *medium* policy and freezes the *medium-replay* data: every complete
episode the training env produced up to that step (SAC's replay buffer; PPO's rollouts). Training goes on
to `total_timesteps`, giving the *expert* policy. Datasets, D4RL's kinds:

    random         uniform random actions
    medium         the medium policy, actions sampled (deterministic=False), as D4RL did
    medium-replay  the training episodes up to the medium checkpoint
    expert         the final policy, actions sampled
    medium-expert  medium episodes followed by expert episodes

Each is written with `write_minari_dataset` as `<prefix>/<kind>-v<version>` (prefix default
`rlt/<env family>`, e.g. `rlt/hopper/medium-v0`) with ref_min_score / ref_max_score: D4RL's published
references for hopper / halfcheetah / walker2d / ant, else measured here (mean return of a uniform random
policy and of the sampled expert over `num_ref_episodes` episodes), or given. Seeds are explicit: the
policy trains with `seed`; episode i of a dataset resets with `seed + offset(kind) + i` (offsets in
`SEED_OFFSETS`, 10M apart), so datasets never share a start state sequence.

Interrupted builds (SIGKILL, power loss) leave nothing half-written: each dataset is built under a hidden
directory and renamed into place when complete (`offline_data.atomic`; leftovers are removed by the next
build), and the behaviour policy's training state is saved every `checkpoint_freq` steps to
`<policy_dir>/train_state.pt` (`offline_data.sb3_state`, no pickle). Running the same command again resumes:
training continues from the last checkpoint (a finished training is reused), datasets this same build
already completed are kept, and the rest are written. `overwrite` starts over instead. The env id goes
through `envs.resolve` (registered ids; `allow_env_modules` for modules you trust).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
import numpy as np
from tqdm.auto import tqdm

from offline_data.atomic import atomic_file, clean_stale
from offline_data.episode import Episode, episode_returns
from offline_data.minari_io import check_writable, dataset_path, validate_dataset_id, write_minari_dataset
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
from offline_data.scores import D4RL_REF_SCORES, env_family
from rl_transformers.utils.training import set_threads

__all__ = [
    "KINDS",
    "SEED_OFFSETS",
    "BuildConfig",
    "BuildResult",
    "build_datasets",
    "collect_episodes",
    "random_actor",
    "sb3_actor",
]

Kind = Literal["random", "medium", "medium-replay", "expert", "medium-expert"]
KINDS: tuple[Kind, ...] = ("random", "medium", "medium-replay", "expert", "medium-expert")
"""Dataset kinds, D4RL's names."""

SEED_OFFSETS = {
    "random": 10_000_000,
    "medium": 20_000_000,
    "expert": 30_000_000,
    "ref-random": 40_000_000,
    "ref-expert": 50_000_000,
    "eval": 90_000_000,
}
"""Added to `BuildConfig.seed` for the reset seeds of each dataset / evaluation (episode i adds i)."""

Actor = Callable[[np.ndarray], Any]


@dataclass(frozen=True)
class BuildConfig:
    """Settings of `build_datasets` (and of `scripts/make_dataset.py`, one flag per field).

    A killed build resumes: run the same command again. Training continues from
    <policy_dir>/train_state.pt (saved every --checkpoint-freq steps), finished datasets of that build are
    kept, and nothing half-written is ever visible (datasets are renamed into place when complete).
    --overwrite starts over.
    """

    env_id: str = "Hopper-v5"
    """Gymnasium task (MuJoCo tasks need the `rl-transformers[mujoco]` extra)."""
    kinds: tuple[Kind, ...] = KINDS
    """Datasets to write, from random, medium, medium-replay, expert, medium-expert."""
    dataset_prefix: str | None = None
    """Minari namespace of the ids; None: `rlt/<env family>` (e.g. rlt/hopper)."""
    version: int = 0
    """Version of every dataset id (`<prefix>/<kind>-v<version>`)."""
    root: Path | None = None
    """Minari datasets root; None: MINARI_DATASETS_PATH, else ~/.minari/datasets."""
    overwrite: bool = False
    """Replace existing datasets / policy files instead of stopping with an error."""
    seed: int = 0
    """Seed of training; collection and evaluation seeds derive from it (see SEED_OFFSETS)."""
    algo: Literal["auto", "sac", "ppo"] = "auto"
    """Behaviour-policy algorithm; auto: SAC for Box actions, PPO for Discrete."""
    total_timesteps: int = 1_000_000
    """Training steps of the behaviour policy; the final policy is the expert. When no expert is needed (no
    expert / medium-expert kind, D4RL references known), training stops at the medium checkpoint."""
    medium_return: float | None = None
    """Eval return that defines the medium policy; None: 1/3 of the way from the D4RL random to expert return (D4RL families only)."""
    eval_freq: int = 10_000
    """Training steps between deterministic evaluations."""
    n_eval_episodes: int = 10
    """Episodes per evaluation."""
    num_steps: int = 200_000
    """Steps per dataset (whole episodes, so slightly more); ignored when num_episodes is set."""
    num_episodes: int | None = None
    """Episodes per dataset instead of num_steps."""
    max_episode_steps: int | None = None
    """Time limit override passed to gym.make (stored in the dataset's env spec)."""
    num_ref_episodes: int = 100
    """Episodes to measure the random / expert reference returns when no references are known."""
    ref_min_score: float | None = None
    """Override of the random reference return (give ref_max_score too)."""
    ref_max_score: float | None = None
    """Override of the expert reference return (give ref_min_score too)."""
    medium_policy: Path | None = None
    """Load the medium policy from this SB3 zip instead of training (not with medium-replay)."""
    expert_policy: Path | None = None
    """Load the expert policy from this SB3 zip instead of training."""
    policy_dir: Path | None = None
    """Where trained policies and training.json go; None: runs/make_dataset/<env_id>/s<seed>."""
    ppo_n_steps: int = 2048
    """PPO rollout length (SB3 n_steps)."""
    ppo_batch_size: int = 64
    """PPO minibatch size."""
    sac_learning_starts: int = 10_000
    """SAC steps of random exploration before learning (RL-Zoo's MuJoCo setting)."""
    sac_buffer_size: int = 1_000_000
    """SAC replay buffer size."""
    device: str = "cpu"
    """Torch device of the SB3 policy."""
    threads: int | None = 1
    """torch CPU threads (1 is fastest for SB3's small MLPs); None leaves torch's default."""
    author: str = "rl_transformers"
    """Author stored in the Minari metadata."""
    author_email: str | None = None
    """Contact stored in the Minari metadata."""
    code_permalink: str | None = None
    """Link to the code version that built the data."""
    progress: bool = True
    """Show tqdm progress bars."""
    checkpoint_freq: int = 50_000
    """Training steps between resumable checkpoints of the behaviour policy (<policy_dir>/train_state.pt;
    rerun the same command to resume a killed build; 0: no checkpoints)."""
    allow_env_modules: tuple[str, ...] = ()
    """Modules (beyond gymnasium, envs, popgym, minigrid) whose envs a 'module:Env-v0' id may import; only
    modules you trust (see envs.resolve)."""

    def __post_init__(self) -> None:
        for kind in self.kinds:
            if kind not in KINDS:
                close = difflib.get_close_matches(kind, KINDS, n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise ValueError(f"unknown dataset kind {kind!r}; valid: {list(KINDS)}.{hint}")
        if not self.kinds or len(set(self.kinds)) != len(self.kinds):
            raise ValueError(f"kinds must be non-empty and without repeats, got {self.kinds}")
        if self.algo not in ("auto", "sac", "ppo"):
            raise ValueError(f"unknown algo {self.algo!r}; valid: ['auto', 'sac', 'ppo']")
        for name in ("total_timesteps", "eval_freq", "n_eval_episodes", "num_steps", "num_ref_episodes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.checkpoint_freq < 0:
            raise ValueError(f"checkpoint_freq must be >= 0, got {self.checkpoint_freq}")
        from envs.resolve import resolve_env

        resolve_env(self.env_id, source="--env-id", allow_modules=self.allow_env_modules)
        for name in ("num_episodes", "max_episode_steps"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {value}")
        if self.version < 0 or self.seed < 0:
            raise ValueError(f"version and seed must be >= 0, got version={self.version}, seed={self.seed}")
        if (self.ref_min_score is None) != (self.ref_max_score is None):
            raise ValueError(
                f"give ref_min_score and ref_max_score together, got {self.ref_min_score!r}, {self.ref_max_score!r}"
            )
        if (
            self.ref_min_score is not None
            and self.ref_max_score is not None
            and self.ref_max_score <= self.ref_min_score
        ):
            raise ValueError(
                f"ref_max_score {self.ref_max_score} must exceed ref_min_score {self.ref_min_score}"
            )
        if "medium-replay" in self.kinds and self.medium_policy is not None:
            raise ValueError(
                "medium-replay needs the training run that reaches the medium level; it cannot come from a "
                f"saved policy ({self.medium_policy}). Drop medium_policy or the medium-replay kind."
            )
        if self.needs_medium and self.medium_policy is None and self.medium_level is None:
            raise ValueError(
                f"medium_return is required for {self.env_id!r}: it is not a D4RL family "
                f"{sorted(D4RL_REF_SCORES)} whose default level (1/3 of the expert return) is known"
            )
        for kind in self.kinds:
            validate_dataset_id(self.dataset_id(kind))

    @property
    def prefix(self) -> str:
        """Minari namespace of the dataset ids."""
        if self.dataset_prefix is not None:
            return self.dataset_prefix.strip("/")
        family = env_family(self.env_id) or self.env_id.split("/")[-1].rsplit("-v", 1)[0].lower()
        return f"rlt/{family}"

    def dataset_id(self, kind: str) -> str:
        """Minari id of one kind, e.g. rlt/hopper/medium-v0."""
        return f"{self.prefix}/{kind}-v{self.version}"

    @property
    def needs_medium(self) -> bool:
        """True when a dataset uses the medium policy."""
        return bool({"medium", "medium-replay", "medium-expert"} & set(self.kinds))

    @property
    def medium_level(self) -> float | None:
        """The eval return that defines the medium policy."""
        if self.medium_return is not None:
            return self.medium_return
        family = env_family(self.env_id)
        if family is None:
            return None
        ref = D4RL_REF_SCORES[family]
        return ref.ref_min + (ref.ref_max - ref.ref_min) / 3.0

    @property
    def policy_path(self) -> Path:
        """Directory of the trained policies."""
        if self.policy_dir is not None:
            return Path(self.policy_dir)
        return Path("runs") / "make_dataset" / self.env_id.replace("/", "_") / f"s{self.seed}"


@dataclass(frozen=True)
class BuildResult:
    """What `build_datasets` wrote."""

    paths: dict[str, Path]
    """Dataset directory per kind."""
    dataset_ids: dict[str, str]
    """Minari id per kind."""
    ref_min_score: float
    """Random reference return stored in every dataset."""
    ref_max_score: float
    """Expert reference return stored in every dataset."""
    ref_scores_source: str
    """"d4rl_table", "measured" or "given"."""
    mean_returns: dict[str, float]
    """Mean episode return of each written dataset."""
    policies: dict[str, Path] = field(default_factory=dict)
    """Policy zip per role ("medium", "expert")."""
    medium_step: int | None = None
    """Training step of the medium checkpoint (None when loaded from a zip)."""
    medium_eval_return: float | None = None
    """Deterministic eval return of the medium checkpoint."""


# ------------------------------------------------------------------------------------------- collection


def random_actor(action_space: gym.spaces.Space, seed: int) -> Actor:
    """Uniform random actions from a seeded copy of `action_space`."""
    space = copy.deepcopy(action_space)
    space.seed(seed)
    return lambda _obs: space.sample()


def sb3_actor(model: Any, deterministic: bool = False) -> Actor:
    """An SB3 model as an actor; `deterministic=False` samples like D4RL's data collection."""
    return lambda obs: model.predict(obs, deterministic=deterministic)[0]


def _make_env(config: BuildConfig) -> gym.Env:
    from envs.resolve import make_env

    kwargs = {} if config.max_episode_steps is None else {"max_episode_steps": config.max_episode_steps}
    return make_env(config.env_id, source="--env-id", allow_modules=config.allow_env_modules, **kwargs)


def collect_episodes(
    env: gym.Env,
    actor: Actor,
    *,
    seed: int,
    num_steps: int | None = None,
    num_episodes: int | None = None,
    progress: bool = False,
    desc: str = "collect",
) -> list[Episode]:
    """Run `actor` in `env` for `num_episodes` episodes, or whole episodes until >= `num_steps` steps.

    Episode i resets with seed `seed + i` (stored on the episode). Episodes end on termination or
    truncation (the env's time limit).
    """
    if (num_steps is None) == (num_episodes is None):
        raise ValueError(f"give exactly one of num_steps / num_episodes, got {num_steps!r}, {num_episodes!r}")
    episodes: list[Episode] = []
    total = 0
    bar = tqdm(
        total=num_episodes if num_episodes is not None else num_steps,
        desc=desc,
        unit="ep" if num_episodes is not None else "step",
        disable=not progress,
        leave=False,
    )
    with bar:
        while (num_episodes is not None and len(episodes) < num_episodes) or (
            num_steps is not None and total < num_steps
        ):
            ep_seed = seed + len(episodes)
            obs, _ = env.reset(seed=ep_seed)
            observations, actions, rewards, terms, truncs = [obs], [], [], [], []
            while True:
                action = actor(obs)
                obs, reward, terminated, truncated, _ = env.step(action)
                observations.append(obs)
                actions.append(np.asarray(action))
                rewards.append(float(reward))
                terms.append(bool(terminated))
                truncs.append(bool(truncated))
                if terminated or truncated:
                    break
            episodes.append(
                Episode.from_observation_sequence(
                    np.stack(observations), np.stack(actions), rewards, terms, truncs, seed=ep_seed
                )
            )
            total += len(rewards)
            bar.update(1 if num_episodes is not None else len(rewards))
    return episodes


def evaluate_returns(env: gym.Env, actor: Actor, n_episodes: int, seed: int) -> np.ndarray:
    """(n_episodes,) returns of `actor`, episode i reset with `seed + i`."""
    return episode_returns(collect_episodes(env, actor, seed=seed, num_episodes=n_episodes))


class _EpisodeRecorder(gym.Wrapper):
    """Keeps every complete episode the training env produces while `active` (the medium-replay data)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.active = True
        self.episodes: list[Episode] = []
        self._current: list[list[Any]] | None = None

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        self._current = [[obs], [], [], [], []] if self.active else None
        return obs, info

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self._current is not None:
            for buffer, value in zip(
                self._current, (obs, np.asarray(action), float(reward), bool(terminated), bool(truncated))
            ):
                buffer.append(value)
            if terminated or truncated:
                observations, actions, rewards, terms, truncs = self._current
                self.episodes.append(
                    Episode.from_observation_sequence(
                        np.stack(observations), np.stack(actions), rewards, terms, truncs
                    )
                )
                self._current = None
        return obs, reward, terminated, truncated, info


# --------------------------------------------------------------------------------------------- training


@dataclass
class _Training:
    medium_path: Path | None = None
    expert_path: Path | None = None
    medium_step: int | None = None
    medium_eval_return: float | None = None
    replay: list[Episode] = field(default_factory=list)
    history: list[tuple[int, float]] = field(default_factory=list)


def _algo_class(config: BuildConfig, action_space: gym.spaces.Space) -> Any:
    from stable_baselines3 import PPO, SAC

    algo = config.algo
    if algo == "auto":
        algo = "sac" if isinstance(action_space, gym.spaces.Box) else "ppo"
    if algo == "sac" and not isinstance(action_space, gym.spaces.Box):
        raise ValueError(f"SAC needs a Box action space; {config.env_id} has {action_space}. Use algo='ppo'.")
    return SAC if algo == "sac" else PPO


def _algo_kwargs(config: BuildConfig, algo_cls: Any, inference: bool = False) -> dict[str, Any]:
    from stable_baselines3 import SAC

    if algo_cls is SAC:
        buffer = 1 if inference else config.sac_buffer_size  # a policy only acts: no replay memory
        return {"learning_starts": config.sac_learning_starts, "buffer_size": buffer}
    return {"n_steps": config.ppo_n_steps, "batch_size": config.ppo_batch_size}


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


def _finished_training(policy_dir: Path, fp: str, stop_at_medium: bool) -> _Training | None:
    """The result of a finished training with the same fingerprint (policies and replay on disk), else None."""
    summary_path = policy_dir / "training.json"
    if not summary_path.is_file():
        return None
    summary = json.loads(summary_path.read_text())
    if summary.get("fingerprint") != fp or not summary.get("complete"):
        return None
    result = _Training(
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


def _train(config: BuildConfig, algo_cls: Any, policy_dir: Path, stop_at_medium: bool = False) -> _Training:
    from stable_baselines3.common.callbacks import BaseCallback

    fp = _training_fingerprint(config, algo_cls, stop_at_medium)
    finished = _finished_training(policy_dir, fp, stop_at_medium)
    if finished is not None:
        if config.progress:
            tqdm.write(f"reusing the finished behaviour-policy training in {policy_dir}")
        return finished
    result = _Training()
    level = config.medium_level
    train_env = _EpisodeRecorder(_make_env(config))
    eval_env = _make_env(config)
    model = algo_cls(
        "MlpPolicy",
        train_env,
        seed=config.seed,
        device=config.device,
        verbose=0,
        **_algo_kwargs(config, algo_cls),
    )
    state_path = policy_dir / "train_state.pt"
    if state_path.is_file():
        state = load_train_state(state_path)
        if state["fingerprint"] != fp:
            raise FileExistsError(
                f"{state_path} holds a training with other settings; pass --overwrite to start over, or another "
                "--policy-dir"
            )
        info, recorded = restore_train_state(model, state)
        result.history = [tuple(h) for h in info["history"]]  # type: ignore[misc]
        if info.get("medium_step") is not None:
            result.medium_path = policy_dir / "medium.zip"
            result.medium_step, result.medium_eval_return = info["medium_step"], info["medium_eval_return"]
            result.replay = load_episodes_file(policy_dir / "replay.pt")
            train_env.active = False
        else:
            train_env.episodes = recorded
        model.set_random_seed(config.seed + model.num_timesteps)  # new episodes, not the first ones again
        if config.progress:
            tqdm.write(
                f"resuming the behaviour-policy training from step {model.num_timesteps} ({state_path})"
            )
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
                    result.replay = list(train_env.episodes)
                    save_episodes_file(policy_dir / "replay.pt", result.replay)
                    result.medium_path = save_model_zip(self.model, policy_dir / "medium.zip")
                    result.medium_step, result.medium_eval_return = self.num_timesteps, ret
                    train_env.active = False
                    train_env.episodes = []
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
    summary = {
        "env_id": config.env_id,
        "algo": algo_cls.__name__,
        "seed": config.seed,
        "total_timesteps": config.total_timesteps,
        "medium_level": level,
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
    state_path.unlink(missing_ok=True)
    train_env.close()
    eval_env.close()
    return result


# ------------------------------------------------------------------------------------------------ build


def _describe(kind: str, config: BuildConfig, algo: str, training: _Training, ref_source: str) -> str:
    sampled = "Actions are sampled from the stochastic policy (deterministic=False), as D4RL did."
    if kind == "random":
        body = "Uniformly random actions."
    elif kind == "medium":
        if config.medium_policy is not None:
            body = f"SB3 {algo} medium policy loaded from {config.medium_policy}. {sampled}"
        else:
            body = (
                f"SB3 {algo} policy saved at training step {training.medium_step}, the first deterministic "
                f"{config.n_eval_episodes}-episode evaluation with mean return >= {config.medium_level:.1f} "
                f"({training.medium_eval_return:.1f}). {sampled}"
            )
    elif kind == "medium-replay":
        body = (
            f"Every complete episode of SB3 {algo} training (seed {config.seed}) up to the medium checkpoint at "
            f"step {training.medium_step}; a trailing unfinished episode is dropped."
        )
    elif kind == "expert":
        if config.expert_policy is not None:
            body = f"SB3 {algo} expert policy loaded from {config.expert_policy}. {sampled}"
        else:
            body = f"SB3 {algo} policy after {config.total_timesteps} training steps. {sampled}"
    else:
        body = "The medium episodes followed by the expert episodes (D4RL's medium-expert concatenation)."
    refs = {
        "d4rl_table": "D4RL's published reference returns (not comparable with D4RL v2 tables: other simulator, env version and data)",
        "measured": f"mean returns of a uniform random policy and the sampled expert over {config.num_ref_episodes} episodes",
        "given": "given by the builder",
    }[ref_source]
    return f"{kind} dataset for {config.env_id}. {body} Reference scores: {refs}. Built by rl_transformers (offline_data.build), seed {config.seed}."


_NOT_DATA = {
    "overwrite",
    "progress",
    "root",
    "device",
    "threads",
    "policy_dir",
    "allow_env_modules",
    "checkpoint_freq",
}


def build_fingerprint(config: BuildConfig) -> str:
    """Identifies the data a config produces (stored as ``rlt_build.fingerprint`` in each dataset)."""
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name not in _NOT_DATA}
    return fingerprint(fields)


def _journal(config: BuildConfig, build_fp: str) -> Path:
    """Marks a build in progress (hidden: Minari lists no hidden directory); removed when it completes."""
    return dataset_path("x-v0", config.root).parent / ".rlt-journal" / f"{build_fp}.json"


def _stored_fingerprint(path: Path) -> str | None:
    try:
        meta = json.loads((path / "data" / "metadata.json").read_text())
        return meta.get("rlt_build", {}).get("fingerprint")
    except (OSError, ValueError, AttributeError):
        return None


def _preflight(config: BuildConfig, train: bool, policy_dir: Path, build_fp: str) -> set[str]:
    """Refuse existing targets (unless overwrite); returns the kinds an interrupted run of this build wrote."""
    done: set[str] = set()
    in_progress = _journal(config, build_fp).is_file()
    for kind in config.kinds:
        path = dataset_path(config.dataset_id(kind), config.root)
        if not path.exists() or config.overwrite:
            continue
        if in_progress and _stored_fingerprint(path) == build_fp:
            done.add(kind)  # written by the killed run of this same build: kept
            continue
        check_writable(config.dataset_id(kind), config.root, config.overwrite)
    if train and config.overwrite:
        for name in ("train_state.pt", "training.json", "replay.pt"):
            (policy_dir / name).unlink(missing_ok=True)
    elif (
        train and not (policy_dir / "training.json").exists() and not (policy_dir / "train_state.pt").exists()
    ):
        for name in ("medium.zip", "expert.zip"):
            if (policy_dir / name).exists():
                raise FileExistsError(
                    f"policy {policy_dir / name} exists; pass overwrite=True (CLI: --overwrite), another "
                    "policy_dir, or medium_policy / expert_policy to reuse saved policies"
                )
    for path in (config.medium_policy, config.expert_policy):
        if path is not None and not Path(path).is_file():
            raise FileNotFoundError(f"policy zip {path} does not exist")
    return done


def _load_policy(config: BuildConfig, algo_cls: Any, env: gym.Env, path: Path) -> Any:
    """A fresh SB3 model with the weights of ``path`` (``policy.pth`` only; never SB3's pickle-based load)."""
    model = algo_cls(
        "MlpPolicy",
        env,
        seed=config.seed,
        device=config.device,
        verbose=0,
        **_algo_kwargs(config, algo_cls, True),
    )
    load_policy_weights(model, path)
    return model


def _reference_plan(config: BuildConfig) -> tuple[str, tuple[float, float] | None]:
    """(source, references); references are None when they must be measured."""
    family = env_family(config.env_id)
    if config.ref_min_score is not None and config.ref_max_score is not None:
        return "given", (config.ref_min_score, config.ref_max_score)
    if family is not None:
        return "d4rl_table", tuple(D4RL_REF_SCORES[family])  # type: ignore[return-value]
    return "measured", None


def _measure_references(
    env: gym.Env, action_space: gym.spaces.Space, expert: Any, config: BuildConfig
) -> tuple[float, float]:
    """Mean returns of a uniform random policy and of the sampled expert (Minari's convention)."""
    from stable_baselines3.common.utils import set_random_seed

    means = []
    for role, actor in (
        ("ref-random", random_actor(action_space, config.seed + SEED_OFFSETS["ref-random"])),
        ("ref-expert", sb3_actor(expert)),
    ):
        seed = config.seed + SEED_OFFSETS[role]
        set_random_seed(seed)  # torch RNG of the stochastic policy
        means.append(float(evaluate_returns(env, actor, config.num_ref_episodes, seed).mean()))
    if means[1] <= means[0]:
        raise RuntimeError(
            f"measured expert return {means[1]:.2f} does not exceed the random return {means[0]:.2f}; "
            "train longer or give ref_min_score / ref_max_score"
        )
    return means[0], means[1]


def _record_datasets(
    config: BuildConfig,
    env: gym.Env,
    action_space: gym.spaces.Space,
    models: dict[str, Any],
    replay: list[Episode],
) -> dict[str, list[Episode]]:
    from stable_baselines3.common.utils import set_random_seed

    def record(kind: str, actor: Actor) -> list[Episode]:
        set_random_seed(config.seed + SEED_OFFSETS[kind])  # torch RNG of the stochastic policy
        return collect_episodes(
            env,
            actor,
            seed=config.seed + SEED_OFFSETS[kind],
            num_steps=None if config.num_episodes is not None else config.num_steps,
            num_episodes=config.num_episodes,
            progress=config.progress,
            desc=kind,
        )

    kinds = set(config.kinds)
    data: dict[str, list[Episode]] = {}
    if "random" in kinds:
        data["random"] = record("random", random_actor(action_space, config.seed + SEED_OFFSETS["random"]))
    if {"medium", "medium-expert"} & kinds:
        data["medium"] = record("medium", sb3_actor(models["medium"]))
    if "medium-replay" in kinds:
        data["medium-replay"] = replay
    if {"expert", "medium-expert"} & kinds:
        data["expert"] = record("expert", sb3_actor(models["expert"]))
    if "medium-expert" in kinds:
        data["medium-expert"] = data["medium"] + data["expert"]
    return data


def build_datasets(config: BuildConfig) -> BuildResult:
    """Train (or load) the behaviour policy, record the requested kinds and write them as Minari datasets.

    Every target id (and policy file) is checked before any training, so an existing dataset stops the
    build at once unless `config.overwrite` -- except datasets an interrupted run of this same build
    (same settings, `build_fingerprint`) already wrote, which are kept. Training resumes from
    `<policy_dir>/train_state.pt` (see the module docstring).
    """
    started = time.perf_counter()
    if config.threads is not None:
        set_threads(config.threads)
    env = _make_env(config)
    env_spec, action_space = env.spec, env.action_space
    algo_cls = _algo_class(config, action_space)
    kinds = set(config.kinds)
    ref_source, refs = _reference_plan(config)
    need_medium = config.needs_medium
    need_expert = bool({"expert", "medium-expert"} & kinds) or refs is None
    train = "medium-replay" in kinds or (need_medium and config.medium_policy is None)
    train = train or (need_expert and config.expert_policy is None)
    policy_dir = config.policy_path
    build_fp = build_fingerprint(config)
    done = _preflight(config, train, policy_dir, build_fp)
    journal = _journal(config, build_fp)
    journal.parent.mkdir(parents=True, exist_ok=True)
    journal.write_text(json.dumps({"kinds": list(config.kinds), "policy_dir": str(policy_dir)}))

    training = _Training()
    if train:
        policy_dir.mkdir(parents=True, exist_ok=True)
        clean_stale(policy_dir)
        training = _train(config, algo_cls, policy_dir, stop_at_medium=need_medium and not need_expert)
        if need_medium and config.medium_policy is None and training.medium_path is None:
            best = max((r for _, r in training.history), default=float("nan"))
            raise RuntimeError(
                f"the eval return never reached medium_return={config.medium_level:.1f} in "
                f"{config.total_timesteps} steps (best {best:.1f}); lower it or train longer. The final "
                f"policy is saved at {training.expert_path}."
            )
        if "medium-replay" in kinds and not training.replay:
            raise RuntimeError(
                f"no training episode finished before the medium checkpoint at step {training.medium_step}; "
                "raise eval_freq or medium_return"
            )
    if config.medium_policy is not None:  # the loaded zip, not a checkpoint of this run
        training.medium_step = training.medium_eval_return = None
    policies = {
        "medium": Path(config.medium_policy) if config.medium_policy else training.medium_path,
        "expert": Path(config.expert_policy) if config.expert_policy else training.expert_path,
    }
    needed = {"medium": need_medium, "expert": need_expert}
    models = {
        role: _load_policy(config, algo_cls, env, path)
        for role, path in policies.items()
        if path is not None and needed[role]
    }
    if refs is None:
        refs = _measure_references(env, action_space, models["expert"], config)
    data = _record_datasets(config, env, action_space, models, training.replay)
    env.close()

    algo = algo_cls.__name__
    paths: dict[str, Path] = {}
    for kind in config.kinds:
        if kind in done:
            paths[kind] = dataset_path(config.dataset_id(kind), config.root)
            continue
        build_info: dict[str, Any] = {
            "kind": kind,
            "seed": config.seed,
            "algo": f"sb3/{algo}",
            "fingerprint": build_fp,
        }
        if kind in ("medium", "medium-replay", "medium-expert"):
            build_info.update(
                medium_step=training.medium_step, medium_eval_return=training.medium_eval_return
            )
        extra: dict[str, Any] = {"rlt_build": build_info, "ref_scores_source": ref_source}
        if ref_source == "measured":
            extra["num_episodes_average_score"] = config.num_ref_episodes
        if kind == "medium-expert":
            extra["combined_datasets"] = [config.dataset_id("medium"), config.dataset_id("expert")]
        paths[kind] = write_minari_dataset(
            config.dataset_id(kind),
            data[kind],
            env=env_spec,
            eval_env=env_spec,
            ref_min_score=float(refs[0]),
            ref_max_score=float(refs[1]),
            algorithm_name="random" if kind == "random" else f"sb3/{algo}",
            author=config.author,
            author_email=config.author_email,
            code_permalink=config.code_permalink,
            description=_describe(kind, config, algo, training, ref_source),
            extra_metadata=extra,
            root=config.root,
            overwrite=config.overwrite,
            allow_env_modules=config.allow_env_modules,
        )
    journal.unlink(missing_ok=True)
    if config.progress:
        tqdm.write(f"built {len(paths)} dataset(s) in {time.perf_counter() - started:.1f} s")
    return BuildResult(
        paths=paths,
        dataset_ids={kind: config.dataset_id(kind) for kind in config.kinds},
        ref_min_score=float(refs[0]),
        ref_max_score=float(refs[1]),
        ref_scores_source=ref_source,
        mean_returns={kind: float(episode_returns(data[kind]).mean()) for kind in config.kinds},
        policies={role: path for role, path in policies.items() if path is not None},
        medium_step=training.medium_step,
        medium_eval_return=training.medium_eval_return,
    )
