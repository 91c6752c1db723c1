"""Policies: memory actor-critics (GTrXL and any backbone, LSTM / GRU / MLP baselines) and shared encoders.

from rl_transformers.policies import GTrXLPolicy, PolicyConfig, make_policy, make_encoder

Modules: ``actor_critic`` (encoder -> core -> heads), ``cores`` (backbone cores), ``recurrent`` (LSTM / GRU /
MLP cores), ``packing`` (episode-start packing), ``gtrxl`` (the GTrXL preset, ``PolicyConfig``,
``make_policy``), ``encoders``, ``heads``, ``decision_transformer``.
"""

from rl_transformers.policies.actor_critic import ActorCritic, ActOutput, SequenceOutput
from rl_transformers.policies.cores import ContextCore, Core, TransformerCore, replay_exactness
from rl_transformers.policies.encoders import image_layout, make_encoder, obs_to_tensor, tree_map
from rl_transformers.policies.gtrxl import GTrXLPolicy, PolicyConfig, gtrxl_backbone, make_policy
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
