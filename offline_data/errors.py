"""Errors of the offline-data readers and writers: user errors (bad file, bad id), printed without a traceback.

Both subclass :class:`rl_transformers.utils.errors.UserError` (a ``ValueError``), so the CLIs print them as
``error: <message>`` and code catching ``ValueError`` / ``FileNotFoundError`` keeps working.
"""

from __future__ import annotations

from rl_transformers.utils.errors import UserError

__all__ = ["DatasetError", "DatasetExistsError", "DatasetNotFoundError"]


class DatasetError(UserError):
    """A dataset that cannot be used: malformed file, refused env spec, data that does not fit its env."""


class DatasetNotFoundError(DatasetError, FileNotFoundError):
    """No dataset at the given path / id (the message lists close matches when there are any)."""


class DatasetExistsError(DatasetError, FileExistsError):
    """A dataset or policy file that exists already and would be replaced (the message names the flag)."""
