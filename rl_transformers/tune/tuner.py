"""Tune any encoder on any task with Optuna (Akiba et al. 2019, arXiv 1907.10902): ``scripts/tune.py``.

The set-up rl-baselines3-zoo made common for RL: a TPE sampler (Bergstra et al. 2011) that samples at random for
its first ``n_startup_trials`` trials and models the good region afterwards; a median pruner that stops a trial
whose intermediate evaluation is below the median of earlier trials at the same step (after the same number of
startup trials, and never before ``pruner_warmup_steps`` env steps: by default a third of the budget, rl-zoo's
warm-up); and a study stored in SQLite, so a killed
tuning run resumes where it stopped: a second invocation with the same ``--out`` and study name adds only the
missing trials (``n_trials`` counts finished trials: complete or pruned), and a trial left running by a killed
process is failed by Optuna's heartbeat and retried once. A study refuses to be continued with other settings
(task, budget, encoder, search space, objective, ...): those are stored with it.

A trial: sample the space (:class:`~rl_transformers.study.tuning_space.SearchSpace`), train PPO with the public
API (``rl_transformers.train_ppo``) on its own tuning seed (:func:`~rl_transformers.tune.seeds.tuning_seed`,
disjoint from the test seeds), evaluate greedily every ``eval_every`` env steps and after the last update (the
trainer's ``evaluate``: ``eval_episodes`` fresh episodes), report each evaluation to the pruner, and score the
trial by the last evaluation (``objective="final"``) or the mean of all of them (``"mean"``: the normalised
area under the evaluation curve). Each trial's run directory is ``<out>/<study>/trial_<n>/``; every trial
(parameters, seed, value, evaluation curve) is written to ``<out>/<study>/trials.json`` and the best one so far
to ``<out>/<study>/best.json`` with the command that trains it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from envs.registry import return_bounds
from rl_transformers.algos.ppo_config import PPOConfig, TrainConfig
from rl_transformers.study.encoders import label, parse_spec, policy_config
from rl_transformers.study.knobs import Knob, context_knob
from rl_transformers.study.tuning_checks import check_params
from rl_transformers.study.tuning_space import SearchSpace, capacity_range
from rl_transformers.tune.seeds import tuning_seed
from rl_transformers.tune.study_check import check_trials, storage_error
from rl_transformers.utils.atomic import atomic_write_json
from rl_transformers.utils.cli import JsonDict
from rl_transformers.utils.errors import UserError, choice_hint

SETTINGS_ATTR = "rlt_settings"
"""Study user attribute holding the settings a study was created with (compared on every reopening)."""
PER_INVOCATION = ("n_trials", "out", "threads", "study_name", "device", "max_memory_gib")
"""Fields that may change between invocations of one study."""


@dataclass(frozen=True)
class TuneConfig:
    """A tuning study (``scripts/tune.py``)."""

    encoder: str = "gtrxl"
    """A study encoder name (parameter-matched as in scripts/encoder_study.py) or an override string such as
    'attention=local;position=rope;memory=None' (rl_transformers/study/encoders.py)."""
    env_id: str = "rlt/popgym-RepeatPreviousEasy-v0"
    """Task (any Gymnasium id the trainer accepts)."""
    env_kwargs: JsonDict = field(default_factory=dict)
    """Keyword arguments of gym.make, as JSON."""
    total_timesteps: int = 196_608
    """Env steps per trial."""
    num_envs: int = 32
    """Parallel envs per trial."""
    ppo: PPOConfig = field(default_factory=PPOConfig)
    """PPO settings; the searched ones (learning rate, entropy, seq_len) are replaced per trial."""
    eval_every: int = 16_384
    """Env steps between the greedy evaluations reported to the pruner (one also follows the last update)."""
    eval_episodes: int = 16
    """Episodes per evaluation."""
    n_trials: int = 8
    """Finished trials (complete or pruned) the study should hold; a resumed study runs the missing ones."""
    study_name: str | None = None
    """Default: <encoder>-<env id>."""
    out: Path = Path("runs/tune")
    """<out>/<study>.db (the Optuna storage) and <out>/<study>/ (trial runs, best.json)."""
    objective: Literal["final", "mean"] = "final"
    """Trial score: the last evaluation's mean return, or the mean over all evaluations (area under the curve)."""
    space: SearchSpace = field(default_factory=SearchSpace)
    """The search space."""
    sampler_seed: int = 0
    """Seed of the TPE sampler."""
    n_startup_trials: int = 4
    """Random trials before TPE models the results; also the trials the pruner waits for."""
    pruner_warmup_steps: int | None = None
    """Env steps before a trial may be pruned (0: from its first evaluation). Default: a third of
    --total-timesteps, as rl-zoo's pruner waits for a third of a trial's evaluations (early evaluations at a
    task's chance level differ by noise alone, so a pruner acting on them stops trials at random)."""
    threads: int = 1
    """torch threads per trial."""
    device: str = "auto"
    """torch device of the trials."""
    max_memory_gib: float | None = None
    """Largest memory estimate a trial's encoder may need at --num-envs (default 4 GiB; parameters read from the
    study file and the knob's range are checked against it before anything is built): raise it knowingly."""

    def __post_init__(self) -> None:
        for name in ("total_timesteps", "num_envs", "eval_every", "eval_episodes", "n_trials"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise UserError(f"must be an integer >= 1, got {getattr(self, name)!r}", source=_flag(name))
        if self.objective not in ("final", "mean"):
            raise UserError(f"{choice_hint(self.objective, ('final', 'mean'))}", source="--objective")
        if self.n_startup_trials < 0 or (self.pruner_warmup_steps or 0) < 0:
            raise UserError("--n-startup-trials and --pruner-warmup-steps must be >= 0")

    @property
    def name(self) -> str:
        return self.study_name or label(f"{self.encoder}-{self.env_id}")

    def settings(self) -> dict[str, Any]:
        """What a trial's value depends on (stored with the study, JSON-compatible)."""
        data = {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in PER_INVOCATION
        }
        return json.loads(json.dumps(data, default=_plain))


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return str(value)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def resolve_encoder(name: str) -> str:
    """The override string of a study encoder name, or ``name`` itself when it is an override string."""
    if "=" in name or name == "":
        parse_spec(name)  # a bad field is a ValueError naming it
        return name
    from rl_transformers.study.encoders import ppo_encoders, select

    encoders, _ = ppo_encoders(match=True)
    return select(encoders, (name,), source="--encoder")[0].spec


def _flag_args(flag: str, value: Any) -> list[str]:
    if isinstance(value, bool):
        head, _, name = flag.rpartition(".")
        return [flag if value else f"{head}.no-{name}" if head else f"--no-{name.lstrip('-')}"]
    return [flag, json.dumps(value) if isinstance(value, (dict, list)) else str(value)]


def train_command(cfg: TuneConfig, spec: str, params: dict[str, Any]) -> str:
    """A ``scripts/train_gtrxl.py`` command that trains the encoder ``spec`` (knob already applied) with
    ``params`` on the study's task, budget and PPO settings (its seed left to the user: a test seed)."""
    args = ["python", "scripts/train_gtrxl.py", "--env-id", cfg.env_id]
    if cfg.env_kwargs:
        args += ["--env-kwargs", json.dumps(cfg.env_kwargs)]
    args += ["--total-timesteps", str(cfg.total_timesteps), "--num-envs", str(cfg.num_envs)]
    for key, value in parse_spec(spec).items():
        flag = {"policy": "--policy", "hidden_size": "--hidden-size"}.get(key, f"--backbone.{key}")
        args += _flag_args(flag.replace("_", "-"), value)
    searched = {
        "learning_rate": params["learning_rate"],
        "ent_coef": params["ent_coef"],
        "seq_len": params["seq_len"],
    }
    ppo = dataclasses.replace(cfg.ppo, **searched)
    default = PPOConfig()
    for f in dataclasses.fields(PPOConfig):
        value = getattr(ppo, f.name)
        if f.name in searched or value != getattr(default, f.name):
            args += _flag_args(f"--ppo.{f.name}".replace("_", "-"), value)
    return shlex.join(args)


def trial_config(
    cfg: TuneConfig, spec: str, params: dict[str, Any], seed: int, run_root: Path
) -> TrainConfig:
    ppo = dataclasses.replace(
        cfg.ppo, learning_rate=params["learning_rate"], ent_coef=params["ent_coef"], seq_len=params["seq_len"]
    )
    return TrainConfig(
        env_id=cfg.env_id,
        env_kwargs=dict(cfg.env_kwargs),
        total_timesteps=cfg.total_timesteps,
        num_envs=cfg.num_envs,
        policy=policy_config(spec),
        ppo=ppo,
        seed=seed,
        eval_every=0,  # the tuner evaluates itself, so it can report to the pruner and stop early
        progress=False,
        threads=cfg.threads,
        device=cfg.device,
        run_root=run_root,
    )


class Objective:
    """The Optuna objective of one study (see the module docstring)."""

    def __init__(self, cfg: TuneConfig, spec: str, knob: Knob | None) -> None:
        self.cfg, self.spec, self.knob = cfg, spec, knob
        self.runs = Path(cfg.out) / cfg.name

    def __call__(self, trial: Any) -> float:
        import optuna

        import rl_transformers as rlt

        cfg = self.cfg
        seed = tuning_seed(trial.number)
        params = cfg.space.sample(trial, self.knob)
        check_params(params, cfg.space, self.knob, self.spec, (cfg.num_envs, params["seq_len"]),
                     f"trial {trial.number} of study {cfg.name!r}", cfg.max_memory_gib)  # fmt: skip
        spec = self.spec
        if self.knob is not None and self.knob.name in params:
            spec = self.knob.apply(spec, params[self.knob.name])
        train = trial_config(cfg, spec, params, seed, self.runs)
        n_updates = cfg.total_timesteps // (cfg.num_envs * train.ppo.num_steps)
        batch = cfg.num_envs * train.ppo.num_steps
        trial.set_user_attr("seed", seed)
        trial.set_user_attr("spec", spec)
        curve: list[list[float]] = []
        pruned, updates = False, 0

        def after_update(trainer: Any) -> bool | None:
            nonlocal pruned, updates
            updates += 1
            step = updates * batch
            if step // cfg.eval_every == (step - batch) // cfg.eval_every and updates < n_updates:
                return None  # no evaluation due
            returns, _ = trainer.evaluate(cfg.eval_episodes)
            value = float(returns.mean())
            curve.append([step, value])
            trial.report(value, step)
            if updates < n_updates and trial.should_prune():
                pruned = True
                return False  # the trainer saves and stops
            return None

        result = rlt.train_ppo(train, self.runs / f"trial_{trial.number}", callback=after_update)
        trial.set_user_attr("curve", curve)
        trial.set_user_attr("run_dir", str(result.run_dir))
        if result.interrupted and not pruned:  # Ctrl-C / SIGTERM: the trainer saved and returned early; its
            # curve is cut short, so the trial is no result: it fails (Optuna re-raises) and the study stops
            raise KeyboardInterrupt(f"trial {trial.number} stopped by a signal at step {result.step}")
        if pruned:
            raise optuna.TrialPruned(f"pruned at step {curve[-1][0]} (value {curve[-1][1]:.3g})")
        if not curve:
            raise RuntimeError(f"trial {trial.number} ended before its first evaluation (step {result.step})")
        values = [v for _, v in curve]
        return values[-1] if cfg.objective == "final" else sum(values) / len(values)


def warmup_steps(total_timesteps: int, pruner_warmup_steps: int | None) -> int:
    """Env steps before the pruner may stop a trial (``--pruner-warmup-steps``, default a third of the budget)."""
    return total_timesteps // 3 if pruner_warmup_steps is None else pruner_warmup_steps


def study_file(cfg: TuneConfig) -> Path:
    return Path(cfg.out) / f"{cfg.name}.db"


def open_study(cfg: TuneConfig, spec: str, log: Any = print) -> Any:
    """Create, or reopen, the study in ``<out>/<study>.db``; other settings than the stored ones are refused, and
    every stored trial is checked (:mod:`rl_transformers.tune.study_check`): a file that is not this study's
    results, or that cannot be read, is a :class:`UserError`."""
    from sqlalchemy.exc import SQLAlchemyError

    Path(cfg.out).mkdir(parents=True, exist_ok=True)
    try:
        study = _open_study(cfg, spec)
        bounds = return_bounds(cfg.env_id, dict(cfg.env_kwargs))
        check_trials(study, cfg.space, context_knob(spec), bounds, study_file(cfg), log)
    except (SQLAlchemyError, ValueError, TypeError, KeyError, IndexError, RuntimeError) as err:
        if isinstance(err, UserError):
            raise
        raise storage_error(study_file(cfg), err) from None
    return study


def _open_study(cfg: TuneConfig, spec: str) -> Any:
    import warnings

    import optuna
    from optuna.storages import RDBStorage

    # A trial left running by a killed process stops beating and is failed, then retried once (the callback's
    # name changed in Optuna 4.9).
    retry = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        stale: dict[str, Any] = (
            {"heartbeat_stale_trial_callback": retry(max_retry=1)}
            if retry is not None
            else {"failed_trial_callback": optuna.storages.RetryFailedTrialCallback(max_retry=1)}
        )
        storage = RDBStorage(
            f"sqlite:///{Path(cfg.out).resolve() / (cfg.name + '.db')}",
            heartbeat_interval=60,
            grace_period=180,
            **stale,
        )
    pruner = optuna.pruners.MedianPruner(
        n_startup_trials=cfg.n_startup_trials,
        n_warmup_steps=warmup_steps(cfg.total_timesteps, cfg.pruner_warmup_steps),
    )
    study = optuna.create_study(
        study_name=cfg.name, storage=storage, pruner=pruner, direction="maximize", load_if_exists=True
    )
    settings = {**cfg.settings(), "spec": spec}
    saved = study.user_attrs.get(SETTINGS_ATTR)
    if saved is None:
        study.set_user_attr(SETTINGS_ATTR, settings)
    elif saved != settings:
        keys = sorted(k for k in {*saved, *settings} if saved.get(k) != settings.get(k))
        diff = "; ".join(f"{k}: stored {saved.get(k)!r}, now {settings.get(k)!r}" for k in keys)
        raise UserError(
            f"study {cfg.name!r} was created with other settings ({diff}); give those again to resume it, or "
            "choose another --study-name / --out",
            source=str(Path(cfg.out) / f"{cfg.name}.db"),
        )
    # A sampler seeded per resume point: a reopened study does not redraw its first trials' random points.
    n_before = len(study.trials)
    study.sampler = optuna.samplers.TPESampler(
        seed=cfg.sampler_seed + n_before, n_startup_trials=cfg.n_startup_trials
    )
    return study


def finished(study: Any) -> list[Any]:
    from optuna.trial import TrialState

    return [t for t in study.trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]


def run_tuning(cfg: TuneConfig, log: Any = print) -> Any:
    """Run (or resume) the study until it holds ``n_trials`` finished trials; returns the Optuna study."""
    import optuna

    from rl_transformers.utils.training import NonFiniteError

    spec = resolve_encoder(cfg.encoder)
    knob = context_knob(spec)
    cfg.space.check(knob, cfg.ppo.num_steps, cfg.encoder)
    cfg = with_capacity_range(cfg, spec, knob, log)
    for window in cfg.space.seq_len:  # PPO's own checks (minibatches divide the sequences, ...) up front
        point = {
            "learning_rate": cfg.space.learning_rate[0],
            "ent_coef": cfg.space.ent_coef[0],
            "seq_len": window,
        }
        trial_config(cfg, spec, point, tuning_seed(0), Path(cfg.out))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    check_knob_range(cfg, spec, knob)
    study = open_study(cfg, spec, log)
    todo = cfg.n_trials - len(finished(study))
    log(
        f"study {cfg.name!r}: {len(finished(study))} finished trials, {max(todo, 0)} to run (encoder {spec or 'gtrxl'})"
    )

    def report(study: Any, trial: Any) -> None:
        value = "" if trial.value is None else f" value {trial.value:.4g}"
        log(
            f"trial {trial.number} {trial.state.name.lower()}{value} seed {trial.user_attrs.get('seed')} {trial.params}"
        )

    if todo > 0:
        from sqlalchemy.exc import SQLAlchemyError

        try:
            study.optimize(
                Objective(cfg, spec, knob), n_trials=todo, catch=(NonFiniteError,), callbacks=[report]
            )
        except SQLAlchemyError as err:
            raise storage_error(study_file(cfg), err) from None
    write_trials(cfg, study)
    write_best(cfg, study)
    return study


def with_capacity_range(cfg: TuneConfig, spec: str, knob: Knob | None, log: Any = print) -> TuneConfig:
    """``cfg`` with the search range of a tuned capacity knob made explicit (``--space.knob``) by
    :func:`~rl_transformers.study.tuning_space.capacity_range`: the widths whose policy on ``cfg``'s task keeps
    its parameter count within ``--space.param-tolerance`` of the encoder's. Other knobs, an explicit range,
    ``--space.no-tune-knob`` and ``--space.param-tolerance None`` leave ``cfg`` as it is. The range is part of
    the study's stored settings, so a resumed study searches the same one."""
    space = cfg.space
    if knob is None or knob.kind != "capacity" or not space.tune_knob or space.knob is not None:
        return cfg
    if space.param_tolerance is None:
        return cfg
    import gymnasium as gym

    import envs  # noqa: F401  (registers the rlt/ ids)
    from rl_transformers.policies.sizing import count_policy_parameters

    env = gym.make(cfg.env_id, **cfg.env_kwargs)
    obs_space, act_space = env.observation_space, env.action_space
    env.close()

    @functools.cache  # the search and the log line ask for some widths twice
    def count(value: int) -> int:
        return count_policy_parameters(policy_config(knob.apply(spec, value)), obs_space, act_space)

    low, high = capacity_range(space, knob, count)
    log(
        f"{knob.name} searched in [{low}, {high}]: the widths whose policy has {count(low):,} to {count(high):,} "
        f"parameters, within {space.param_tolerance:.0%} of the encoder's {count(knob.default):,} "
        "(--space.param-tolerance)"
    )
    return dataclasses.replace(cfg, space=dataclasses.replace(space, knob=(low, high)))


def check_knob_range(cfg: TuneConfig, spec: str, knob: Knob | None) -> None:
    """Refuse a knob range whose high end gives an encoder above the memory limit (the range has no other upper
    bound: ``--space.knob 8 10000000``)."""
    if knob is None or not cfg.space.tune_knob:
        return
    high = {"learning_rate": cfg.space.learning_rate[0], "ent_coef": cfg.space.ent_coef[0],
            "seq_len": max(cfg.space.seq_len), knob.name: cfg.space.knob_range(knob)[1]}  # fmt: skip
    check_params(high, cfg.space, knob, spec, (cfg.num_envs, max(cfg.space.seq_len)), "--space.knob",
                 cfg.max_memory_gib)  # fmt: skip


def best_trial(study: Any) -> Any | None:
    """The complete trial of highest value (every trial was checked when the study was opened), or None.
    Trials of equal value (several at a task's maximum, common with ``objective="final"``) are told apart by
    the mean of their evaluations, so the one that got there sooner wins; then by the lower trial number."""
    from optuna.trial import TrialState

    complete = [t for t in study.trials if t.state == TrialState.COMPLETE]
    return max(complete, key=lambda t: (t.value, _curve_mean(t), -t.number)) if complete else None


def _curve_mean(trial: Any) -> float:
    values = list(trial.intermediate_values.values())
    return sum(values) / len(values) if values else float("-inf")


def rebuilt(cfg: TuneConfig, trial: Any) -> tuple[str, str]:
    """(encoder spec, training command) of ``trial``, rebuilt from its checked parameters and this study's
    settings, never read from the study file."""
    spec = resolve_encoder(cfg.encoder)
    knob = context_knob(spec)
    if knob is not None and knob.name in trial.params:
        spec = knob.apply(spec, trial.params[knob.name])
    return spec, train_command(cfg, spec, trial.params)


def write_trials(cfg: TuneConfig, study: Any) -> Path:
    """``<out>/<study>/trials.json``: every trial (as rl-zoo's trial report): its number, state, value, seed,
    parameters and evaluation curve, beside the study's settings, so a study can be read (and committed)
    without Optuna or its SQLite file."""
    path = Path(cfg.out) / cfg.name / "trials.json"
    trials = [
        {
            "trial": t.number,
            "state": t.state.name.lower(),
            "value": t.value,
            "seed": t.user_attrs.get("seed"),
            "params": t.params,
            "curve": [[step, value] for step, value in sorted(t.intermediate_values.items())],
        }
        for t in study.trials
    ]
    atomic_write_json(path, {"study": cfg.name, "settings": cfg.settings(), "trials": trials})
    return path


def write_best(cfg: TuneConfig, study: Any) -> Path | None:
    """``<out>/<study>/best.json``: the best complete trial, its parameters, seed and training command."""
    best = best_trial(study)
    if best is None:
        return None
    spec, command = rebuilt(cfg, best)
    path = Path(cfg.out) / cfg.name / "best.json"
    atomic_write_json(
        path,
        {
            "study": cfg.name,
            "objective": cfg.objective,
            "value": best.value,
            "trial": best.number,
            "params": best.params,
            "seed": best.user_attrs.get("seed"),
            "spec": spec,
            "command": command,
            "curve": best.user_attrs.get("curve"),  # [step, value] per evaluation: shows the trial is whole
            "finished_trials": len(finished(study)),
        },
    )
    return path


__all__ = [
    "Objective",
    "TuneConfig",
    "best_trial",
    "open_study",
    "rebuilt",
    "resolve_encoder",
    "run_tuning",
    "train_command",
    "trial_config",
    "warmup_steps",
    "with_capacity_range",
    "write_trials",
]
