"""rl_transformers: every transformer variant of the literature on one backbone, for memory-based and offline RL."""

__version__ = "0.1.0"
