"""The exceptions of the lock client, one class per way a caller reacts.

Every failed call raises a :class:`PalisadeError` whose class says what happened, as the Rust
client's ``ErrorClass`` does:

- :class:`Refused`: the service refused the request as made (no such session, not the holder,
  invalid input, a missing or wrong session secret or bearer token, a right the policy does not
  grant, a quota reached); sending it again unchanged fails again. Nothing changed.
- :class:`NotAcquired`: the lock was not acquired (busy, the wait ended, a limit on waiters or
  locks); trying again later may succeed. Nothing changed.
- :class:`NotApplied` (also named ``Unavailable``): the request was not applied (no member could
  be reached, an election, a shutdown, a limit on keepalive streams); retry later.
- :class:`OutcomeUnknown`: the request may or may not have taken effect (a timeout, a connection
  that broke after the request was sent). Never reported as a failure: an acquire whose outcome
  is unknown may have granted the lock to the session.
- :class:`ProtocolError`: the service broke the protocol or failed internally.
- :class:`Misconfigured`: the client is configured wrongly (an invalid endpoint).

A refusal of the lock table carries the service's ``ErrorDetail`` (``error.detail``, the
generated message, and ``error.kind``, its stable snake_case name such as ``"busy"``); the
common ones have subclasses: :class:`Busy`, :class:`WaitEnded`, :class:`SessionNotFound`,
:class:`NotHolder`, :class:`Unauthenticated`, :class:`PermissionDenied`, :class:`SessionNotOwned`,
:class:`QuotaReached`, :class:`InvalidArgument`, :class:`LimitReached`, :class:`TokensExhausted`.
A kind this client does not know is classified by its status code.
"""

from __future__ import annotations

import enum
from typing import Any, Optional

import grpc


class ErrorClass(enum.Enum):
    """How a caller reacts to a failed call (the Rust client's ``ErrorClass``)."""

    REFUSED = "refused"
    NOT_ACQUIRED = "not_acquired"
    UNAVAILABLE = "unavailable"
    OUTCOME_UNKNOWN = "outcome_unknown"
    INTERNAL = "internal"
    MISCONFIGURED = "misconfigured"


