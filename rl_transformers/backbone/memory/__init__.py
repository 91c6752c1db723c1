"""Memory modules (Transformer-XL, Compressive, Memorizing kNN); each registers itself in the registry."""

from rl_transformers.backbone.memory.base import Memory

__all__ = ["Memory"]
