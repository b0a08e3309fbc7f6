"""Python client of the Palisade lock service.

    import palisade

    client = palisade.Client(["127.0.0.1:7457"])
    with client.lock("jobs/nightly", ttl=10) as grant:
        print(grant.token, grant.sequencer)   # present the sequencer to the resource
        if grant.lost.is_set(): ...           # the session was lost: stop writing

``palisade.aio`` is the same API for asyncio; ``palisade.fence`` verifies sequencers and fences
writes to PostgreSQL, SQLite and Redis with the same tables and script as the Rust adapters.
"""

from . import errors
from .client import AcquireResult, Client, Grant, Holder, LockStatus, Session, SessionCredential
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
    ProtocolError,
    Refused,
    SessionLost,
    SessionNotFound,
    Unauthenticated,
    Unavailable,
    WaitEnded,
)
from .sequencer import KeySet, PublicKey, Sequencer, VerifiedSequencer, verify

__all__ = [
    "AcquireResult",
    "Busy",
    "Client",
    "ErrorClass",
    "Grant",
    "Holder",
    "InvalidArgument",
    "KeySet",
    "LockStatus",
    "Misconfigured",
    "NotAcquired",
    "NotApplied",
    "NotHolder",
    "OutcomeUnknown",
    "PalisadeError",
    "ProtocolError",
    "PublicKey",
    "Refused",
    "Sequencer",
    "Session",
    "SessionCredential",
    "SessionLost",
    "SessionNotFound",
    "Unauthenticated",
    "Unavailable",
    "VerifiedSequencer",
    "WaitEnded",
    "errors",
    "verify",
]
