"""Behaviour-policy files of the dataset builder, saved and loaded without unpickling anything.

Stable-Baselines3's own ``load`` rebuilds a model from the zip's ``data`` entry, which holds cloudpickled
objects (schedules, spaces): loading a zip runs whatever it contains. The builder therefore never calls it:

* policies (``medium.zip``, ``expert.zip``, ``last.zip``) are written with SB3's ``save`` (so SB3 users can
  load their own files) and read back by :func:`load_policy_weights`, which takes only the ``policy.pth``
  member -- a plain state_dict, read with ``torch.load(weights_only=True)`` -- into a freshly built
  ``MlpPolicy`` of the configured algorithm. ``policy_kwargs`` stored in the zip are *not* read (they are
  pickled), so a zip trained with another architecture is refused with the state_dict mismatch. This also
  holds for ``--medium-policy`` / ``--expert-policy`` zips given by the user.
* the resumable training state (``train_state.pt``) is one ``torch.save`` of tensors, numbers and strings:
  every SB3 state_dict of the model (policy and optimisers), SAC's entropy coefficient, the filled part of
  the replay buffer, the episodes recorded so far for medium-replay, the evaluation history and a
  fingerprint of the training settings. It is read with ``weights_only=True``. Resuming restores the
  weights, optimiser state, step counter and replay buffer, and continues from the next environment reset
  (the random-number streams restart from ``seed + step``; resumed training is not bit-identical to an
  uninterrupted one).

All files are written atomically (temporary file + ``os.replace``, :func:`rl_transformers.utils.atomic.atomic_file`).
"""

from __future__ import annotations

import hashlib
import io
import json
import warnings
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from offline_data.episode import Episode
from offline_data.errors import DatasetError
from rl_transformers.runs.checkpoint_load import load_error_reason
from rl_transformers.utils.atomic import atomic_file

__all__ = [
    "STATE_FORMAT",
    "fingerprint",
    "load_episodes_file",
    "load_policy_weights",
    "load_train_state",
    "restore_train_state",
    "save_episodes_file",
    "save_model_zip",
    "save_train_state",
]

STATE_FORMAT = "rlt-sb3-train-state/1"


