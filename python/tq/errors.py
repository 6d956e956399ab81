"""Exceptions raised by tq: one class per kind of error, all under :class:`TqError`.

Every exception carries the message of the Rust error, the names it gives of the partition,
key, field or unit concerned (:attr:`TqError.partition`, ``.key``, ``.field``, ``.unit``;
``None`` when the error is not about one), and :attr:`TqError.retry`, which says whether trying
again is safe:

- ``"safe"``: nothing happened, or trying again cannot apply the operation twice;
- ``"outcome_unknown"``: the operation may or may not have been applied;
- ``"never"``: trying again gives the same error.

Where a built-in exception means the same thing, the class derives from it too, so
``except TimeoutError`` and ``except KeyError`` work as a Python programmer expects.
"""

from __future__ import annotations

__all__ = [
    "TqError",
    "InvalidError",
    "NotFoundError",
    "ConflictError",
    "CapacityExceededError",
    "DataLostError",
    "UnsupportedError",
    "TimeoutError",
    "UnavailableError",
    "CorruptedError",
    "PermissionDeniedError",
    "ClosedError",
    "InternalError",
]

import builtins
from typing import Optional


class TqError(Exception):
    """Base class of every error tq raises."""

    #: The error's kind, as the Rust side names it (``"not_found"``, ...).
    kind: str = "internal"

    def __init__(
        self,
        message: str,
        retry: str = "never",
        *,
        partition: Optional[str] = None,
        key: Optional[str] = None,
        field: Optional[str] = None,
        unit: Optional[str] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        #: ``"safe"``, ``"outcome_unknown"`` or ``"never"`` (see the module documentation).
        self.retry = retry
        #: The partition the error is about, when it names one.
        self.partition = partition
        #: The KV key the error is about, when it names one.
        self.key = key
        #: The field the error is about, when it names one.
        self.field = field
        #: The storage unit the error is about, when it names one.
        self.unit = unit

    @property
    def retryable(self) -> bool:
        """True when trying the same call again is safe."""
        return self.retry == "safe"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, retry={self.retry!r})"


class InvalidError(TqError, ValueError):
    """The request is malformed (bad argument, unknown field, wrong dtype, ...)."""

    kind = "invalid"


class NotFoundError(TqError, KeyError):
    """A partition, key, sample or field does not exist."""

    kind = "not_found"

    def __str__(self) -> str:  # KeyError would quote the message
        return self.message


class ConflictError(TqError):
    """The request conflicts with the state (a stale write, a key being cleared, ...)."""

    kind = "conflict"


class CapacityExceededError(TqError):
    """Storage or index space is full."""

    kind = "capacity_exceeded"


class DataLostError(TqError):
    """Data that was written is gone (a storage unit was lost or replaced)."""

    kind = "data_lost"


class UnsupportedError(TqError, NotImplementedError):
    """The storage backend does not support this operation."""

    kind = "unsupported"


class TimeoutError(TqError, builtins.TimeoutError):
    """A wait or a request ran out of time."""

    kind = "timeout"


class UnavailableError(TqError, ConnectionError):
    """A part of the deployment cannot be reached (possibly for a while)."""

    kind = "unavailable"


class CorruptedError(TqError):
    """Stored or received bytes fail their checks."""

    kind = "corrupted"


class PermissionDeniedError(TqError, PermissionError):
    """The deployment refused the credentials."""

    kind = "permission_denied"


class ClosedError(TqError):
    """The client is closed, or a stream has ended (a complete partition fully consumed)."""

    kind = "closed"


class InternalError(TqError):
    """A bug in tq; please report it with the message."""

    kind = "internal"
