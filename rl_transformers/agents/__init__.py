"""Use and train agents from Python: ``load`` a run, ``predict`` with it, ``train_ppo`` / ``train_dt``.

>>> import rl_transformers as rlt
>>> agent = rlt.load("runs/ppo/rlt-TMaze-v0/<run>")          # PPOAgent: sb3-contrib RecurrentPPO.predict
>>> action, state = agent.predict(obs, state, episode_start, deterministic=True)
>>> dt = rlt.load("runs/dt/<dataset>/<run>").as_stateful_wrapper(target_return=500)
>>> action = dt.predict(obs, reward)                          # d3rlpy's stateful DT wrapper; dt.reset()
"""

from __future__ import annotations

from rl_transformers.agents.dt_agent import DecisionTransformerAgent, StatefulDTWrapper
from rl_transformers.agents.load import load
from rl_transformers.agents.ppo_agent import PolicyState, PPOAgent
from rl_transformers.agents.train import train_dt, train_ppo
from rl_transformers.runs.lifecycle import RunResult

__all__ = [
    "DecisionTransformerAgent",
    "PPOAgent",
    "PolicyState",
    "RunResult",
    "StatefulDTWrapper",
    "load",
    "train_dt",
    "train_ppo",
]
