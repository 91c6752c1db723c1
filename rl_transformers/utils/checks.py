"""Checks of run-config values shared by the PPO and DT configs: device names and sizes (the aux-loss weights
and divisors are checked with the other option values, in :mod:`rl_transformers.backbone.options`).

Every check raises :class:`~rl_transformers.utils.errors.UserError` naming the flag, the value and the valid
choices (or the closest match). Configs call them in ``__post_init__`` (tyro then reports the message at parse
time); :func:`check_device_available` runs where the device is resolved, since a saved config may name a
device of another machine.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from rl_transformers.utils.errors import UserError, choice_hint

DEVICE_TYPES = ("auto", "cpu", "cuda", "mps")
DEVICE_FORMS = "auto, cpu, cuda, cuda:N, mps"
_DEVICE = re.compile(r"^(cpu|mps|cuda)(:\d+)?$")


def flag(name: str) -> str:
    """``"ppo.num_minibatches"`` -> ``"--ppo.num-minibatches"`` (tyro's spelling of a field's flag)."""
    return "--" + name.replace("_", "-")


def check_device(name: Any, source: str = "--device") -> None:
    """``name`` is a device string this library runs on: auto, cpu, cuda, cuda:N or mps (not its availability)."""
    if name == "auto" or (isinstance(name, str) and _DEVICE.match(name)):
        return
    raise UserError(
        f"unknown device {name!r}; valid: {DEVICE_FORMS}{_hint(name)}",
        source=source,
    )


def _hint(name: Any) -> str:
    hint = choice_hint(str(name).split(":")[0], DEVICE_TYPES)
    return hint[hint.index(" (") :] if " (" in hint else ""


def check_device_available(device: torch.device | str, source: str = "--device") -> None:
    """The resolved ``device`` exists on this machine (CUDA built and a GPU with that index, MPS present)."""
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(
                f"device {str(device)!r} was asked for but CUDA is not available here "
                "(torch.cuda.is_available() is False); use --device cpu or --device auto",
                source=source,
            )
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise UserError(
                f"device {str(device)!r}: this machine has {count} CUDA device(s); valid: cuda:0..cuda:{count - 1}",
                source=source,
            )
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise UserError(
            f"device {str(device)!r} was asked for but MPS is not available here; use --device cpu",
            source=source,
        )


MAX_NUM_ENVS = 4096
"""Most envs one process steps together (each env is a Python object: 10^8 of them never finish starting)."""
MAX_EVAL_EPISODES = 10_000
"""Most evaluation episodes a config may ask for (a saved config must not make ``evaluate.py`` run for days;
``evaluate.py --episodes`` typed by the user is not bounded)."""


def check_at_most(label: str, value: Any, limit: int, why: str) -> None:
    """``value`` (when an int) is at most ``limit``; the message names ``label``, the limit and ``why``."""
    if isinstance(value, int) and not isinstance(value, bool) and value > limit:
        raise UserError(f"{label}={value:,} is larger than the limit {limit:,} ({why})")
