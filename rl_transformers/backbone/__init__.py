"""The shared backbone: every attention / position / memory / block / depth variant, selectable by name.

from rl_transformers.backbone import BackboneConfig, Backbone, available, capabilities
"""

from rl_transformers.backbone.config import BackboneConfig
from rl_transformers.backbone.model import Backbone, BackboneOutput, build_backbone
from rl_transformers.backbone.reference import reference_attention
from rl_transformers.backbone.registry import Capabilities, available, capabilities
from rl_transformers.backbone.state import BackboneState, KVCache, State

__all__ = [
    "Backbone",
    "BackboneConfig",
    "BackboneOutput",
    "BackboneState",
    "Capabilities",
    "KVCache",
    "State",
    "available",
    "build_backbone",
    "capabilities",
    "reference_attention",
]