class PalisadeError(Exception):
    """Base of every error the client raises."""

    error_class: ErrorClass = ErrorClass.INTERNAL
    #: True when the same call may succeed later without the caller changing anything.
    retryable: bool = False

    def __init__(
        self,
        message: str,
        *,
        code: Optional[grpc.StatusCode] = None,
        detail: Any = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        #: The gRPC status code, when the error came from a status.
        self.code = code
        #: The service's ``palisade.v1.ErrorDetail``, when the lock table refused the request.
        self.detail = detail

    @property
    def kind(self) -> Optional[str]:
        """The stable name of the refusal (``ErrorDetail.kind``), or ``None`` without a detail."""
        return self.detail.kind if self.detail is not None else None

    @property
    def outcome_unknown(self) -> bool:
        """True when the request may have taken effect despite the error."""
        return self.error_class is ErrorClass.OUTCOME_UNKNOWN


class Refused(PalisadeError):
    """The service refused the request as made; nothing changed."""

    error_class = ErrorClass.REFUSED


class NotAcquired(PalisadeError):
    """The lock was not acquired; trying again later may succeed."""

    error_class = ErrorClass.NOT_ACQUIRED
    retryable = True


class NotApplied(PalisadeError):
    """The request was not applied: the service could not be reached or cannot serve now."""

    error_class = ErrorClass.UNAVAILABLE
    retryable = True


#: The Rust client's name for :class:`NotApplied`.
Unavailable = NotApplied


class OutcomeUnknown(PalisadeError):
    """The request may or may not have taken effect (a timeout, a broken connection)."""

    error_class = ErrorClass.OUTCOME_UNKNOWN
    retryable = True


class ProtocolError(PalisadeError):
    """The service answered with something invalid, or failed internally."""

    error_class = ErrorClass.INTERNAL


class Misconfigured(PalisadeError):
    """The client is configured wrongly."""

    error_class = ErrorClass.MISCONFIGURED


class InvalidEndpoint(Misconfigured):
    """An endpoint is not ``host:port`` (or the list is empty or too long)."""


class Unreachable(NotApplied):
    """No endpoint accepted a connection."""


class Busy(NotAcquired):
    """The lock is held by another session (or sits out its lock-delay)."""

    @property
    def holder_session(self) -> Optional[int]:
        d = self.detail
        return d.holder_session if d is not None and d.HasField("holder_session") else None

    @property
    def holder_token(self) -> Optional[int]:
        d = self.detail
        return d.holder_token if d is not None and d.HasField("holder_token") else None


class WaitEnded(NotAcquired):
    """The wait for the lock ended before it was granted."""


class LimitReached(NotAcquired):
    """A limit on sessions, locks or waiters was reached; retry later."""


class SessionNotFound(Refused):
    """The session does not exist (it expired or was closed): every lock it held is lost."""


class NotHolder(Refused):
    """The session does not hold the lock it tried to release, or the grant it proclaimed a
    value for is no longer the lock's holding."""


class Unauthenticated(Refused):
    """The caller is not who it must be: a call for a session came without the session's secret
    or with another one (kinds ``session_secret_missing``, ``session_secret_wrong``), or the
    service requires a bearer token and got none, a malformed one or one it does not know (kind
    ``unauthenticated``; :attr:`reason` says which)."""

    @property
    def reason(self) -> Optional[str]:
        """Why a bearer credential was refused (kind ``unauthenticated``):
        ``"credential_missing"``, ``"credential_malformed"``, ``"credential_unknown"``, or a
        reason of a newer service; ``None`` for the other kinds."""
        d = self.detail
        if d is None or d.kind != "unauthenticated":
            return None
        return d.reason or None


class PermissionDenied(Refused):
    """The policy grants the caller's identity no such right there (kind ``permission_denied``).

    :attr:`identity` is the authenticated identity, :attr:`right` the right it lacks
    (``"lock"``, ``"read"`` or ``"admin"``) and :attr:`scope` what it was asked on: the lock, the
    prefix a listing asked for, or ``"*"``. Nothing was done; ask the operator for the right.
    """

    @property
    def identity(self) -> Optional[str]:
        return self.detail.identity if self.detail is not None else None

    @property
    def right(self) -> Optional[str]:
        return self.detail.right if self.detail is not None else None

    @property
    def scope(self) -> Optional[str]:
        return self.detail.scope if self.detail is not None else None


class SessionNotOwned(Refused):
    """The session belongs to another identity (kind ``session_not_owned``): only the identity
    that opened a session acts for it, even with its secret. :attr:`session` is its id."""

    @property
    def session(self) -> Optional[int]:
        return self.detail.session if self.detail is not None else None


class QuotaReached(Refused):
    """The caller's identity is at one of its quotas (kind ``quota_reached``): :attr:`quota` is
    ``"sessions"``, ``"locks"``, ``"waiters"`` or ``"watches"``, :attr:`quota_max` its value for
    :attr:`identity`. Refused, not retried: free something of that identity's first (release a
    lock, close a session), as the Rust client classifies it."""

    @property
    def identity(self) -> Optional[str]:
        return self.detail.identity if self.detail is not None else None

    @property
    def quota(self) -> Optional[str]:
        return self.detail.quota if self.detail is not None else None

    @property
    def quota_max(self) -> Optional[int]:
        return self.detail.quota_max if self.detail is not None else None


class InvalidArgument(Refused):
    """The request is invalid (a lock name, a TTL, a wait, a value); the same request fails
    again."""


class TokensExhausted(Refused):
    """The lock's fencing tokens are exhausted: it can never be granted again."""


class SessionLost(PalisadeError):
    """The session ended while it was in use: every lock it held must be assumed lost.

    ``reason`` is one of :data:`LOST_NOT_FOUND` (the service no longer knows the session),
    :data:`LOST_LEASE_UNPROVEN` (no renewal was acknowledged within the lease, so the service
    may have expired it) and :data:`LOST_CLOSED` (this process closed it).
    """

    error_class = ErrorClass.UNAVAILABLE

    def __init__(self, reason: str, message: Optional[str] = None) -> None:
        super().__init__(message or describe_lost(reason))
        self.reason = reason


LOST_NOT_FOUND = "not_found"
LOST_LEASE_UNPROVEN = "lease_unproven"
LOST_CLOSED = "closed"


def describe_lost(reason: str) -> str:
    return {
        LOST_NOT_FOUND: "the lock service no longer knows the session (it expired or was closed)",
        LOST_LEASE_UNPROVEN: "no keepalive was acknowledged within the session's ttl, so its lease may have run out",
        LOST_CLOSED: "the session was closed",
    }.get(reason, reason)


# The lock table's refusals, by ErrorDetail.kind. A kind not listed is classified by its code.
_BY_KIND: dict[str, type[PalisadeError]] = {
    "session_not_found": SessionNotFound,
    "ttl_out_of_range": InvalidArgument,
    "wait_out_of_range": InvalidArgument,
    "invalid_lock_name": InvalidArgument,
    "invalid_open_key": InvalidArgument,
    "invalid_value": InvalidArgument,
    "request_id_conflict": InvalidArgument,
    "too_many_sessions": LimitReached,
    "too_many_locks": LimitReached,
    "too_many_waiters": LimitReached,
    "busy": Busy,
    "not_holder": NotHolder,
    "wait_ended": WaitEnded,
    "tokens_exhausted": TokensExhausted,
    "invalid_limits": ProtocolError,
    "session_secret_missing": Unauthenticated,
    "session_secret_wrong": Unauthenticated,
    "unauthenticated": Unauthenticated,
    "permission_denied": PermissionDenied,
    "session_not_owned": SessionNotOwned,
    "quota_reached": QuotaReached,
    "permits_out_of_range": InvalidArgument,
    "permits_mismatch": InvalidArgument,
    "mode_conflict": InvalidArgument,
    "multi_lock_size": InvalidArgument,
    "multi_lock_repeated": InvalidArgument,
    "multi_lock_held": InvalidArgument,
}


def class_for_kind(kind: str) -> Optional[type[PalisadeError]]:
    """The exception class of a lock-table refusal's kind, or ``None`` for a kind not known."""
    return _BY_KIND.get(kind)


def class_for_code(code: grpc.StatusCode) -> type[PalisadeError]:
    """The class of a status this client names no other way (``ErrorClass::of_code``)."""
    if code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.DATA_LOSS, grpc.StatusCode.UNIMPLEMENTED):
        return ProtocolError
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED):
        return NotApplied
    if code in (
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.ABORTED,
    ):
        return OutcomeUnknown
    if code is grpc.StatusCode.NOT_FOUND:
        return SessionNotFound
    if code is grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidArgument
    if code is grpc.StatusCode.UNAUTHENTICATED:
        return Unauthenticated
    if code is grpc.StatusCode.PERMISSION_DENIED:
        return NotHolder
    return Refused
