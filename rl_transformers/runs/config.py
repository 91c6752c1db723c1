"""Settings every training run shares (:class:`RunConfig`): one name, type and default per flag for all trainers.

:class:`~rl_transformers.algos.ppo_config.TrainConfig` (``scripts/train_gtrxl.py``) and
:class:`~rl_transformers.algos.dt_config.DTConfig` (``scripts/train_dt.py``) both extend it, so both command
lines accept ``--seed``, ``--device``, ``--threads``, ``--run-root``, ``--resume``, ``--verbose`` and
``--progress/--no-progress`` with the same meaning and default. Loss settings shared by both trainers use the
same field names too (``aux_coef``, ``aux_weights``); they sit where each trainer keeps its optimisation
settings (PPO: ``--ppo.aux-weights`` beside ``--ppo.learning-rate``; DT: ``--aux-weights`` beside
``--learning-rate``).

Vocabulary rule for counts: the backbone, the policies and every options dict use ``n_<things>`` (``n_layers``,
``n_heads``, ``n_buckets``). The PPO run flags keep cleanrl's ``Args`` names verbatim (``--num-envs``,
``--ppo.num-steps``, ``--ppo.num-minibatches``, ``--total-timesteps``), because the PPO config is cleanrl's one
to one and those are the names its users type; no other user-visible option uses ``num_``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_transformers.backbone.options import check_int
from rl_transformers.utils.checks import check_device
from rl_transformers.utils.errors import UserError


@dataclass(frozen=True)
class RunConfig:
    """Run bookkeeping shared by every trainer (see the module docstring)."""

    seed: int = 1
    """Seed of torch / NumPy / Python, of the data sampling and of the training envs."""
    device: str = "auto"
    """torch device: auto (cuda if available, else cpu), cpu, cuda, cuda:N, mps."""
    threads: int | None = 1
    """torch intra-op CPU threads per process. 1 (default) is fastest for small models, whose time goes into
    per-op overhead; None = available cores / processes on this node."""
    run_root: Path = Path("runs")
    """Root of run directories: <run_root>/<algo>/<env or dataset>/<YYYYmmdd-HHMMSS>-s<seed>/."""
    resume: Path | None = None
    """Checkpoint file or run directory to resume. Flags default to the saved config; of those given, the
    trainer's RESUME_MUTABLE ones (budget, evaluation, saving, logging, device, threads) apply, any other that
    differs from the saved value is refused (rl_transformers/runs/resume.py)."""
    verbose: bool = False
    """Also print the logger's table at every log step."""
    progress: bool = True
    """Show a tqdm progress bar."""
    stop_at: float | None = None
    """Stop once an evaluation reaches this value of the metric that ranks best.pt (PPO: eval/mean_reward, the
    greedy mean return; DT: the mean return at the first target), as SB3's StopTrainingOnRewardThreshold does;
    last.pt is then the policy that reached it. Needs evaluations (--eval-every > 0). None: the whole budget."""
    allow_env_modules: tuple[str, ...] = ()
    """Modules (and their submodules) whose environments a flag or a file may name by entry point or
    ``module:Env-v0`` id, beyond gymnasium, envs, popgym and minigrid (envs/resolve.py). Allowing a module
    trusts its code. Never read from a saved config: give it again with --resume."""

    def __post_init__(self) -> None:
        # accept str paths from Python callers; the saved config and comparisons see Path
        object.__setattr__(self, "run_root", Path(self.run_root))
        if self.resume is not None:
            object.__setattr__(self, "resume", Path(self.resume))
        check_int("seed (--seed)", self.seed, 0)
        check_int("threads (--threads)", self.threads, 1, optional=True)
        check_device(self.device)
        object.__setattr__(self, "allow_env_modules", check_module_names(self.allow_env_modules))
        if self.stop_at is not None:
            if isinstance(self.stop_at, bool) or not isinstance(self.stop_at, int | float):
                raise UserError(f"stop_at (--stop-at): expected a number, got {self.stop_at!r}")
            if not math.isfinite(self.stop_at):
                raise UserError(f"stop_at (--stop-at): expected a finite number, got {self.stop_at!r}")
            if getattr(self, "eval_every", None) == 0:
                raise UserError("--stop-at needs evaluations to stop on, but --eval-every is 0")


def check_module_names(modules: Any, flag: str = "--allow-env-modules") -> tuple[str, ...]:
    """``modules`` as a tuple of dotted module names (a single string counts as one name); UserError naming
    ``flag`` and the bad value otherwise."""
    if isinstance(modules, str):
        modules = (modules,)
    try:
        names = tuple(modules)
    except TypeError:
        raise UserError(f"{flag}: expected module names, got {modules!r}") from None
    for name in names:
        if not isinstance(name, str) or not all(part.isidentifier() for part in name.split(".")):
            raise UserError(f"{flag}: {name!r} is not a dotted module name such as 'my_package.envs'")
    return names


INVOCATION_FIELDS = {"resume": None, "trust_checkpoint": False, "allow_env_modules": ()}
"""Fields that belong to one invocation, with the value a saved config holds: never read from a file."""


def saved_form(config: Any) -> Any:
    """``config`` as a checkpoint or ``config.json`` stores it: the :data:`INVOCATION_FIELDS` (``resume``,
    ``trust_checkpoint``, ``allow_env_modules``) reset, so a saved file never carries (or grants) them."""
    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        return config
    fresh = {name: value for name, value in INVOCATION_FIELDS.items() if hasattr(config, name)}
    return dataclasses.replace(config, **fresh) if fresh else config


SHARED_RESUME_MUTABLE = ("device", "threads", "verbose", "progress", "stop_at")
"""RunConfig fields a ``--resume`` may change (each trainer adds its own to RESUME_MUTABLE)."""
