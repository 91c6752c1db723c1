"""Decision Transformer window padding, shared by training batches and rollout contexts.

A window shorter than K steps (an episode's first steps, or a window cut by the episode's end) is padded on
the model's ``padding`` side. Training batches (:mod:`rl_transformers.algos.dt_data`) and the rollout agent's
contexts (:class:`~rl_transformers.policies.dt_rollout.DTAgent`) both go through :func:`pad_steps`, so a
rollout sees exactly the windows the model was trained on. Split out of ``decision_transformer.py``, which
re-exports these names (old import paths keep working). Imports nothing from the policies package.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

Padding = Literal["right", "left"]
PADDINGS: tuple[str, ...] = ("right", "left")


def pad_steps(x: Tensor, lengths: Tensor, padding: Padding) -> Tensor:
    """Re-lay (B, K, ...) rows whose real steps are at [0, L) (zeros after) for the ``padding`` side.

    ``"right"`` returns ``x`` unchanged; ``"left"`` moves each row's L real steps to [K - L, K).
    """
    if padding == "right":
        return x
    if padding != "left":
        raise ValueError(f"padding={padding!r} is not one of {list(PADDINGS)}")
    k = x.shape[1]
    src = torch.arange(k, device=x.device)[None, :] - (k - lengths.to(x.device))[:, None]  # (B, K)
    valid = src >= 0
    index = src.clamp_min(0).view(*src.shape, *([1] * (x.dim() - 2))).expand_as(x)
    out = torch.gather(x, 1, index)
    keep = valid.view(*valid.shape, *([1] * (x.dim() - 2)))
    return torch.where(keep, out, torch.zeros((), dtype=x.dtype, device=x.device))


def last_index(lengths: Tensor, k: int, padding: Padding) -> Tensor:
    """(B,) index of each row's last real step in a padded window."""
    return lengths - 1 if padding == "right" else torch.full_like(lengths, k - 1)


__all__ = ["PADDINGS", "Padding", "last_index", "pad_steps"]
