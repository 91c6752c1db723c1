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
directory and renamed into place when complete (`rl_transformers.utils.atomic`; leftovers are removed by the next
build), and the behaviour policy's training state is saved every `checkpoint_freq` steps to
`<policy_dir>/train_state.pt` (`offline_data.sb3_state`, no pickle). Running the same command again resumes:
training continues from the last checkpoint (a finished training is reused), datasets this same build
already completed are kept, and the rest are written. `overwrite` starts over instead. The env id goes
through `envs.resolve` (registered ids; `allow_env_modules` for modules you trust).

Layout: settings in `offline_data.build_config`, actors and episode collection in `offline_data.rollouts`,
the behaviour-policy training and its checkpoints in `offline_data.behaviour`; this module plans the build
(preflight, references) and records and writes the datasets.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
from gymnasium.envs.registration import EnvSpec
from tqdm.auto import tqdm

from offline_data.behaviour import Training, algo_class, load_policy, train_behaviour_policy
from offline_data.build_config import SEED_OFFSETS, BuildConfig, BuildResult
from offline_data.episode import Episode, episode_returns
from offline_data.errors import DatasetExistsError, DatasetNotFoundError
from offline_data.minari_io import dataset_path
from offline_data.minari_write import check_writable, write_minari_dataset
from offline_data.rollouts import (
    Actor,
    collect_episodes,
    evaluate_returns,
    make_build_env,
    random_actor,
    sb3_actor,
)
from offline_data.sb3_state import fingerprint
from offline_data.scores import D4RL_REF_SCORES, env_family
from rl_transformers.utils.atomic import atomic_file, clean_stale
from rl_transformers.utils.extras import need
from rl_transformers.utils.training import set_threads

__all__ = ["build_datasets", "build_fingerprint"]


def _describe(kind: str, config: BuildConfig, algo: str, training: Training, ref_source: str) -> str:
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
    path: Path | None  # a dataset path, then the optional policy zips
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
                raise DatasetExistsError(
                    f"policy {policy_dir / name} exists; pass overwrite=True (CLI: --overwrite), another "
                    "policy_dir, or medium_policy / expert_policy to reuse saved policies"
                )
    for path in (config.medium_policy, config.expert_policy):
        if path is not None and not Path(path).is_file():
            flag = "--medium-policy" if path == config.medium_policy else "--expert-policy"
            raise DatasetNotFoundError(f"{flag} {path}: no such file (a zip saved by SB3's model.save)")
    return done


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
    need("stable_baselines3", "building a dataset")
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
    need("stable_baselines3", "building a dataset")
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
    env = make_build_env(config)
    env_spec, action_space = env.spec, env.action_space
    algo_cls = algo_class(config, action_space)
    ref_source, refs = _reference_plan(config)
    need_medium = config.needs_medium
    need_expert = bool({"expert", "medium-expert"} & set(config.kinds)) or refs is None
    train = "medium-replay" in config.kinds or (need_medium and config.medium_policy is None)
    train = train or (need_expert and config.expert_policy is None)
    policy_dir = config.policy_path
    build_fp = build_fingerprint(config)
    done = _preflight(config, train, policy_dir, build_fp)
    journal = _journal(config, build_fp)
    with atomic_file(journal) as temp:
        temp.write_text(json.dumps({"kinds": list(config.kinds), "policy_dir": str(policy_dir)}))

    training = Training()
    if train:
        training = _train(config, algo_cls, policy_dir, need_medium, need_expert)
    if config.medium_policy is not None:  # the loaded zip, not a checkpoint of this run
        training.medium_step = training.medium_eval_return = None
    policies = {
        "medium": Path(config.medium_policy) if config.medium_policy else training.medium_path,
        "expert": Path(config.expert_policy) if config.expert_policy else training.expert_path,
    }
    needed = {"medium": need_medium, "expert": need_expert}
    models = {
        role: load_policy(config, algo_cls, env, path)
        for role, path in policies.items()
        if path is not None and needed[role]
    }
    if refs is None:
        refs = _measure_references(env, action_space, models["expert"], config)
    data = _record_datasets(config, env, action_space, models, training.replay)
    env.close()

    paths: dict[str, Path] = {}
    for kind in config.kinds:
        if kind in done:
            paths[kind] = dataset_path(config.dataset_id(kind), config.root)
        else:
            paths[kind] = _write_dataset(
                config, kind, data[kind], env_spec, refs, ref_source, algo_cls.__name__, training, build_fp
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


def _train(
    config: BuildConfig, algo_cls: Any, policy_dir: Path, need_medium: bool, need_expert: bool
) -> Training:
    """Train (or resume) the behaviour policy in `policy_dir`, stopping at the medium checkpoint when no
    expert is needed; `RuntimeError` when a needed medium checkpoint or medium-replay episode never came."""
    policy_dir.mkdir(parents=True, exist_ok=True)
    clean_stale(policy_dir)
    training = train_behaviour_policy(
        config, algo_cls, policy_dir, stop_at_medium=need_medium and not need_expert
    )
    if need_medium and config.medium_policy is None and training.medium_path is None:
        best = max((r for _, r in training.history), default=float("nan"))
        raise RuntimeError(
            f"the eval return never reached medium_return={config.medium_level:.1f} in "
            f"{config.total_timesteps} steps (best {best:.1f}); lower it or train longer. The final "
            f"policy is saved at {training.expert_path}."
        )
    if "medium-replay" in config.kinds and not training.replay:
        raise RuntimeError(
            f"no training episode finished before the medium checkpoint at step {training.medium_step}; "
            "raise eval_freq or medium_return"
        )
    return training


def _write_dataset(
    config: BuildConfig,
    kind: str,
    episodes: list[Episode],
    env_spec: EnvSpec | None,
    refs: tuple[float, float],
    ref_source: str,
    algo: str,
    training: Training,
    build_fp: str,
) -> Path:
    """Dataset `kind` written as a Minari dataset, with its references, description and the build's record
    (``rlt_build``: kind, seed, algorithm, fingerprint and, for the medium kinds, the medium checkpoint)."""
    build_info: dict[str, Any] = {
        "kind": kind,
        "seed": config.seed,
        "algo": f"sb3/{algo}",
        "fingerprint": build_fp,
    }
    if kind in ("medium", "medium-replay", "medium-expert"):
        build_info.update(medium_step=training.medium_step, medium_eval_return=training.medium_eval_return)
    extra: dict[str, Any] = {"rlt_build": build_info, "ref_scores_source": ref_source}
    if ref_source == "measured":
        extra["num_episodes_average_score"] = config.num_ref_episodes
    if kind == "medium-expert":
        extra["combined_datasets"] = [config.dataset_id("medium"), config.dataset_id("expert")]
    return write_minari_dataset(
        config.dataset_id(kind),
        episodes,
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
