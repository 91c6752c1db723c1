"""Configuration of a Decision Transformer / behaviour-cloning run (:class:`DTConfig`).

Every field is a flag of ``scripts/train_dt.py`` (tyro): ``--dataset``, ``--context-len``, ``--backbone.*``,
... The saved ``config.json`` of a run is a :class:`DTConfig`. Defaults are the paper's (Chen et al. 2021,
arXiv 2106.01345); see :mod:`rl_transformers.algos.dt` for the method.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from rl_transformers.backbone.config import BackboneConfig
from rl_transformers.backbone.options import (
    check_aux_weights,
    check_choice,
    check_int,
    check_number,
    check_positive,
    check_probability,
)
from rl_transformers.backbone.registry import available
from rl_transformers.policies.decision_transformer import dt_backbone_config
from rl_transformers.policies.dt_padding import Padding
from rl_transformers.runs.config import SHARED_RESUME_MUTABLE, RunConfig
from rl_transformers.utils.checks import (
    MAX_EVAL_EPISODES,
    MAX_NUM_ENVS,
    check_at_most,
    flag,
)
from rl_transformers.utils.errors import UserError


@dataclass(frozen=True)
class DTConfig(RunConfig):
    """Everything a Decision Transformer / BC run needs (one CLI flag per field in ``scripts/train_dt.py``;
    shared run flags: :class:`RunConfig`)."""

    dataset: str = ""
    """Minari dataset id (local, never downloaded), Minari dataset directory, or D4RL-format .hdf5 file."""
    dataset_root: Path | None = None
    """Minari datasets root for ids (default: MINARI_DATASETS_PATH, else ~/.minari/datasets)."""
    env_id: str | None = None
    """Evaluation env for a D4RL file that records none (also picks the D4RL reference scores)."""
    algo: Literal["dt", "bc"] = "dt"
    """dt: return-conditioned; bc: the same network without the return token (behaviour cloning)."""
    bc_top_fraction: float = 1.0
    """Train on the top fraction of the dataset's steps, whole episodes by decreasing return (%BC, e.g. 0.1);
    applies to --algo dt too (the paper's --pct_traj)."""
    backbone: BackboneConfig = field(default_factory=dt_backbone_config)
    """Backbone (default: the paper's 3 layers, d=128, 1 head, relu, dropout 0.1 (none in the FFN hidden layer,
    as in GPT-2), position none)."""
    context_len: int = 20
    """K: steps per window (3K tokens)."""
    segments: int = 1
    """N consecutive K-step segments per training window, the backbone memory carried (detached) from one to
    the next as RATE does (Cherepanov et al. 2023, arXiv 2306.09459); the rollout carries it across the
    episode too. Needs --backbone.memory (xl: mem_len >= 3K(N-1) tokens covers the window). 1: K-step windows."""
    window_starts: Literal["uniform", "aligned"] = "uniform"
    """Where training windows start: uniform over each episode's steps (the paper's sampler), or aligned to
    multiples of K (j·K, j uniform in [0, ⌈T/K⌉ − 1]: the windows fall where the rollout's segments do, and with
    K ≥ T every window is the whole episode, so a cue at t = 0 is in every window; segment training always
    aligns). Aligned windows need --padding right."""
    max_ep_len: int | None = None
    """Rows of the timestep embedding; None: the longest of the dataset's episodes and the env's time limit."""
    return_scale: float | None = None
    """Multiplier of returns-to-go; None: 1/1000 for D4RL MuJoCo families, else 10^-floor(log10(max |return|))
    (CartPole-500 -> 1/100)."""
    padding: Padding = "right"
    """Side on which short windows are padded (training and rollouts alike)."""
    embed_dropout: float | None = None
    """Dropout after the embedding LayerNorm; None: the backbone's dropout."""
    total_steps: int = 100_000
    """Gradient updates."""
    batch_size: int = 64
    """Windows per update (global: split over distributed ranks)."""
    learning_rate: float = 1e-4
    """AdamW learning rate after warm-up."""
    weight_decay: float = 1e-4
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    warmup_steps: int = 10_000
    """Linear learning-rate warm-up (lr · min((step + 1) / warmup, 1))."""
    lr_decay: Literal["none", "cosine"] = "none"
    """After the warm-up: none keeps the rate (the Decision Transformer paper's schedule), cosine decays it to 0
    at total_steps, so a late update cannot undo what the model found (a resume with another --total-steps
    re-times the decay)."""
    max_grad_norm: float = 0.25
    """Gradient-norm clipping threshold."""
    aux_coef: float = 1.0
    """Default weight of backbone aux losses (ACT ponder cost, routing commitment, ...)."""
    aux_weights: dict[str, float] = field(default_factory=dict)
    """Per-name aux-loss weights overriding aux_coef."""
    target_returns: tuple[float, ...] | None = None
    """Evaluation targets (raw returns), highest first; None: the dataset's max and median episode return."""
    eval_every: int = 10_000
    """Updates between evaluations (0: only at the end)."""
    eval_episodes: int = 10
    """Episodes per target per evaluation (0: no rollouts)."""
    eval_envs: int = 10
    """Environments stepped in parallel during evaluation."""
    eval_seed: int = 1_000_000
    """Evaluation episode i resets with eval_seed + i."""
    log_every: int = 100
    """Updates between training logs (and backbone diagnostics)."""
    save_every: int = 10_000
    """Updates between checkpoints (also at every evaluation, at the end and on Ctrl-C)."""
    keep_checkpoints: int = 2
    """step_<n>.pt files kept besides last.pt / best.pt."""

    def aux_weight(self, name: str) -> float:
        return self.aux_weights.get(name, self.aux_coef)

    def __post_init__(self) -> None:
        super().__post_init__()
        positive = (
            "context_len",
            "segments",
            "total_steps",
            "batch_size",
            "log_every",
            "save_every",
            "eval_envs",
        )
        for name in positive:
            check_int(f"DTConfig.{name} ({flag(name)})", getattr(self, name), 1)
        for name in ("warmup_steps", "eval_every", "eval_episodes", "keep_checkpoints"):
            check_int(f"DTConfig.{name} ({flag(name)})", getattr(self, name), 0)
        check_int("max_ep_len (--max-ep-len)", self.max_ep_len, 1, optional=True)
        check_at_most("DTConfig.eval_envs (--eval-envs)", self.eval_envs, MAX_NUM_ENVS, "envs per process")
        check_at_most(
            "DTConfig.eval_episodes (--eval-episodes)", self.eval_episodes, MAX_EVAL_EPISODES, "per target"
        )
        check_choice("algo", self.algo, ("dt", "bc"))
        check_choice("padding", self.padding, Padding)
        check_choice("lr_decay", self.lr_decay, ("none", "cosine"))
        check_choice("window_starts", self.window_starts, ("uniform", "aligned"))
        if self.window_starts == "aligned" and self.padding != "right":
            raise UserError(
                f"window_starts (--window-starts) = 'aligned' needs --padding right, got {self.padding!r}"
            )
        check_number(
            "bc_top_fraction (--bc-top-fraction)", self.bc_top_fraction, low=0.0, high=1.0, low_open=True
        )
        check_positive("return_scale (--return-scale)", self.return_scale, optional=True)
        check_positive("learning_rate (--learning-rate)", self.learning_rate)
        check_positive("max_grad_norm (--max-grad-norm)", self.max_grad_norm)
        check_number("weight_decay (--weight-decay)", self.weight_decay, low=0.0)
        check_probability("embed_dropout (--embed-dropout)", self.embed_dropout, optional=True)
        if not (isinstance(self.betas, (tuple, list)) and len(self.betas) == 2):
            raise UserError(f"betas (--betas) must be two numbers in [0, 1), got {self.betas!r}")
        for beta in self.betas:
            check_probability("betas (--betas)", beta)
        if self.target_returns is not None:
            if not self.target_returns:
                raise UserError("target_returns (--target-returns) must list at least one return, or be None")
            for target in self.target_returns:
                check_number("target_returns (--target-returns)", target)
        check_number("aux_coef (--aux-coef)", self.aux_coef, low=0.0)
        check_aux_weights(self.aux_weights, self.backbone.aux_loss_names, "--aux-weights")
        if not self.backbone.causal:
            raise ValueError("the Decision Transformer needs backbone.causal=True")
        if self.segments > 1:
            check_segments(self.segments, self.backbone.memory, self.padding)


def check_segments(segments: int, memory: str | None, padding: str) -> None:
    """Segment recurrence (``segments`` > 1) needs a memory to carry and right padding (so that a segment's
    real tokens continue the memory's positions, in training and in the rollout alike)."""
    if memory is None:
        memories = available()["memory"]
        raise UserError(
            f"segments (--segments) = {segments} carries the backbone memory across segments, but "
            f"--backbone.memory is None; choose one of {memories} (or --segments 1)"
        )
    if padding != "right":
        raise UserError(f"segments (--segments) = {segments} needs --padding right, got {padding!r}")


RESUME_MUTABLE = (
    *SHARED_RESUME_MUTABLE,
    "total_steps",
    "target_returns",
    "eval_every",
    "eval_episodes",
    "eval_envs",
    "eval_seed",
    "log_every",
    "save_every",
    "keep_checkpoints",
)
"""Fields a ``--resume`` may change; any other field that differs from the saved value is refused. The
learning rate needs no re-anchoring: after the warm-up it is constant, so a larger budget continues it."""
RESUME_PER_INVOCATION = ("resume", "allow_env_modules")
"""Fields always taken from the current invocation, never from a saved config (names that are not fields
are ignored)."""
