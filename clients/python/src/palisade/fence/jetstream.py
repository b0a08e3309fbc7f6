"""A fenced publish to NATS JetStream (nats-py): the broker itself refuses a message from a
superseded lock holder. The Python twin of the Rust crate ``palisade-fence-nats``; both write the
same header, so Rust and Python publishers fence one subject together.

The fence state of a subject is its last message's :data:`SEQUENCER_HEADER`. A publish reads the
last message (``last_by_subj``, answered by the stream's leader), checks its own sequencer
against the one there with the same :func:`~palisade.fence.check` as every backend (an older
token is :class:`~palisade.fence.Stale`, with the presented and accepted tokens), and publishes
with ``Nats-Expected-Last-Subject-Sequence`` set to that message's sequence (0 for an empty
subject), so nothing lands between the check and the publish::

    fence = JetStreamFence(nc.jetstream(), "EVENTS", Verifier(public_key))
    sequencer = fence.verify(os.environ["PALISADE_SEQUENCER"])
    ack = await fence.publish("events.invoices", sequencer, b"invoice 42 sent")

:meth:`JetStreamFence.publish` reads and checks again when the broker says another message landed
in between, at most :data:`CONFLICT_RETRIES_MAX` times. A read-modify-write uses
:meth:`JetStreamFence.last` and :meth:`JetStreamFence.publish_after`, where a message landing in
between is a retryable :class:`~palisade.fence.Storage` (read again, recompute).

Every publisher on the subject must go through the fence (a plain publish carries no token and
resets what the next publish compares with), and the last message must stay (no
``max_msgs_per_subject``, ``max_age`` or purge on fenced subjects). A stale holder can still
publish before the new holder's first message lands: filter on the consumer side
(:mod:`palisade.fence.stream`) or use a fenced outbox where that matters.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from typing import Any, Optional

from . import (
    WRITE,
    Corrupt,
    FenceError,
    FenceState,
    OutcomeUnknown,
    Storage,
    Verifier,
    check,
    stored_holder,
)
from ..sequencer import VerifiedSequencer
from .stream import SEQUENCER_HEADER

#: How many times :meth:`JetStreamFence.publish` reads again after the broker refused a publish
#: because another message landed on the subject since its read (after a short, growing,
#: jittered pause each time).
CONFLICT_RETRIES_MAX = 8
#: The JetStream error code of a refused ``Nats-Expected-Last-Subject-Sequence``.
WRONG_LAST_SEQUENCE = 10071
_NO_MESSAGE_FOUND = 10037
_EXPECTED_LAST_SUBJECT_SEQUENCE = "Nats-Expected-Last-Subject-Sequence"


@dataclasses.dataclass(frozen=True)
class LastMessage:
    """A subject's last message and the fence state its header carries (``None``: published
    without a sequencer)."""

    sequence: int
    payload: bytes
    headers: dict[str, str]
    accepted: Optional[FenceState]


class _Conflict(Exception):
    """Another message is the subject's last now: nothing was stored."""


