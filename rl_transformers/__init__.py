"""rl_transformers: every transformer variant of the literature on one backbone, for memory-based and offline RL.

``rl_transformers.load(run)`` gives a trained agent (PPO: ``predict`` as sb3-contrib's RecurrentPPO; DT:
``as_stateful_wrapper(target_return)``); ``train_ppo`` / ``train_dt`` train from Python
(:mod:`rl_transformers.agents`, imported on first use so ``import rl_transformers`` stays light).
"""

from __future__ import annotations

from typing import Any

from rl_transformers import startup as _startup

_startup.install()  # Ctrl-C while a script still imports: one line, exit 130 (rl_transformers/startup.py)

__version__ = "0.2.0"

_AGENTS = (
    "DecisionTransformerAgent",
    "PPOAgent",
    "RunResult",
    "StatefulDTWrapper",
    "load",
    "train_dt",
    "train_ppo",
)


def __getattr__(name: str) -> Any:
    """The package's lazy index (PEP 562): the agents API, imported on first use (no moved name lives here)."""
    if name in _AGENTS:
        from rl_transformers import agents

        return getattr(agents, name)
    raise AttributeError(f"module 'rl_transformers' has no attribute {name!r}")


__all__ = [*_AGENTS, "__version__"]
