"""Depth controllers: fixed depth, Universal Transformer + ACT, early exit."""

from rl_transformers.backbone.depth.base import Depth

__all__ = ["Depth"]
