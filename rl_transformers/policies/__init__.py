"""Policies: memory actor-critics (GTrXL and any backbone, LSTM / GRU / MLP baselines) and shared encoders.

from rl_transformers.policies import GTrXLPolicy, PolicyConfig, make_policy, make_encoder
"""

from rl_transformers.policies.encoders import image_layout, make_encoder, obs_to_tensor, tree_map
from rl_transformers.policies.gtrxl import (
    ActorCritic,
    ActOutput,
    ContextCore,
    Core,
    GTrXLPolicy,
    PolicyConfig,
    SequenceOutput,
    TransformerCore,
    gtrxl_backbone,
    make_policy,
    replay_exactness,
)
from rl_transformers.policies.heads import ActionHead, make_action_head
from rl_transformers.policies.recurrent import MLPCore, RecurrentCore

__all__ = [
    "ActOutput",
    "ActionHead",
    "ActorCritic",
    "ContextCore",
    "Core",
    "GTrXLPolicy",
    "MLPCore",
    "PolicyConfig",
    "RecurrentCore",
    "SequenceOutput",
    "TransformerCore",
    "gtrxl_backbone",
    "image_layout",
    "make_action_head",
    "make_encoder",
    "make_policy",
    "obs_to_tensor",
    "replay_exactness",
    "tree_map",
]
