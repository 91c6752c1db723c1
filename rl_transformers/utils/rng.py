"""Snapshots of the global random generators (Python ``random``, NumPy's legacy ``np.random``, torch CPU and
CUDA) as tensors and plain containers, so they travel in checkpoints read with ``torch.load(weights_only=True)``;
restoring one makes the next draws identical to an uninterrupted run.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

__all__ = ["capture_rng_state", "restore_rng_state"]


def capture_rng_state() -> dict[str, Any]:
    """The global RNG states: ``{"python", "numpy", "torch"[, "cuda"]}`` (tensors and plain containers)."""
    np_state = np.random.get_state(legacy=False)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "bit_generator": str(np_state["bit_generator"]),
            "state": {"key": np_state["state"]["key"].tolist(), "pos": int(np_state["state"]["pos"])},
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Put back the generators saved by :func:`capture_rng_state` (keys that are absent are left alone).

    Accepts the state after a ``torch.load`` or a JSON round trip (lists instead of tuples).
    """
    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
    if "numpy" in state:
        saved = state["numpy"]
        np.random.set_state(
            {
                "bit_generator": saved["bit_generator"],
                "state": {
                    "key": np.asarray(saved["state"]["key"], dtype=np.uint32),
                    "pos": saved["state"]["pos"],
                },
                "has_gauss": saved["has_gauss"],
                "gauss": saved["gauss"],
            }
        )
    if "torch" in state:
        torch.set_rng_state(torch.as_tensor(state["torch"], dtype=torch.uint8).cpu())
    if "cuda" in state and state["cuda"] is not None:
        if not torch.cuda.is_available():
            warnings.warn(
                "checkpoint has CUDA RNG states but CUDA is not available: not restored", stacklevel=2
            )
            return
        cuda_states = [torch.as_tensor(s, dtype=torch.uint8).cpu() for s in state["cuda"]]
        n_devices = torch.cuda.device_count()
        if len(cuda_states) != n_devices:
            warnings.warn(
                f"checkpoint has {len(cuda_states)} CUDA RNG states, this machine {n_devices} devices: "
                "restoring the common ones",
                stacklevel=2,
            )
        for device, device_state in enumerate(cuda_states[:n_devices]):
            torch.cuda.set_rng_state(device_state, device)