class JetStreamFence:
    """Fenced publishes to the subjects of one JetStream stream (its name, not a subject)."""

    def __init__(self, js: Any, stream: str, verifier: Verifier, *, expect_lock: Optional[str] = None) -> None:
        self._js = js
        self._stream = stream
        self._verifier = verifier
        self._expect_lock = expect_lock

    def verify(self, presented: Optional[str]) -> VerifiedSequencer:
        """Verifies a presented sequencer (``$PALISADE_SEQUENCER``) with this fence's keys."""
        return self._verifier.verify(presented)

    async def last(self, subject: str) -> Optional[LastMessage]:
        """The last message on ``subject``, or ``None``. A header that does not verify is
        :class:`~palisade.fence.Corrupt`: no fence trusting these keys published it."""
        from nats.errors import Error as NatsError
        from nats.js.errors import APIError

        try:
            message = await self._js.get_last_msg(self._stream, subject)
        except APIError as error:
            if error.err_code == _NO_MESSAGE_FOUND:
                return None
            raise Storage(f"fence storage error: reading the last message on {subject!r}: {error}") from None
        except (NatsError, TimeoutError) as error:
            raise Storage(f"fence storage error: reading the last message on {subject!r}: {error!r}") from None
        headers = {str(k): str(v) for k, v in (message.headers or {}).items()}
        accepted: Optional[FenceState] = None
        text = headers.get(SEQUENCER_HEADER)
        if text is not None:
            try:
                verified = self._verifier.verify(text)
            except FenceError as refused:
                raise Corrupt(
                    f"fence state of scope {subject!r} is corrupt: the last message (sequence {message.seq}) "
                    f"carries a {SEQUENCER_HEADER} that does not verify: {refused}"
                ) from None
            accepted = FenceState(verified.binding, verified.token, stored_holder(verified))
        return LastMessage(int(message.seq or 0), bytes(message.data or b""), headers, accepted)

    async def publish_after(
        self,
        subject: str,
        sequencer: VerifiedSequencer,
        last: Optional[LastMessage],
        payload: bytes,
        headers: Optional[dict[str, str]] = None,
    ) -> Any:
        """Publishes as the holder of ``sequencer`` provided ``last`` is still the subject's last
        message; returns the broker's ``PubAck``. A newer holder's message since is
        :class:`~palisade.fence.Stale`; any other is a retryable :class:`~palisade.fence.Storage`."""
        self._check(last, sequencer)
        expected = last.sequence if last is not None else 0
        try:
            return await self._send(subject, sequencer, expected, payload, headers)
        except _Conflict:
            now = await self.last(subject)
            self._check(now, sequencer)
            raise Storage(
                f"fence storage error: {subject!r} changed since it was read (its last message was {expected}, "
                f"it is {now.sequence if now is not None else 0} now); read it again"
            ) from None

    async def publish(
        self,
        subject: str,
        sequencer: VerifiedSequencer,
        payload: bytes,
        headers: Optional[dict[str, str]] = None,
    ) -> Any:
        """Reads, checks and publishes expecting the message read to be still the last; reads and
        checks again when another landed in between, at most :data:`CONFLICT_RETRIES_MAX` times."""
        for attempt in range(CONFLICT_RETRIES_MAX + 1):
            if attempt:
                # Publishers that collided would collide again in lockstep: wait a little,
                # longer each time, and not the same time as the others.
                await asyncio.sleep(random.uniform(0, attempt * 0.004))
            last = await self.last(subject)
            self._check(last, sequencer)
            try:
                return await self._send(subject, sequencer, last.sequence if last is not None else 0, payload, headers)
            except _Conflict:
                continue
        raise Storage(
            f"fence storage error: {subject!r} kept changing: {CONFLICT_RETRIES_MAX + 1} fenced publishes in a row "
            "found another message landed since their read"
        )

    def _check(self, last: Optional[LastMessage], sequencer: VerifiedSequencer) -> FenceState:
        # A publish is a write: a shared grant (a reader) is refused.
        return check(last.accepted if last is not None else None, self._expect_lock, sequencer, WRITE)

    async def _send(
        self,
        subject: str,
        sequencer: VerifiedSequencer,
        expected: int,
        payload: bytes,
        headers: Optional[dict[str, str]],
    ) -> Any:
        from nats.errors import Error as NatsError
        from nats.js.errors import APIError, NoStreamResponseError

        sent = dict(headers or {})
        sent[SEQUENCER_HEADER] = sequencer.text
        sent[_EXPECTED_LAST_SUBJECT_SEQUENCE] = str(expected)
        try:
            return await self._js.publish(subject, payload, stream=self._stream, headers=sent)
        except APIError as error:
            if error.err_code == WRONG_LAST_SEQUENCE:
                raise _Conflict() from None
            raise Storage(f"fence storage error: stream {self._stream!r} did not store the message on {subject!r}: {error}") from None
        except NoStreamResponseError:
            raise Storage(f"fence storage error: no stream stores {subject!r}") from None
        except (TimeoutError, NatsError) as error:
            # No answer, or the connection failed around the request: it may have been stored.
            raise OutcomeUnknown(
                f"outcome unknown: the publish to {subject!r} got no answer ({error!r}); the message may or may "
                "not have been stored, read the subject before deciding again"
            ) from None


__all__ = ["CONFLICT_RETRIES_MAX", "SEQUENCER_HEADER", "JetStreamFence", "LastMessage"]
