"""Attention kernels (one module per family); each registers itself in the backbone registry."""

from rl_transformers.backbone.attention.base import Attention

__all__ = ["Attention"]
