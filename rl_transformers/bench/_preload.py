"""Imported by the memory-measurement forkserver: torch and every registry entry, once, before any fork."""

from __future__ import annotations

from rl_transformers.backbone import registry
from rl_transformers.bench import ops  # noqa: F401

registry.available()
