"""The asyncio client, on ``grpc.aio``: the blocking API's rules with ``await``, in the same
layout (:mod:`palisade.aio.client`, :mod:`palisade.aio.election`).

    from palisade import aio

    client = await aio.Client.connect(["127.0.0.1:7457"])
    async with client.lock("jobs/nightly", ttl=10) as grant:
        print(grant.token, grant.sequencer)
        # grant.lost is an asyncio.Event, set if the session is lost

The session's keepalive is a task on the running loop that drives the same engine as
:class:`palisade.Session`'s thread (:mod:`palisade._keepalive`). Endpoints, retries, request ids
and errors are shared with the blocking client (:mod:`palisade._core`, :mod:`palisade.errors`).
"""

from .._core import LockPart
from ..client import AcquireResult, Holder, LockEvent, LockStatus, SessionCredential
from ..election import Leader
from .client import Client, Grant, LockEvents, OnLost, Session
from .election import Election, LeaderChanges, Leadership, OnLostLeadership

__all__ = [
    "AcquireResult",
    "Client",
    "Election",
    "Grant",
    "Holder",
    "Leader",
    "LeaderChanges",
    "Leadership",
    "LockEvent",
    "LockEvents",
    "LockPart",
    "LockStatus",
    "OnLost",
    "OnLostLeadership",
    "Session",
    "SessionCredential",
]
