"""Positional schemes (one module per family); each registers itself in the backbone registry."""

from rl_transformers.backbone.position.base import Position

__all__ = ["Position"]
