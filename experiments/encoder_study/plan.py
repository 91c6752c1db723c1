"""The encoder study's confirmation stage: tasks, encoders, tuning
settings, tuned parameters and jobs. Running it: :mod:`~experiments.encoder_study.stages`; documents:
:mod:`~experiments.encoder_study.report`; design and commands: docs/encoder_study.md.

- **Tasks** (:data:`RUNGS`): a memory-length ladder - POPGym RepeatPrevious Easy / Medium / Hard (the symbol
  k = 4 / 32 / 64 steps back, episodes of 51 / 103 / 155 steps; Morad et al. 2023, arXiv 2303.01859) and the
  passive T-Maze with corridors 10 / 30 / 100 / 400 (the cue of t = 0 used at t = L; Ni et al. 2023, arXiv
  2307.03864; 30 added on 2026-11-27, docs/encoder_study.md) - plus a control (PositionOnlyCartPoleEasy) and a noisy task (NoisyPositionOnlyCartPoleEasy).
  Each rung states its family, the score of the uniformly random policy and the maximum (normalized AUC and the
  "did not separate" rule), a budget (a stated cap, whole PPO updates of 2,048 env steps) and 16 evaluations.
- **Encoders** (:data:`ENCODERS`): the study's parameter-matched PPO rows (:func:`~rl_transformers.study.
  encoders.ppo_encoders`) by name.
- **Variants**: ``v2-untuned`` (the defaults) and ``v2-tuned`` (the best parameters of the encoder's tuning
  study, read as data: :func:`tuning_results`; a tuned reach shorter than a rung's memory is raised to cover
  it, :func:`covering_spec`). The variant is the job's ``preset``, so both are separate runs
  with separate records. An encoder without a finished tuning study has no tuned jobs: it is reported as
  "not tuned yet", never run with the defaults in the tuned column.
- **Candidate defaults** (:data:`CANDIDATES`): GTrXL with one setting changed, untuned only.
- **One learning-rate schedule** (:data:`ANNEAL_HORIZON`) in every job and every tuning trial.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rl_transformers.study import launch
from rl_transformers.study.encoders import Encoder, label, ppo_encoders, select
from rl_transformers.study.knobs import context_knob
from rl_transformers.study.records import Job
from rl_transformers.study.suite import BATCH, Task
from rl_transformers.study.tuning_space import SearchSpace
from rl_transformers.utils.errors import UserError, choice_hint

UNTUNED, TUNED = "v2-untuned", "v2-tuned"
VARIANTS = (UNTUNED, TUNED)
SEEDS = (0, 1, 2)
"""Test seeds (the study's; tuning trials use tuning seeds, disjoint from them: rl_transformers/tune/seeds.py)."""
ANNEAL_HORIZON = 1_048_576
"""Env steps H of the learning-rate anneal in every job and tuning trial: ``lr(s) = lr0 * (1 - s / H)``
whatever the budget (PPOConfig.anneal_horizon). H = 2^20 = 512 updates is above the largest budget (786,432),
so no run reaches a rate of 0 (the last update of the longest runs trains at 25 % of lr0), a run of budget B
follows exactly the first B steps of every longer run's schedule, and a learning rate tuned on the tuning task
means the same schedule on every rung."""
PPO_RECIPE: dict[str, Any] = {"anneal_horizon": ANNEAL_HORIZON}
"""PPOConfig fields of every job (the tuned variant adds learning_rate, ent_coef, seq_len)."""
JOB_EXTRAS: dict[str, Any] = {}
"""Extra job fields of every job (tests: num_envs, eval_episodes)."""
ENCODERS = ("gtrxl", "full", "gaussian_prior", "lsh", "performer", "block_local_2d", "compressive", "knn",
            "gru", "lstm", "mlp")  # fmt: skip
"""The confirmation rows: GTrXL, full, gaussian_prior, lsh, a kernel attention (performer, with
rope), block_local_2d, compressive, knn, GRU, LSTM and the MLP floor."""
REFERENCE = "gru"
CANDIDATES = (
    Encoder("gtrxl_rope", "position=rope", "default candidate",
            "GTrXL with rope positions instead of xl_relative: the one-flag fix found on RepeatPreviousEasy (docs/results/xl_relative.md)"),
    Encoder("gtrxl_critic", "critic=separate", "default candidate",
            "GTrXL with a separate critic core (docs/results/xl_relative.md section 7); twice the core's parameters"),
)  # fmt: skip
"""Candidate defaults ("when a setting wins across the ladder, it becomes the default"): GTrXL with
one setting changed, run **untuned only** on every rung and seed, beside the rows. They are settings, not
encoders: never tuned, not parameter-matched (the separate critic doubles the core), and compared with the
untuned GTrXL, which is the default they would replace (added 2026-11-27, after 214 runs)."""
CANDIDATE_NAMES = frozenset(e.name for e in CANDIDATES)
CANDIDATE_RATE = {"gtrxl_rope": ("gtrxl", 1.0), "gtrxl_critic": ("gtrxl", 0.5)}
"""For cost estimates before a candidate has run: (the row whose rate it takes, factor)."""


@dataclass(frozen=True)
class Rung:
    """One task of the ladder."""

    name: str
    env_id: str
    family: str
    updates: int
    """Budget in PPO updates of 2,048 env steps (a cap: see docs/encoder_study.md)."""
    low: float
    """Expected return of the uniformly random policy (normalized score 0)."""
    high: float = 1.0
    """Maximum return (normalized score 1)."""
    memory: int = 0
    """Steps between the cue and its use (0: no memory needed beyond a few steps)."""
    memoryless: float | None = None
    """Best expected return without memory, where it is above the random score (T-Maze: on schedule, then a
    coin-flip turn: :data:`TMAZE_MEMORYLESS`); None where a memoryless policy does no better than random
    (RepeatPrevious) or the level is not defined (CartPole)."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def budget(self) -> int:
        return self.updates * BATCH

    @property
    def eval_every(self) -> int:
        return self.budget // EVALUATIONS

    def task(self) -> Task:
        return Task(self.name, "ppo", self.family, {v: self.budget for v in VARIANTS},
                    {v: self.eval_every for v in VARIANTS}, self.env_id, dict(self.env_kwargs),
                    score_note="POPGym MMER on [-1, 1]" if "popgym" in self.env_id else "greedy return")  # fmt: skip

    def normalized(self, value: float) -> float:
        """``value`` on [random, max] = [0, 1], clipped (the scale of :func:`~rl_transformers.study.aggregate.
        normalized_auc`)."""
        return min(1.0, max(0.0, (value - self.low) / (self.high - self.low)))


EVALUATIONS = 16
"""Greedy evaluations per run (16 episodes each), evenly spaced; every budget is a multiple of 16 updates."""
RANDOM_REPEAT = -0.5
"""RepeatPrevious: each scored step gives +-1 / (T - k), right with probability 1/4: E = (1/4 - 3/4) = -0.5."""
RANDOM_CARTPOLE = 0.113
"""PositionOnlyCartPole (noisy or not): reward 1/200 per step; a random policy lasts 22.7 steps (measured over
200 episodes, standard error 0.004; tests/experiments/encoder_study/test_report.py checks it)."""


TMAZE_MEMORYLESS = 0.5
"""T-Maze: a memoryless policy reaches the junction on schedule (no penalty) and guesses the turn: goal reward 1
half of the time (envs/tmaze.py)."""


def _tmaze_random(length: int) -> float:
    from envs.tmaze import random_policy_return

    return round(random_policy_return(length), 4)


def _popgym(name: str) -> str:
    return f"rlt/popgym-{name}-v0"


RUNGS: tuple[Rung, ...] = (
    Rung("RepeatPreviousEasy", _popgym("RepeatPreviousEasy"), "RepeatPrevious", 128, RANDOM_REPEAT, memory=4),
    Rung("RepeatPreviousMedium", _popgym("RepeatPreviousMedium"), "RepeatPrevious", 256, RANDOM_REPEAT,
         memory=32),
    Rung("RepeatPreviousHard", _popgym("RepeatPreviousHard"), "RepeatPrevious", 384, RANDOM_REPEAT, memory=64),
    Rung("TMaze10", "rlt/TMaze-v0", "T-Maze", 64, _tmaze_random(10), memory=10, memoryless=TMAZE_MEMORYLESS,
         env_kwargs={"corridor_length": 10}),
    Rung("TMaze30", "rlt/TMaze-v0", "T-Maze", 96, _tmaze_random(30), memory=30, memoryless=TMAZE_MEMORYLESS,
         env_kwargs={"corridor_length": 30}),
    Rung("TMaze100", "rlt/TMaze-v0", "T-Maze", 128, _tmaze_random(100), memory=100, memoryless=TMAZE_MEMORYLESS,
         env_kwargs={"corridor_length": 100}),
    Rung("TMaze400", "rlt/TMaze-v0", "T-Maze", 256, _tmaze_random(400), memory=400, memoryless=TMAZE_MEMORYLESS,
         env_kwargs={"corridor_length": 400}),
    Rung("PositionOnlyCartPoleEasy", _popgym("PositionOnlyCartPoleEasy"), "control", 96, RANDOM_CARTPOLE),
    Rung("NoisyPositionOnlyCartPoleEasy", _popgym("NoisyPositionOnlyCartPoleEasy"), "noisy", 96,
         RANDOM_CARTPOLE),
)  # fmt: skip
"""The ladder. Budgets (caps): RepeatPrevious 262k / 524k / 786k, T-Maze 131k / 262k / 524k, control and noisy
197k env steps (the GTrXL default with rope solved RepeatPreviousEasy at 98k-131k steps)."""


def rungs(names: tuple[str, ...] = ()) -> tuple[Rung, ...]:
    """The ladder's rungs (all, or these names; an unknown one is a UserError naming the closest)."""
    known = [r.name for r in RUNGS]
    for name in names:
        if name not in known:
            raise UserError(f"unknown task {name!r}; {choice_hint(name, known)}", source="--tasks")
    return tuple(r for r in RUNGS if not names or r.name in names)


def rung(name: str) -> Rung:
    return next(r for r in RUNGS if r.name == name)


def encoder_rows() -> list[Encoder]:
    """The confirmation's encoders, parameter-matched as in the study (about 5 s: every registry entry is built)."""
    every, _ = ppo_encoders(match=True)
    return select(every, ENCODERS, source="ENCODERS")


def memory_rungs(family: str) -> list[Rung]:
    """The family's rungs that have a memory length, shortest first."""
    return sorted((r for r in RUNGS if r.family == family and r.memory), key=lambda r: r.memory)


def ladder_families() -> list[str]:
    """The families with a memory-length ladder (rungs with a memory), in RUNGS order."""
    return list(dict.fromkeys(r.family for r in RUNGS if r.memory))


# -- tuning ---------------------------------------------------------------------------------------------------
TUNING_TASK = "RepeatPreviousEasy"
"""Every encoder is tuned on this rung (k = 4), with the same budget, trials, space and objective. It was
RepeatPreviousMedium (k = 32) until every trial of the first three encoders tuned there (gtrxl, full, performer:
24 trials) ended within 0.05 of the random score -0.5: a task on which nothing learns in a trial's budget tunes
nothing. On Easy the GTrXL default stays at chance while rope or a memory of 8 solves it in 98k-131k steps
so the trials can separate."""
TUNING_PRUNER_WARMUP = 131_072
"""Env steps before a tuning trial may be pruned (half its budget): memory tasks are learned late (Easy at
98k-131k steps), and a median pruner from the first evaluation stopped trials at 16k steps on noise."""
TUNING_UPDATES = 128
"""Budget of a tuning trial: 128 updates (262,144 env steps; half the rung's confirmation budget)."""
TRIALS = 8
"""Finished trials per encoder (the same number for every encoder, at least 8)."""
TUNING_OBJECTIVE = "mean"
"""A trial's score: the mean of its evaluations (the area under its evaluation curve: sample efficiency)."""
TUNING_EVAL_EVERY = 16_384


TUNING_SPACE = SearchSpace(param_tolerance=None)
"""The tuner's search space as this study's tuning ran: its defaults, with capacity knobs (the RNNs' hidden size,
random features) searched over half to twice their value whatever the parameter count, which let the tuned GRU
and LSTM rows grow to about twice the other rows' parameters (the page shows every row's count). Every tuning
result read back must be a point of it."""


def tuning_settings() -> dict[str, Any]:
    """What a tuned result depends on, besides the encoder (part of each tuning study's name)."""
    r = rung(TUNING_TASK)
    return {"task": r.name, "env_id": r.env_id, "env_kwargs": r.env_kwargs, "budget": TUNING_UPDATES * BATCH,
            "eval_every": TUNING_EVAL_EVERY, "trials": TRIALS, "objective": TUNING_OBJECTIVE,
            "pruner_warmup_steps": TUNING_PRUNER_WARMUP,
            "ppo": PPO_RECIPE, "space": _space_fields()}  # fmt: skip


def _space_fields() -> dict[str, Any]:
    """:data:`TUNING_SPACE` as the tuning studies' names hash it: without ``param_tolerance``, a field added after
    they ran (its value here, None, is the range they ran with), so the committed studies keep their names."""
    return {k: v for k, v in asdict(TUNING_SPACE).items() if k != "param_tolerance"}


def study_name(encoder: Encoder) -> str:
    """The tuning study of an encoder: its name and a hash of its spec and :func:`tuning_settings`, so a result
    of other settings or another spec is never read as this one's."""
    body = json.dumps({"spec": encoder.spec, **tuning_settings()}, sort_keys=True)
    return f"v2-{label(encoder.name)}-{hashlib.sha256(body.encode()).hexdigest()[:8]}"


@dataclass(frozen=True)
class Tuned:
    """An encoder's tuned configuration: the spec with its knob applied and the tuned PPO fields."""

    spec: str
    ppo: dict[str, Any]
    params: dict[str, Any]
    entry: dict[str, Any]
    """The tuning result as read (best.json fields)."""


def tuned_config(encoder: Encoder, entry: Any, source: str) -> Tuned:
    """The tuned configuration of ``encoder`` from a best.json-like ``entry`` (UserError naming ``source`` when
    its parameters are not the tuner's: outside :data:`TUNING_SPACE`, an encoder above the memory limit at the
    jobs' envs, or a value or curve point outside the tuning task's possible returns)."""
    params = entry.get("params") if isinstance(entry, dict) else None
    if not isinstance(params, dict):
        raise UserError(f"tuning result of {encoder.name!r} has no 'params' object", source=source)
    knob = context_knob(encoder.spec)
    allowed = {"learning_rate", "ent_coef", "seq_len"} | ({knob.name} if knob else set())
    unknown = sorted(set(params) - allowed)
    missing = sorted({"learning_rate", "ent_coef", "seq_len"} - set(params))
    if unknown or missing:
        raise UserError(f"tuning result of {encoder.name!r}: unknown parameters {unknown}, missing {missing}; "
                        f"expected {sorted(allowed)}", source=source)  # fmt: skip
    for key, value in params.items():
        ok = (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and math.isfinite(value)
            and value > 0
        )
        if not ok or (key not in ("learning_rate", "ent_coef") and not isinstance(value, int)):
            raise UserError(f"tuning result of {encoder.name!r}: {key} = {value!r} is not a valid value",
                            source=source)  # fmt: skip
    _check_tuned(encoder, entry, knob, source)
    spec = (
        knob.apply(encoder.spec, params[knob.name])
        if knob is not None and knob.name in params
        else encoder.spec
    )
    ppo = {k: params[k] for k in ("learning_rate", "ent_coef", "seq_len")}
    return Tuned(spec, ppo, dict(params), dict(entry))


def _check_tuned(encoder: Encoder, entry: dict[str, Any], knob: Any, source: str) -> None:
    from envs.registry import return_bounds
    from rl_transformers.algos.ppo_config import TrainConfig
    from rl_transformers.study.tuning_checks import check_params, value_problem

    what = f"tuning result of {encoder.name!r}"
    envs = int(JOB_EXTRAS.get("num_envs", TrainConfig.__dataclass_fields__["num_envs"].default))  # type: ignore[arg-type]
    check_params(entry["params"], TUNING_SPACE, knob, encoder.spec, (envs, 1), f"{source} ({what})")
    r = rung(TUNING_TASK)
    bounds = return_bounds(r.env_id, r.env_kwargs)
    curve = entry.get("curve")
    points: list[Any] = curve if isinstance(curve, list) else []
    tail = [("curve point", p[-1] if isinstance(p, list) and p else p) for p in points]
    for name, value in [("value", entry.get("value")), *tail]:
        why = value_problem(value, bounds, name)
        if why is not None:
            raise UserError(f"{what}: {why}", source=source)


def tuning_results(encoders: list[Encoder], committed: Path | None, tune_out: Path) -> dict[str, Tuned | str]:
    """{encoder name: its Tuned configuration, or why it has none}. The committed tuning file (``committed``,
    written by the tune stage) first, then the local ``<tune_out>/<study>/best.json``; a result counts only when
    its study is this encoder's (:func:`study_name`) and it finished :data:`TRIALS` trials (``committed`` None:
    the local results only)."""
    from rl_transformers.study.records import read_json

    exists = committed is not None and committed.exists()
    saved = read_json(committed) if committed is not None and exists else {}
    if exists and not (isinstance(saved, dict) and isinstance(saved.get("encoders"), dict)):
        raise UserError("expected a JSON object with an 'encoders' object", source=str(committed))
    out: dict[str, Tuned | str] = {}
    for e in encoders:
        name = study_name(e)
        local = tune_out / name / "best.json"
        entries = saved.get("encoders", {}) if isinstance(saved, dict) else {}
        found = [
            (str(committed), entries.get(e.name)),
            (str(local), read_json(local) if local.exists() else None),
        ]
        why = "not tuned yet"
        for source, entry in found:
            if not isinstance(entry, dict):
                continue
            trials = entry.get("finished_trials")
            if entry.get("study") != name:
                why = f"tuned under other settings (study {entry.get('study')!r}, now {name!r}): tune again"
            elif not isinstance(trials, int) or trials < TRIALS:
                why = f"tuning incomplete ({trials} of {TRIALS} trials)"
            else:
                out[e.name] = tuned_config(e, entry, source)
                break
        else:
            out[e.name] = why
    return out


# -- jobs -----------------------------------------------------------------------------------------------------
def covering_spec(spec: str, memory: int) -> str:
    """``spec`` with its reach knob (:func:`~rl_transformers.study.knobs.context_knob`: ``mem_len``, ``max_cache``,
    ``store_size``, ...) raised to ``memory + 1`` when it is below the rung's ``memory``; unchanged otherwise, and
    for capacity knobs (``hidden_size``, ``n_features``) and encoders without a knob.

    The tuned variant's rule (changed 2026-11-27, docs/encoder_study.md): the knob is tuned on
    RepeatPreviousEasy (k = 4), where a short context wins, and a reach of 4 cannot see a cue 100 steps back on
    T-Maze 100. Raised this way, a tuned encoder fails a long rung only if it cannot *learn* the dependency, not
    because its context cannot hold it: the literature's recipes set the context to the task's dependency, and
    the memory probe's "cover" bound uses the same value (``Knob.covering``). The untuned variant keeps the
    defaults, what a user gets.
    """
    knob = context_knob(spec)
    if knob is None or knob.kind != "reach" or knob.default >= memory:
        return spec
    return knob.apply(spec, knob.covering(memory))


def make_job(
    r: Rung, encoder: Encoder, variant: str, seed: int, out: Path, tuned: Tuned | None = None
) -> Job:
    """The job of one (rung, encoder, variant, seed); the tuned variant needs ``tuned``."""
    spec, ppo = encoder.spec, dict(PPO_RECIPE)
    if variant == TUNED:
        if tuned is None:
            raise ValueError(f"the tuned job of {encoder.name!r} needs its tuning result")
        spec, ppo = covering_spec(tuned.spec, r.memory), {**ppo, **tuned.ppo}
    row = Encoder(encoder.name, spec, encoder.family, encoder.note)
    return launch.make_job(r.task(), row, seed, variant, out, ppo=ppo, **JOB_EXTRAS)


def plan(
    tasks: tuple[Rung, ...],
    encoders: list[Encoder],
    seeds: tuple[int, ...],
    tuned: dict[str, Tuned | str],
    out: Path,
) -> list[Job]:
    """Rung-major, then seed, encoder and variant (short budgets first; partial results cover encoders evenly).
    Tuned jobs only for encoders with a tuning result (never for :data:`CANDIDATES`)."""
    jobs = []
    for r in sorted(tasks, key=lambda t: t.budget):
        for seed in seeds:
            for e in encoders:
                jobs.append(make_job(r, e, UNTUNED, seed, out))
                t = tuned.get(e.name)
                if isinstance(t, Tuned):
                    jobs.append(make_job(r, e, TUNED, seed, out, t))
    return jobs