def fingerprint(settings: dict[str, Any]) -> str:
    """sha256 of the JSON of ``settings`` (sorted keys): identifies a training / a build."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


def save_model_zip(model: Any, path: Path) -> Path:
    """SB3 ``model.save`` into a temporary zip beside ``path``, then ``os.replace``."""
    with atomic_file(path, suffix=".zip") as temp:
        model.save(temp)
    return path


def load_policy_weights(model: Any, path: Path) -> None:
    """Load the ``policy.pth`` state_dict of an SB3 zip into ``model.policy`` (no unpickling; see module doc)."""
    path = Path(path)
    if not zipfile.is_zipfile(path):
        raise DatasetError(f"policy file {str(path)!r} is not a Stable-Baselines3 zip")
    with zipfile.ZipFile(path) as archive:
        if "policy.pth" not in archive.namelist():
            raise DatasetError(
                f"policy file {str(path)!r} has no policy.pth member; found {sorted(archive.namelist())}"
            )
        raw = archive.read("policy.pth")
    try:
        with warnings.catch_warnings():  # SB3 writes pickle protocol 4; the weights-only reader handles it
            warnings.filterwarnings("ignore", message=r"Detected pickle protocol", category=UserWarning)
            state = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except Exception as err:  # a pickle of objects (refused, never run), a torn or foreign member
        raise DatasetError(
            f"policy file {str(path)!r}: its policy.pth is not a plain state_dict of tensors and was not loaded "
            f"({load_error_reason(err)}); use a zip saved by Stable-Baselines3's model.save"
        ) from None
    try:
        model.policy.load_state_dict(state)
    except (RuntimeError, ValueError, TypeError, KeyError, AttributeError) as err:
        raise DatasetError(
            f"policy file {str(path)!r} does not fit a default SB3 {type(model).__name__} MlpPolicy for this env "
            f"(only the policy.pth state_dict is read; policy_kwargs are not): {err}"
        ) from None


def _pack(episodes: Sequence[Episode]) -> dict[str, Any]:
    if not episodes:
        return {"lengths": torch.zeros(0, dtype=torch.int64)}
    return {
        "lengths": torch.tensor([len(ep) for ep in episodes], dtype=torch.int64),
        "observations": torch.from_numpy(np.concatenate([ep.all_observations for ep in episodes])),
        "actions": torch.from_numpy(np.concatenate([ep.actions for ep in episodes])),
        "rewards": torch.from_numpy(np.concatenate([ep.rewards for ep in episodes])),
        "terminations": torch.from_numpy(np.concatenate([ep.terminations for ep in episodes])),
        "truncations": torch.from_numpy(np.concatenate([ep.truncations for ep in episodes])),
    }


def _unpack(packed: dict[str, Any]) -> list[Episode]:
    lengths = packed["lengths"].tolist()
    episodes, step, row = [], 0, 0
    for n in lengths:
        episodes.append(
            Episode.from_observation_sequence(
                packed["observations"][row : row + n + 1].numpy(),
                packed["actions"][step : step + n].numpy(),
                packed["rewards"][step : step + n].numpy(),
                packed["terminations"][step : step + n].numpy(),
                packed["truncations"][step : step + n].numpy(),
            )
        )
        step, row = step + n, row + n + 1
    return episodes


def save_episodes_file(path: Path, episodes: Sequence[Episode]) -> None:
    """Episodes as tensors (``torch.save``), atomically."""
    with atomic_file(path) as temp:
        torch.save({"format": STATE_FORMAT, "episodes": _pack(episodes)}, temp)


def load_episodes_file(path: Path) -> list[Episode]:
    """Episodes written by :func:`save_episodes_file` (``weights_only=True``)."""
    return _unpack(torch.load(path, map_location="cpu", weights_only=True)["episodes"])


_BUFFER_FIELDS = ("observations", "next_observations", "actions", "rewards", "dones", "timeouts")


def save_train_state(
    path: Path, model: Any, fp: str, info: dict[str, Any], recorded: Sequence[Episode]
) -> None:
    """The resumable training state of an SB3 model (see the module docstring), atomically."""
    state: dict[str, Any] = {
        "format": STATE_FORMAT,
        "fingerprint": fp,
        "num_timesteps": int(model.num_timesteps),
        "n_updates": int(getattr(model, "_n_updates", 0)),
        "params": model.get_parameters(),
        "info_json": json.dumps(info),
        "recorded": _pack(recorded),
    }
    if getattr(model, "log_ent_coef", None) is not None:
        state["log_ent_coef"] = model.log_ent_coef.detach().cpu().clone()
    buffer = getattr(model, "replay_buffer", None)
    if buffer is not None:
        n = buffer.buffer_size if buffer.full else buffer.pos
        state["buffer"] = {
            "pos": int(buffer.pos),
            "full": bool(buffer.full),
            **{
                name: torch.from_numpy(np.ascontiguousarray(getattr(buffer, name)[:n]))
                for name in _BUFFER_FIELDS
                if getattr(buffer, name, None) is not None
            },
        }
    with atomic_file(path) as temp:
        torch.save(state, temp)


def load_train_state(path: Path) -> dict[str, Any]:
    """The dict :func:`save_train_state` wrote (``weights_only=True``); refuses other files."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise DatasetError(
            f"training state {str(path)!r} cannot be read ({load_error_reason(err)}); delete it or pass "
            "--overwrite to start over"
        ) from None
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise DatasetError(f"{str(path)!r} is not a training state of this builder ({STATE_FORMAT})")
    return state


def restore_train_state(model: Any, state: dict[str, Any]) -> tuple[dict[str, Any], list[Episode]]:
    """Load :func:`load_train_state`'s dict into a fresh model; returns (info, recorded episodes)."""
    model.set_parameters(state["params"], exact_match=True, device=model.device)
    if "log_ent_coef" in state:
        with torch.no_grad():
            model.log_ent_coef.copy_(state["log_ent_coef"].to(model.device))
    buffer = getattr(model, "replay_buffer", None)
    if buffer is not None and "buffer" in state:
        saved = state["buffer"]
        for name in _BUFFER_FIELDS:
            if name in saved and getattr(buffer, name, None) is not None:
                values = saved[name].numpy()
                getattr(buffer, name)[: len(values)] = values
        buffer.pos, buffer.full = int(saved["pos"]), bool(saved["full"])
    model.num_timesteps = int(state["num_timesteps"])
    model._n_updates = int(state["n_updates"])
    return json.loads(state["info_json"]), _unpack(state["recorded"])
