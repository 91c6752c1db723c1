"""Trust model of checkpoints: everything in a checkpoint is data, except one authenticated pickled blob.

Checkpoints are read with ``torch.load(weights_only=True)``, torch's restricted unpickler that builds only
tensors and plain containers, so loading a checkpoint never runs code. A PPO checkpoint of a single-process
run with sync vector envs also carries the environments themselves and the rollout loop (arbitrary Python
objects: the only way to continue a run bit-exactly). They are stored as one pickled blob (a uint8 tensor)
together with an HMAC-SHA256 tag computed with a per-user secret key:

* the key is 32 random bytes in ``$RLT_HOME/checkpoint.key`` (default ``RLT_HOME``:
  ``$XDG_CONFIG_HOME/rl_transformers``, else ``~/.config/rl_transformers``), created on first use with mode
  0600 (directory 0700), outside every run directory, so copying or sharing runs never shares the key. A PPO
  run checks it at start (:func:`check_key`): a key that is empty, short, a directory, unreadable or a symbolic
  link (never followed: it is opened with ``O_NOFOLLOW``), or an ``RLT_HOME`` that cannot be made, stops the
  run before it trains with :class:`CheckpointKeyError` naming the fix;
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
import errno
import hashlib
import hmac
import os
import pickle
import secrets
import stat
import warnings
from pathlib import Path
from typing import Any

import torch

from rl_transformers.utils.errors import UserError

__all__ = ["CheckpointKeyError", "UntrustedBlob", "check_key", "key_path", "load_signed", "sign_blob"]

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


class CheckpointKeyError(UserError):
    """``$RLT_HOME/checkpoint.key`` is missing and cannot be made, or is unusable (the message says the fix)."""


_KEY_MAX_BYTES = 4096
_FIX_HOME = f"set {KEY_ENV} to a directory you can write (e.g. export {KEY_ENV}=~/.config/rl_transformers)"


def _key_error(path: Path, problem: str, fix: str) -> CheckpointKeyError:
    return CheckpointKeyError(
        f"checkpoint signing key {path}: {problem}. Fix: {fix}. (The key signs the env state kept in PPO "
        f"checkpoints; {KEY_ENV} defaults to $XDG_CONFIG_HOME/rl_transformers or ~/.config/rl_transformers.)"
    )


def _read_key(path: Path) -> bytes | None:
    """The key file's bytes, None when there is none; never follows a symlink (``O_NOFOLLOW``: the file is
    checked and read through one descriptor, so a link swapped in meanwhile is refused too)."""
    replace = (
        f"rm {path} (a new key is made at the next start; runs signed with the old one then resume with "
        "fresh episodes)"
    )
    if path.is_symlink():
        raise _key_error(path, "is a symbolic link (a key must be this user's own file)", replace)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        raise _key_error(path, f"{path.parent} is not a directory", _FIX_HOME) from None
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise _key_error(
                path, "is a symbolic link (a key must be this user's own file)", replace
            ) from None
        if isinstance(err, PermissionError):
            raise _key_error(
                path, "cannot be read (permission denied)", f"chown it to this user, or {replace}"
            ) from None
        raise _key_error(path, f"cannot be read ({err.strerror or err})", replace) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
            raise _key_error(path, f"is {kind}", f"rm -r {path} (a new key is made at the next start)")
        _check_owner(path, info, replace)
        with os.fdopen(os.dup(fd), "rb") as f:
            key = f.read(_KEY_MAX_BYTES + 1)
    except OSError as err:
        raise _key_error(path, f"cannot be read ({err.strerror or err})", replace) from None
    finally:
        os.close(fd)
    if len(key) < _KEY_BYTES or len(key) > _KEY_MAX_BYTES:
        size = f"{len(key)} bytes" if len(key) <= _KEY_MAX_BYTES else f"over {_KEY_MAX_BYTES} bytes"
        raise _key_error(path, f"is damaged ({size}; a key has {_KEY_BYTES} random bytes)", replace)
    if os.name == "posix" and info.st_mode & 0o077:
        # checked on the open descriptor of a regular file (not a link), so the advice cannot reach another file
        warnings.warn(f"checkpoint key {path} is readable by other users; run chmod 600 {path}", stacklevel=4)
    return key


def _check_owner(path: Path, info: os.stat_result, replace: str) -> None:
    """Refuse a key this user does not own, or one in a directory others may write without the sticky bit
    (they could replace it): a key another user can choose lets that user forge this user's checkpoints --
    root included, whose files are no one else's to plant."""
    if os.name != "posix":
        return
    me = os.geteuid()
    if info.st_uid != me:
        raise _key_error(
            path,
            f"is owned by uid {info.st_uid}, not by this user (uid {me}): another user could have chosen it",
            f"{replace}, or set {KEY_ENV} to a directory of your own",
        )
    directory = os.stat(path.parent)
    shared = directory.st_mode & 0o022 and not directory.st_mode & stat.S_ISVTX
    if shared or directory.st_uid not in (me, 0):
        who = "other users may write it" if shared else f"it belongs to uid {directory.st_uid}"
        raise _key_error(
            path, f"lies in {path.parent}, which {who}, so another user could replace the key", _FIX_HOME
        )


def _create_key(path: Path) -> None:
    """A new random key (0600, atomically: concurrent first uses agree on one key)."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as err:
        raise _key_error(
            path, f"cannot be created ({err.strerror or err}: {err.filename or path.parent})", _FIX_HOME
        ) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(_KEY_BYTES))
            f.flush()
            os.fsync(f.fileno())
        with contextlib.suppress(FileExistsError):  # another process made the key first: theirs wins
            os.link(tmp, path)
    except OSError as err:
        raise _key_error(path, f"cannot be created ({err.strerror or err})", _FIX_HOME) from None
    finally:
        tmp.unlink(missing_ok=True)


def _secret_key() -> bytes:
    """This user's signing key, created on first use; :class:`CheckpointKeyError` when it is unusable."""
    path = key_path()
    key = _read_key(path)
    if key is None:
        _create_key(path)
        key = _read_key(path)
        if key is None:  # pragma: no cover - deleted between the two calls
            raise _key_error(path, "vanished right after it was created", "start again")
    return key


def check_key() -> Path:
    """Make sure this user's signing key exists and is usable, creating it if needed; returns its path.

    Trainers call it at start, so a bad ``$RLT_HOME`` or key file stops the run before any training (and not
    at its first checkpoint save) with :class:`CheckpointKeyError`: what is wrong and the fix.
    """
    _secret_key()
    return key_path()


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
    return _unpickle(_blob_data(entry, field, trust=trust))


def verify_signed(entry: Any, field: str) -> None:
    """Raise :class:`UntrustedBlob` unless ``entry`` is a :func:`sign_blob` entry of ``field`` whose tag
    verifies with this user's key; nothing is unpickled."""
    _blob_data(entry, field, trust=False)


def _blob_data(entry: Any, field: str, *, trust: bool) -> bytes:
    """The pickled bytes of a :func:`sign_blob` entry, its tag checked unless ``trust``."""
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
    return data


def _unpickle(data: bytes) -> Any:
    """THE one unpickling call of the package: reached only through :func:`load_signed`."""
    return pickle.loads(data)  # authenticated above (or trusted by the user's opt-in)
