"""Settings and result of the offline dataset builder (`offline_data.build`): `BuildConfig`, `BuildResult`.

`BuildConfig` is the frozen, validated config of one build (one tyro flag per field in
`scripts/make_dataset.py`); its properties derive the dataset ids, the medium level and the policy
directory. `KINDS` are D4RL's dataset kinds (Fu et al. 2020, arXiv 2004.07219) and `SEED_OFFSETS` the
reset-seed offsets that keep every dataset's start states apart.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from offline_data.minari_io import validate_dataset_id
from offline_data.scores import D4RL_REF_SCORES, env_family

__all__ = ["KINDS", "SEED_OFFSETS", "BuildConfig", "BuildResult", "Kind"]

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
