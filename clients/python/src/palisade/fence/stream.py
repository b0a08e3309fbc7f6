"""Fencing a message stream from the consumer's side, for any broker whose messages carry
headers (Kafka, RabbitMQ, NATS core or JetStream): the Python twin of the Rust
``palisade_fence::stream``.

A producer puts its grant's sequencer in the :data:`SEQUENCER_HEADER` of every message. The
consumer drops a message whose token is older than the highest token it has accepted for that
lock, and keeps that high-water mark **in its own database, in the same commit as its output**
(the ``palisade_fence`` row of a scope, claimed in the consumer's transaction)::

    with conn.transaction():
        admission = stream.admit_postgres(conn, "billing/invoices", msg.headers.get(SEQUENCER_HEADER), verifier)
        if admission.process:
            ... write the message's output ...
        ... record the consumer's offset ...
    await msg.ack()

Never keep the mark only in memory: a restarted consumer, or another one taking over, would
start from nothing and accept the superseded holder's late messages (how xtdb's reader-side
fence regressed). Kept in the same commit as the output, a crash loses both together, and the
redelivered message is decided again.

A message from the newest grant seen (or the same grant again) is processed and moves the mark;
an older token, the same token from another session, another lock (or slot), a reader's message
(a shared grant: a message is a write), or a missing, malformed or forged header is dropped, with the refusal saying why. A database failure raises
:class:`~palisade.fence.Storage`: roll back and let the message come again.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from . import FenceError, Verifier
from . import postgres as _postgres
from ..sequencer import VerifiedSequencer

#: The message header that carries the producer's sequencer text (``$PALISADE_SEQUENCER``).
SEQUENCER_HEADER = "Palisade-Sequencer"


@dataclasses.dataclass(frozen=True)
class Admission:
    """What the filter decided: ``process`` with the verified ``sequencer``, or not, with the
    ``refusal`` that says why (its ``kind`` is ``stale``, ``token_reissued``, ``wrong_lock``,
    ``shared_write``, ``missing``, ``malformed`` or ``forged``)."""

    process: bool
    sequencer: Optional[VerifiedSequencer] = None
    refusal: Optional[FenceError] = None


def admit_postgres(conn: Any, scope: str, presented: Optional[str], verifier: Verifier) -> Admission:
    """Decides, inside ``conn``'s current transaction (psycopg 3), whether a message whose
    :data:`SEQUENCER_HEADER` is ``presented`` takes effect, advancing the mark of ``scope`` (one
    scope per lock followed) when it does. The transaction stays usable after a drop."""
    try:
        sequencer = verifier.verify(presented)
    except FenceError as refusal:
        return Admission(process=False, refusal=refusal)
    try:
        _postgres.claim(conn, scope, sequencer)
    except FenceError as refusal:
        if refusal.is_rejection:
            return Admission(process=False, sequencer=sequencer, refusal=refusal)
        raise
    return Admission(process=True, sequencer=sequencer)


__all__ = ["SEQUENCER_HEADER", "Admission", "admit_postgres"]
