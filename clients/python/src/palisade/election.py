"""Leader election on a lock: :class:`Election` (``palisade.aio.Election`` for asyncio).

An election is a lock whose holder is the leader, as in the Rust client's ``Election``. A
candidate campaigns by acquiring the lock with a value (its address, say) and waiting in the
lock's FIFO queue; it leads while its session holds the lock. The grant's fencing token is the
leader's **epoch**: every new leader's epoch is higher than every earlier one's, so whatever the
leader writes can be fenced with it, exactly as a lock holder's writes are with its sequencer.

    election = palisade.Election(client, "services/scheduler")
    with client.session(ttl=10) as session:
        with election.campaign(session, "10.0.0.5:8080") as leadership:   # waits its turn
            leadership.proclaim("10.0.0.5:9090")       # moved: tell the observers
            schedule(leadership.sequencer)             # side effects fenced with the epoch

    for leader in election.observe():                  # Leader(session, epoch, value) or None
        print(leader)
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from typing import TYPE_CHECKING, Any, Callable, Literal, Optional, Union

from . import errors
from .client import LockEvent, LockEvents, LockStatus

if TYPE_CHECKING:
    from .client import Client, Grant, Session

log = logging.getLogger("palisade")


@dataclasses.dataclass(frozen=True)
class Leader:
    """Who leads an election."""

    #: The leader's session.
    session: int
    #: The leader's epoch: its grant's fencing token, higher than every earlier leader's.
    epoch: int
    #: What the leader proclaimed (its campaign's value, or a later proclaim); ``None`` if none.
    value: Optional[str]


class _Nothing(enum.Enum):
    NOTHING = enum.auto()


#: Marks "nothing reported yet" in :class:`LeaderChanges`, where ``None`` means nobody leads
#: (an enum's only member, so that a type checker tells it from a leader).
_NOTHING = _Nothing.NOTHING
#: A leader, ``None`` (nobody leads) or :data:`_NOTHING` (not known).
LeaderOrNothing = Union[Leader, None, Literal[_Nothing.NOTHING]]


def leader_of(status: LockStatus) -> Optional[Leader]:
    """The leader a lock's status shows."""
    holder = status.holder
    return None if holder is None else Leader(holder.session, holder.token, holder.value)


def leader_after(event: LockEvent) -> LeaderOrNothing:
    """The leader after ``event`` (a :class:`Leader` or ``None``), or :data:`_NOTHING` for an
    event that says nothing about it (a kind this client does not know)."""
    if event.kind in ("snapshot", "granted", "value_set"):
        if event.session is None or event.token is None:
            return None
        return Leader(event.session, event.token, event.value)
    if event.kind in ("released", "expired"):
        return None  # the event names the former holder, but nobody leads after it
    return _NOTHING


class LeaderChanges:
    """The changes of an election's leader, from :meth:`Election.observe`: an iterator of
    :class:`Leader` or ``None`` (nobody leads), each item different from the one before."""

    def __init__(self, events: LockEvents) -> None:
        self._events = events
        self._last: LeaderOrNothing = _NOTHING

    def __iter__(self) -> "LeaderChanges":
        return self

    def __next__(self) -> Optional[Leader]:
        for event in self._events:
            leader = leader_after(event)
            if leader is _NOTHING or leader == self._last:
                continue
            self._last = leader
            return leader
        raise StopIteration

    def close(self) -> None:
        """Ends the stream (also from another thread)."""
        self._events.close()

    def __enter__(self) -> "LeaderChanges":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


OnLostLeadership = Callable[["Leadership", str], None]


class Leadership:
    """This process leads an election: its session holds the election's lock.

    ``epoch`` is the grant's fencing token and ``sequencer`` its signed form: pass the
    sequencer to the resources the leader writes to (:mod:`palisade.fence`) exactly as a lock's.
    ``lost`` is the grant's :class:`threading.Event`, set when the session is lost: from then on
    another candidate may lead, so stop acting as the leader. As a context manager it resigns
    on exit.
    """

    def __init__(self, grant: "Grant") -> None:
        self.grant = grant

    @property
    def epoch(self) -> int:
        return self.grant.token

    @property
    def sequencer(self) -> str:
        return self.grant.sequencer

    @property
    def lock(self) -> str:
        return self.grant.lock

    @property
    def session_id(self) -> int:
        return self.grant.session_id

    @property
    def lost(self) -> Any:
        return self.grant.lost

    @property
    def lost_reason(self) -> Optional[str]:
        return self.grant.lost_reason

    def proclaim(self, value: Optional[str]) -> None:
        """Tells observers a new value (``None`` removes it). Refused with
        :class:`errors.NotHolder` once this leadership has ended (:class:`errors.SessionNotFound`
        once its session has)."""
        self.grant.proclaim(value)

    def resign(self) -> None:
        """Steps down: the next candidate in line leads. Raises :class:`errors.SessionLost` if
        the leadership was already lost (as :meth:`palisade.Grant.release`)."""
        self.grant.release()

    def __enter__(self) -> "Leadership":
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.grant.released and not self.grant.lost.is_set():
            try:
                self.resign()
            except errors.PalisadeError as error:
                log.debug("resigning from election %r failed: %s", self.lock, error)
        self.grant.released = True

    def __repr__(self) -> str:
        return f"Leadership(election={self.lock!r}, epoch={self.epoch}, session={self.session_id}, lost={self.lost.is_set()})"


class Election:
    """One election, named by its lock."""

    def __init__(self, client: "Client", name: str) -> None:
        from . import _core

        self.client = client
        self.name = _core.validate_lock_name(name)

    def campaign(
        self, session: "Session", value: Optional[str] = None, *, on_lost: Optional[OnLostLeadership] = None
    ) -> Leadership:
        """Campaigns with ``session``: waits (in FIFO order behind earlier candidates) until
        this session leads, then returns the :class:`Leadership`. ``value`` is what observers
        see of the leader (1 to 1024 bytes of UTF-8 without control characters). ``on_lost(
        leadership, reason)`` is called once, from the keepalive thread, if the session is lost
        while leading."""
        leadership: list[Leadership] = []

        def lost(grant: "Grant", reason: str) -> None:
            if on_lost is not None:
                on_lost(leadership[0] if leadership else Leadership(grant), reason)

        grant = session.acquire(self.name, wait=None, value=value, on_lost=lost if on_lost is not None else None)
        leadership.append(Leadership(grant))
        return leadership[0]

    def leader(self) -> Optional[Leader]:
        """The current leader, or ``None`` while nobody leads; read linearizably (it reflects
        every change acknowledged before the call)."""
        return leader_of(self.client.status(self.name))

    def observe(self) -> LeaderChanges:
        """Follows the leader: the first item is the leader now, then one item per change (a new
        leader, a new value proclaimed, nobody leading). The stream reopens at another member as
        :meth:`Client.watch` does."""
        return LeaderChanges(self.client.watch(self.name))

    def __repr__(self) -> str:
        return f"Election({self.name!r})"
