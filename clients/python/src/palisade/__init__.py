"""Python client of the Palisade lock service.

    import palisade

    client = palisade.Client(["127.0.0.1:7457"])   # token=..., else $PALISADE_AUTH_TOKEN
    # TLS: palisade.Client([...], tls=palisade.Tls.from_files("ca.pem"[, "client.pem", "client.key"]))
    with client.lock("jobs/nightly", ttl=10) as grant:
        print(grant.token, grant.sequencer)   # present the sequencer to the resource
        if grant.lost.is_set(): ...           # the session was lost: stop writing

``palisade.Election`` elects a leader on a lock (``campaign``, ``leader``, ``observe``);
``palisade.aio`` is the same API for asyncio; ``palisade.fence`` verifies sequencers and fences
writes to PostgreSQL, SQLite and Redis with the same tables and script as the Rust adapters.
"""

from . import errors
from ._core import AUTH_TOKEN_ENV, MULTI_LOCKS_MAX, BearerToken, LockPart
from .client import (
    AcquireResult,
    Client,
    Grant,
    Holder,
    LockEvent,
    LockEvents,
    LockStatus,
    Session,
    SessionCredential,
)
from .election import Election, Leader, LeaderChanges, Leadership
from .errors import (
    Busy,
    ErrorClass,
    InvalidArgument,
    Misconfigured,
    NotAcquired,
    NotApplied,
    NotHolder,
    OutcomeUnknown,
    PalisadeError,
    PermissionDenied,
    ProtocolError,
    QuotaReached,
    Refused,
    SessionLost,
    SessionNotFound,
    SessionNotOwned,
    Unauthenticated,
    Unavailable,
    WaitEnded,
)
from .sequencer import KeySet, PublicKey, Sequencer, VerifiedSequencer, verify
from .tls import TLS_FILE_BYTES_MAX, Tls

__all__ = [
    "AUTH_TOKEN_ENV",
    "MULTI_LOCKS_MAX",
    "AcquireResult",
    "BearerToken",
    "Busy",
    "Client",
    "Election",
    "ErrorClass",
    "Grant",
    "Holder",
    "InvalidArgument",
    "KeySet",
    "Leader",
    "LeaderChanges",
    "Leadership",
    "LockEvent",
    "LockEvents",
    "LockPart",
    "LockStatus",
    "Misconfigured",
    "NotAcquired",
    "NotApplied",
    "NotHolder",
    "OutcomeUnknown",
    "PalisadeError",
    "PermissionDenied",
    "ProtocolError",
    "PublicKey",
    "QuotaReached",
    "Refused",
    "Sequencer",
    "Session",
    "SessionCredential",
    "SessionLost",
    "SessionNotFound",
    "SessionNotOwned",
    "TLS_FILE_BYTES_MAX",
    "Tls",
    "Unauthenticated",
    "Unavailable",
    "VerifiedSequencer",
    "WaitEnded",
    "errors",
    "verify",
]
