"""Configuration of a PPO run (:class:`TrainConfig`) and of the algorithm (:class:`PPOConfig`).

Every field is a flag of ``scripts/train_gtrxl.py`` (tyro): ``--ppo.seq-len 32``, ``--num-envs 8``, ... The
saved ``config.json`` of a run is a :class:`TrainConfig`; :func:`resume_config` decides which fields a
``--resume`` takes from the command line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

import tyro

from rl_transformers.backbone.options import (
    check_aux_weights,
    check_choice,
    check_divides,
    check_int,
    check_number,
    check_positive,
)
from rl_transformers.policies.gtrxl import PolicyConfig
from rl_transformers.runs.config import SHARED_RESUME_MUTABLE, RunConfig
from rl_transformers.utils.checks import (
    MAX_EVAL_EPISODES,
    MAX_NUM_ENVS,
    check_at_most,
    flag,
)
from rl_transformers.utils.cli import JsonDict
from rl_transformers.utils.errors import UserError

DEFAULT_ENV = "rlt/TMaze-v0"


@dataclass(frozen=True)
class PPOConfig:
    """PPO hyper-parameters (defaults: CleanRL's PPO, 2,048-step batches of 16-step training sequences)."""

    num_steps: int = 64
    """Rollout length per env per update."""
    seq_len: int = 16
    """Training window W: steps per training sequence (gradient flows through them); divides num_steps."""
    num_minibatches: int = 4
    """Minibatches per epoch (each holds num_envs * num_steps / seq_len / num_minibatches sequences)."""
    update_epochs: int = 4
    """Passes over the rollout per update."""
    learning_rate: float = 3e-4
    """Adam learning rate (annealed linearly to 0 when anneal_lr)."""
    anneal_lr: bool = True
    """Anneal the learning rate linearly to 0 (over anneal_horizon, else over the run's budget)."""
    anneal_horizon: int | None = None
    """Env steps H over which the rate anneals, whatever the budget: lr(s) = learning_rate * max(0, 1 - s / H)
    at the env step s where an update starts, 0 after H (needs anneal_lr). None: over the budget, so the
    schedule depends on --total-timesteps (re-anchored when a resume changes it)."""
    adam_eps: float = 1e-5
    """Adam epsilon."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE λ."""
    clip_coef: float = 0.2
    """Clipping ε of the probability ratio (and of the value change when clip_vloss)."""
    anneal_clip: bool = False
    """Anneal the clip range with the learning rate (clip_coef x lr / learning_rate: linearly to 0 under
    anneal_lr), as rl-zoo's ``clip_range: lin_0.2``; needs anneal_lr."""
    clip_vloss: bool = True
    """Clip the value update around the rollout's values (SB3's default does not: clip_range_vf=None)."""
    vf_coef: float = 0.5
    """Value-loss weight."""
    ent_coef: float = 0.01
    """Entropy-bonus weight."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip."""
    target_kl: float | None = None
    """Stop the update's epochs once the approximate KL exceeds 1.5 x this (None: never)."""
    norm_adv: bool = True
    """Normalise advantages per minibatch."""
    norm_reward: bool = False
    """Scale rewards by the running std of the discounted return before GAE (algos/reward_norm.py), as SB3's
    VecNormalize(norm_reward=True), which rl-zoo's ``normalize: True`` turns on. Logged and evaluated returns
    stay in the env's units."""
    norm_reward_clip: float = 10.0
    """Clip of the scaled rewards (±)."""
    norm_obs_update: Literal["rollout", "step"] = "rollout"
    """When the observation normaliser (``--norm-obs``) merges new observations. rollout: once per rollout,
    after the epochs, so acting and training see one fixed normalisation per update. step: as SB3's
    ``VecNormalize`` (rl-zoo's ``normalize: True``): each observation joins the statistics when it arrives, the
    policy acts on it normalised by the statistics of that moment, and the rollout stores those normalised
    values, on which the epochs train (the first rollout is then normalised too). One process only."""
    aux_coef: float = 1.0
    """Default weight of backbone aux losses (ACT ponder cost, routing commitment, ...)."""
    aux_weights: dict[str, float] = field(default_factory=dict)
    """Per-name aux-loss weights overriding aux_coef."""
    info_every: int = 10
    """Log backbone diagnostics (gate openness, attention entropy, memory fill) every N updates (0: never)."""

    def __post_init__(self) -> None:
        for name in ("num_steps", "seq_len", "num_minibatches", "update_epochs"):
            check_int(f"PPOConfig.{name} ({flag('ppo.' + name)})", getattr(self, name), 1)
        if self.num_steps % self.seq_len:
            raise UserError(
                f"num_steps={self.num_steps} must be a multiple of seq_len={self.seq_len} "
                f"(--ppo.num-steps, --ppo.seq-len); "
                f"e.g. num_steps={self.seq_len * max(1, round(self.num_steps / self.seq_len))}"
            )
        for name in ("gamma", "gae_lambda"):
            check_number(f"{name} ({flag('ppo.' + name)})", getattr(self, name), low=0.0, high=1.0)
        for name in ("learning_rate", "adam_eps", "clip_coef", "max_grad_norm", "norm_reward_clip"):
            check_positive(f"{name} ({flag('ppo.' + name)})", getattr(self, name))
        for name in ("vf_coef", "aux_coef"):
            check_number(f"{name} ({flag('ppo.' + name)})", getattr(self, name), low=0.0)
        check_positive("target_kl (--ppo.target-kl)", self.target_kl, optional=True)
        check_int("info_every (--ppo.info-every)", self.info_every, 0)
        check_choice("norm_obs_update (--ppo.norm-obs-update)", self.norm_obs_update, ("rollout", "step"))
        if self.anneal_clip and not self.anneal_lr:
            raise UserError(
                "anneal_clip (--ppo.anneal-clip) follows the learning rate's anneal; drop --ppo.no-anneal-lr "
                "or --ppo.anneal-clip"
            )
        if self.anneal_horizon is not None:
            check_int("anneal_horizon (--ppo.anneal-horizon)", self.anneal_horizon, 1)
            if not self.anneal_lr:
                raise UserError(
                    f"anneal_horizon={self.anneal_horizon} (--ppo.anneal-horizon) needs an annealed rate; "
                    "drop --ppo.no-anneal-lr, or drop --ppo.anneal-horizon for a constant rate"
                )

    def horizon_rate(self, step: int) -> float:
        """The rate at env step ``step`` under ``anneal_horizon`` H: ``learning_rate * max(0, 1 - step / H)``."""
        if self.anneal_horizon is None:
            raise ValueError("horizon_rate needs anneal_horizon")
        return self.learning_rate * max(0.0, 1.0 - step / self.anneal_horizon)

    def clip_at(self, lr: float) -> float:
        """The clip range when the learning rate is ``lr`` (annealed with it under ``anneal_clip``)."""
        return self.clip_coef * lr / self.learning_rate if self.anneal_clip else self.clip_coef

    def aux_weight(self, name: str) -> float:
        return self.aux_weights.get(name, self.aux_coef)


@dataclass(frozen=True)
class TrainConfig(RunConfig):
    """A PPO run: environment, policy, algorithm and bookkeeping (shared run flags: :class:`RunConfig`; the env
    of rank r, env i is seeded with seed + r * num_envs + i)."""

    env_id: str = DEFAULT_ENV
    """Gymnasium id (``module:Env-v0`` imports the module first; ``rlt/...`` ids are the memory tasks)."""
    recipe: str = "auto"
    """Per-task recipe (rl_transformers/algos/ppo_recipes.yml, keyed by env id and policy): auto applies the
    task's entry over the file's default entry, where it has them (flags given still win), none keeps the
    library's defaults, or a YAML file of the same layout. config.json records the entries applied
    (file:line env/policy, joined by " + ") or none."""
    env_kwargs: JsonDict = field(default_factory=dict)
    """Keyword arguments of gym.make, as JSON (e.g. '{"corridor_length": 5}')."""
    total_timesteps: int = 300_000
    """Environment steps over all envs (and ranks), rounded down to whole updates of num_envs x num_steps
    (x ranks) steps: 200,000 with 32 x 64 runs 97 updates = 198,656 steps."""
    num_envs: int = 32
    """Parallel envs per process (more envs amortise the per-step cost of the policy forward)."""
    init_from: str | None = None
    """Start from the policy weights (observation normaliser included) of a PPO checkpoint file or run
    directory, with a fresh optimizer, schedule and step counter: a curriculum or fine-tuning stage, as
    rl-zoo's ``--trained-agent`` (which also keeps the optimizer). The policy flags must build the same weights;
    memory lengths and other weight-free options may differ; the reward scaler (--ppo.norm-reward) starts
    afresh. A resumed run keeps its own weights."""
    policy: Annotated[PolicyConfig, tyro.conf.arg(name="")] = field(default_factory=PolicyConfig)
    """Policy (--policy transformer|lstm|gru|mlp, --backbone.*)."""
    ppo: PPOConfig = field(default_factory=PPOConfig)
    """PPO hyper-parameters."""
    vectorization: Literal["sync", "async"] = "sync"
    """Vector env: sync (one process; exact resume) or async (one subprocess per env, started by Python's default
    method: fork on Linux before Python 3.14, where a script needs no main guard; elsewhere guard the code that
    trains with if __name__ == "__main__")."""
    torch_deterministic: bool = False
    """Ask torch for deterministic kernels (GPU)."""
    compile: bool = False
    """torch.compile (inductor) the acting step (policies/compile.py): falls back to eager with a one-line
    message when compilation fails, prints the compile time. Equal to eager up to rounding, not bit for bit.
    Measured on an idle 2-core machine (benchmarks/results/ppo_compile): rollout 1.6x eager, whole update
    ~1.15x; off by default because a cold compile takes about 2 minutes (seconds from inductor's cache, kept in
    ~/.cache/rl_transformers/inductor unless TORCHINDUCTOR_CACHE_DIR is set)."""
    compile_training: bool = False
    """With --compile, also compile the minibatch forward + backward. Off: on one CPU thread the compiled
    training pass measured 0.90x eager's (measure before turning it on for other shapes or a GPU)."""
    trust_checkpoint: bool = False
    """With --resume: unpickle the saved environments even when they are not signed by this user's key
    (only for files you trust: unpickling can run code). Without it such a run resumes with fresh episodes.
    Never read from a saved config (rl_transformers/utils/trust.py)."""
    eval_every: int = 25_000
    """Greedy evaluation every N env steps (0: never); eval/mean_reward selects best.pt."""
    eval_final: bool = True
    """Also evaluate the final policy after the last update (when eval_every > 0), so the summary's
    eval/mean_reward and best.pt consider it; --no-eval-final evaluates at multiples of eval_every only (the
    encoder study's protocol)."""
    eval_episodes: int = 16
    """Episodes per evaluation (deterministic actions, fresh seeds per evaluation)."""
    save_every: int = 0
    """Checkpoint every N env steps (0: only at the end and on Ctrl-C)."""
    keep_checkpoints: int = 3
    """step_<n>.pt files kept (last.pt / best.pt always)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("num_envs", "total_timesteps", "eval_episodes"):
            check_int(f"{name} ({flag(name)})", getattr(self, name), 1)
        check_at_most("num_envs (--num-envs)", self.num_envs, MAX_NUM_ENVS, "envs per process")
        check_at_most(
            "eval_episodes (--eval-episodes)", self.eval_episodes, MAX_EVAL_EPISODES, "per evaluation"
        )
        for name in ("eval_every", "save_every", "keep_checkpoints"):
            check_int(f"{name} ({flag(name)})", getattr(self, name), 0)
        check_choice("vectorization", self.vectorization, ("sync", "async"))
        ppo = self.ppo
        n_sequences = self.num_envs * ppo.num_steps // ppo.seq_len
        check_divides(
            "num_minibatches",
            ppo.num_minibatches,
            n_sequences,
            f"the {n_sequences} training sequences of a rollout (num_envs={self.num_envs} x "
            f"num_steps={ppo.num_steps} / seq_len={ppo.seq_len}; a remainder would be dropped)",
            source="--ppo.num-minibatches",
        )

    def check_aux_weights(self) -> None:
        """``ppo.aux_weights`` names only aux losses the chosen policy produces (UserError otherwise).

        Called by the trainer before it builds anything, not in ``__post_init__``, so configs saved before this
        check existed still load (and can be inspected or evaluated).
        """
        produced = self.policy.backbone.aux_loss_names if self.policy.kind == "transformer" else ()
        check_aux_weights(self.ppo.aux_weights, produced, "--ppo.aux-weights")


RESUME_MUTABLE = (
    *SHARED_RESUME_MUTABLE,
    "total_timesteps",
    "eval_every",
    "eval_final",
    "eval_episodes",
    "save_every",
    "keep_checkpoints",
    "ppo.info_every",
    "vectorization",
    "torch_deterministic",
    "compile",
    "compile_training",
)
"""Fields a ``--resume`` may change (the others must equal the saved values, see resume_config)."""
RESUME_PER_INVOCATION = ("resume", "trust_checkpoint", "allow_env_modules")
"""Fields always taken from the current invocation, never from a saved config (trust and allow-lists must
not come from the file they would apply to); names that are not fields are ignored."""
RESUME_RENAMES = {"policy.kind": "policy", "policy": ""}
"""Flag names of nested fields (the policy's fields are top-level flags)."""


def resume_config(saved: TrainConfig, cli: TrainConfig, source: str | None = None) -> TrainConfig:
    """``saved`` with the allowed changes of ``cli``; refuses frozen fields that differ (see
    :func:`rl_transformers.runs.resume.merge_resume`)."""
    from rl_transformers.runs.resume import merge_resume

    return merge_resume(
        saved,
        cli,
        mutable=RESUME_MUTABLE,
        per_invocation=RESUME_PER_INVOCATION,
        source=source or cli.resume or "",
        renames=RESUME_RENAMES,
    )
