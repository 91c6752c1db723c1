"""Trust model of checkpoints: everything in a checkpoint is data, except one authenticated pickled blob.

Checkpoints are read with ``torch.load(weights_only=True)``, torch's restricted unpickler that builds only
tensors and plain containers, so loading a checkpoint never runs code. A PPO checkpoint of a single-process
run with sync vector envs also carries the environments themselves and the rollout loop (arbitrary Python
objects: the only way to continue a run bit-exactly). They are stored as one pickled blob (a uint8 tensor)
together with an HMAC-SHA256 tag computed with a per-user secret key:

* the key is 32 random bytes in ``$RLT_HOME/checkpoint.key`` (default ``RLT_HOME``:
  ``$XDG_CONFIG_HOME/rl_transformers``, else ``~/.config/rl_transformers``), created on first use with mode
  0600 (directory 0700), outside every run directory, so copying or sharing runs never shares the key;
* :func:`load_signed` checks the tag with :func:`hmac.compare_digest` *before* unpickling; a blob without a
  tag, with a wrong tag (forged, altered, or signed by another user's / machine's key) is never unpickled.

What a resume does with a blob that does not verify (the policy, optimizer, counters and RNG states are plain
tensors and are always restored): it warns, naming the file, and continues with fresh episodes (new env
resets; the run is then not bit-exact). ``--trust-checkpoint`` (``TrainConfig.trust_checkpoint``, never read
from a saved config) unpickles such a blob anyway, for files the user trusts (e.g. their own runs from another
machine); the next checkpoint is signed with this user's key.

``_unpickle`` below is the one place in the package that unpickles (``grep -rn "pickle.loads"``); it is only
called after the tag verified, or under the explicit opt-in.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import pickle
import secrets
import warnings
from pathlib import Path
from typing import Any

import torch

__all__ = ["UntrustedBlob", "key_path", "load_signed", "sign_blob"]

KEY_ENV = "RLT_HOME"
_DOMAIN = b"rl_transformers checkpoint blob v1\0"
_KEY_BYTES = 32


def rlt_home() -> Path:
    """``$RLT_HOME``, else ``$XDG_CONFIG_HOME/rl_transformers``, else ``~/.config/rl_transformers``."""
    if os.environ.get(KEY_ENV):
        return Path(os.environ[KEY_ENV]).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "rl_transformers"


def key_path() -> Path:
    return rlt_home() / "checkpoint.key"


def _secret_key() -> bytes:
    """This user's signing key, created on first use (0600, atomically: concurrent first uses agree)."""
    path = key_path()
    try:
        key = path.read_bytes()
    except FileNotFoundError:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_bytes(_KEY_BYTES))
                f.flush()
                os.fsync(f.fileno())
            with contextlib.suppress(FileExistsError):  # another process made the key first: theirs wins
                os.link(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        key = path.read_bytes()
    if len(key) < _KEY_BYTES:
        raise ValueError(f"checkpoint key {path} is damaged ({len(key)} bytes); delete it to make a new one")
    if os.name == "posix" and path.stat().st_mode & 0o077:
        warnings.warn(f"checkpoint key {path} is readable by other users; run chmod 600 {path}", stacklevel=3)
    return key


def _tag(key: bytes, field: str, blob: bytes) -> bytes:
    return hmac.new(key, _DOMAIN + field.encode() + b"\0" + blob, hashlib.sha256).digest()


def _as_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8)


def sign_blob(obj: Any, field: str) -> dict[str, torch.Tensor]:
    """``obj`` pickled into ``{"data": uint8 tensor, "hmac": uint8 tensor}`` (loadable with weights_only).

    ``field`` (the checkpoint key it is stored under) is part of the tag, so a blob cannot be moved to
    another field.
    """
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return {"data": _as_tensor(data), "hmac": _as_tensor(_tag(_secret_key(), field, data))}


class UntrustedBlob(Exception):
    """A pickled blob that does not carry a valid tag of this user's key (the reason is the message)."""


def _blob_bytes(value: Any, name: str) -> bytes:
    if not isinstance(value, torch.Tensor) or value.dtype != torch.uint8 or value.dim() != 1:
        raise UntrustedBlob(f"{name} is not a byte tensor")
    return value.numpy().tobytes()


def load_signed(entry: Any, field: str, *, trust: bool = False) -> Any:
    """The object of a :func:`sign_blob` entry, unpickled only if its tag verifies with this user's key.

    Raises :class:`UntrustedBlob` (nothing unpickled) when the entry is malformed, unsigned, or its tag does
    not verify; ``trust=True`` unpickles a well-formed blob without checking the tag (the user's opt-in).
    """
    if not isinstance(entry, dict) or "data" not in entry:
        raise UntrustedBlob(f"{field!r} is not a signed blob (written by an older version or altered)")
    data = _blob_bytes(entry["data"], f"{field}.data")
    if not trust:
        if entry.get("hmac") is None:
            raise UntrustedBlob(f"{field!r} carries no signature")
        tag = _blob_bytes(entry["hmac"], f"{field}.hmac")
        if not hmac.compare_digest(tag, _tag(_secret_key(), field, data)):
            raise UntrustedBlob(
                f"the signature of {field!r} does not match this user's key {key_path()} "
                "(the file was written by another user or machine, or altered)"
            )
    return _unpickle(data)


def _unpickle(data: bytes) -> Any:
    """THE one unpickling call of the package: reached only through :func:`load_signed`."""
    return pickle.loads(data)  # authenticated above (or trusted by the user's opt-in)
