"""Leader election on a lock for asyncio: :class:`Election`, :class:`Leadership` and
:class:`LeaderChanges`, as :mod:`palisade.election` is for the blocking API (whose rules and
:class:`palisade.Leader` they share)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable, Optional, Union

from .. import _core, errors
from ..election import _NOTHING, Leader, LeaderOrNothing, leader_after, leader_of
from .client import Client, Grant, LockEvents, Session

log = logging.getLogger("palisade")

class LeaderChanges:
    """The changes of an election's leader, from :meth:`Election.observe`: an async iterator of
    :class:`palisade.Leader` or ``None`` (nobody leads), each item different from the one
    before."""

    def __init__(self, events: LockEvents) -> None:
        self._events = events
        self._last: LeaderOrNothing = _NOTHING

    def __aiter__(self) -> "LeaderChanges":
        return self

    async def __anext__(self) -> Optional[Leader]:
        async for event in self._events:
            leader = leader_after(event)
            if leader is _NOTHING or leader == self._last:
                continue
            self._last = leader
            return leader
        raise StopAsyncIteration

    async def close(self) -> None:
        await self._events.close()

    async def __aenter__(self) -> "LeaderChanges":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


OnLostLeadership = Callable[["Leadership", str], Union[None, Awaitable[None]]]


class Leadership:
    """This process leads an election (see :class:`palisade.Leadership`); ``lost`` is the
    grant's :class:`asyncio.Event`. As an async context manager it resigns on exit."""

    def __init__(self, grant: Grant) -> None:
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
    def lost(self) -> asyncio.Event:
        return self.grant.lost

    @property
    def lost_reason(self) -> Optional[str]:
        return self.grant.lost_reason

    async def proclaim(self, value: Optional[str]) -> None:
        """Tells observers a new value (``None`` removes it); :class:`errors.NotHolder` once
        this leadership has ended."""
        await self.grant.proclaim(value)

    async def resign(self) -> None:
        """Steps down: the next candidate in line leads."""
        await self.grant.release()

    async def __aenter__(self) -> "Leadership":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if not self.grant.released and not self.grant.lost.is_set():
            try:
                await self.resign()
            except errors.PalisadeError as error:
                log.debug("resigning from election %r failed: %s", self.lock, error)
        self.grant.released = True

    def __repr__(self) -> str:
        return f"Leadership(election={self.lock!r}, epoch={self.epoch}, session={self.session_id}, lost={self.lost.is_set()})"


class Election:
    """One election, named by its lock (see :class:`palisade.Election`)."""

    def __init__(self, client: Client, name: str) -> None:
        self.client = client
        self.name = _core.validate_lock_name(name)

    async def campaign(
        self, session: Session, value: Optional[str] = None, *, on_lost: Optional[OnLostLeadership] = None
    ) -> Leadership:
        """Campaigns with ``session``: waits (in FIFO order behind earlier candidates) until
        this session leads (see :meth:`palisade.Election.campaign`)."""
        leadership: list[Leadership] = []

        async def lost(grant: Grant, reason: str) -> None:
            assert on_lost is not None
            result = on_lost(leadership[0] if leadership else Leadership(grant), reason)
            if asyncio.iscoroutine(result):
                await result

        grant = await session.acquire(self.name, wait=None, value=value, on_lost=lost if on_lost is not None else None)
        leadership.append(Leadership(grant))
        return leadership[0]

    async def leader(self) -> Optional[Leader]:
        """The current leader, or ``None`` while nobody leads (linearizable)."""
        return leader_of(await self.client.status(self.name))

    async def observe(self) -> LeaderChanges:
        """Follows the leader: the leader now, then one item per change; reopens as
        :meth:`Client.watch` does."""
        return LeaderChanges(await self.client.watch(self.name))

    def __repr__(self) -> str:
        return f"Election({self.name!r})"
