"""Leader election (and the grant values under it) against a real `palisade serve`."""

from __future__ import annotations

import asyncio
import pathlib
import queue
import sqlite3
import threading
from typing import Any, Callable, Optional, Union, cast

import pytest

import palisade
from palisade import aio, fence
from palisade._proto import palisade_pb2 as pb
from palisade.client import LockEvent, LockEvents
from palisade.election import Leader, LeaderChanges, Leadership
from palisade.fence import sqlite

from .conftest import Server

# Every wait for something the server does is bounded by this (a hang fails, it does not block).
WAIT_S = 10


class Follower:
    """Reads an iterator (a watch, an observation) on a thread of its own, so that the test's
    waits for its items are bounded."""

    def __init__(self, iterator: Union[LockEvents, LeaderChanges]) -> None:
        self.iterator = iterator
        self.items: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for item in self.iterator:
                self.items.put(("item", item))
        except BaseException as error:  # noqa: BLE001 - handed to the test
            self.items.put(("error", error))
        self.items.put(("end", None))

    def next(self) -> Any:
        what, item = self.items.get(timeout=WAIT_S)
        if what == "error":
            raise item
        assert what == "item", "the stream ended"
        return item

    def close(self) -> None:
        self.iterator.close()
        self.thread.join(WAIT_S)


def test_candidates_lead_in_turn_and_an_observer_sees_their_values(
    client: palisade.Client, unique: str, tmp_path: pathlib.Path
) -> None:
    election = palisade.Election(client, unique)
    observer = Follower(election.observe())
    try:
        assert observer.next() is None, "nobody leads yet"
        assert election.leader() is None
        first = client.session(10)
        second = client.session(10)
        leading = election.campaign(first, "10.0.0.1:5432")
        a = Leader(first.id, leading.epoch, "10.0.0.1:5432")
        assert observer.next() == a
        assert election.leader() == a
        assert leading.sequencer == leading.grant.sequencer and leading.epoch == leading.grant.token
        status = client.status(unique)
        assert status.holder is not None and status.holder.value == "10.0.0.1:5432"
        assert [s.holder.value if s.holder else None for s in client.list_locks(unique)] == ["10.0.0.1:5432"]

        # The second candidate waits its turn; its value shows only once it leads.
        campaigned: queue.Queue[Leadership] = queue.Queue()
        threading.Thread(target=lambda: campaigned.put(election.campaign(second, "10.0.0.2:5432")), daemon=True).start()
        _until(lambda: client.status(unique).waiters == (second.id,))
        assert election.leader() == a

        leading.proclaim("10.0.0.1:6543")
        moved = Leader(first.id, leading.epoch, "10.0.0.1:6543")
        assert observer.next() == moved
        assert election.leader() == moved

        leading.resign()
        successor = campaigned.get(timeout=WAIT_S)
        assert successor.epoch > leading.epoch, "every new leader's epoch is higher"
        b = Leader(second.id, successor.epoch, "10.0.0.2:5432")
        seen = [observer.next()]
        while seen[-1] != b:
            seen.append(observer.next())
        assert all(item is None for item in seen[:-1]), seen  # nobody leads in between, at most
        assert election.leader() == b

        # The leaders' side effects are fenced with their sequencers, as a lock holder's are.
        verifier = fence.Verifier(client.public_keys())
        db = sqlite3.connect(tmp_path / "app.db", isolation_level=None)
        sqlite.ensure_schema(db)
        with sqlite.transaction(db, "scheduler", verifier.verify(successor.sequencer)):
            pass
        with pytest.raises(fence.Stale):
            with sqlite.transaction(db, "scheduler", verifier.verify(leading.sequencer)):
                pass
        db.close()

        # The former leader's proclaim is refused: its grant is no longer the lock's holding.
        with pytest.raises(palisade.NotHolder) as refused:
            leading.proclaim("10.0.0.1:7777")
        assert refused.value.kind == "not_holder"
        assert election.leader() == b

        with successor:  # resigns on exit
            assert not successor.lost.is_set()
        assert observer.next() is None
        assert election.leader() is None
        first.close()
        second.close()
    finally:
        observer.close()


def test_a_lock_carries_a_value_to_status_and_watch(client: palisade.Client, unique: str) -> None:
    events = Follower(client.watch(unique))
    try:
        snapshot = events.next()
        assert (snapshot.kind, snapshot.session, snapshot.value) == ("snapshot", None, None)
        with client.lock(unique, ttl=5, value="primary é") as grant:
            granted = events.next()
            assert (granted.kind, granted.token, granted.value) == ("granted", grant.token, "primary é")
            grant.proclaim(None)  # removes it
            cleared = events.next()
            assert (cleared.kind, cleared.token, cleared.value) == ("value_set", grant.token, None)
            holder = client.status(unique).holder
            assert holder is not None and holder.value is None
            grant.proclaim("é" * 512)  # 1024 bytes: the longest value
            assert events.next().value == "é" * 512
        released = events.next()
        assert (released.kind, released.token, released.value) == ("released", grant.token, None)
    finally:
        events.close()


def test_invalid_values_are_refused_before_they_are_sent(client: palisade.Client, unique: str) -> None:
    credential = palisade.SessionCredential(1, bytes(32))  # a session the server would refuse
    cases: list[tuple[Any, str]] = [
        ("", "value is empty"),
        ("x" * 1025, "1025 bytes, the limit is 1024"),
        ("é" * 512 + "x", "1025 bytes, the limit is 1024"),
        ("a\nb", "control character"),
        ("\x7f", "control character"),
        ("\x85", "control character"),
        ("\ud800", "not valid UTF-8"),
        (b"bytes", "a value is a str"),
    ]
    for bad, says in cases:
        calls: list[Callable[[], object]] = [
            lambda: client.acquire(credential, unique, wait=0, value=bad),
            lambda: client.proclaim(credential, unique, 1, bad),
        ]
        for call in calls:
            with pytest.raises(palisade.InvalidArgument, match=says) as refused:
                call()
            assert refused.value.kind is None, "refused by the client: the service would have said why"
    with pytest.raises(palisade.InvalidArgument, match="control character"):
        with client.lock(unique, ttl=5, value="a\tb"):
            pass
    with client.session(5) as session:
        election = palisade.Election(client, unique)
        with pytest.raises(palisade.InvalidArgument, match="empty"):
            election.campaign(session, "")
        with election.campaign(session) as leadership:
            assert election.leader() == Leader(session.id, leadership.epoch, None)
            with pytest.raises(palisade.InvalidArgument, match="control character"):
                leadership.proclaim("\x00")
        # What the service says of one sent anyway: the same class, with its kind.
        request = pb.AcquireRequest(
            session=session.id, lock=unique, request_id=1, session_secret=session.credential.secret, value="a\nb"
        )
        with pytest.raises(palisade.InvalidArgument) as refused:
            client._calls.call("Acquire", request, "an acquire with a bad value")
        assert (refused.value.kind, refused.value.detail.reason) == ("invalid_value", "control_character")


def test_observing_skips_unknown_kinds_and_repeats() -> None:
    def event(
        kind: str, session: Optional[int] = None, token: Optional[int] = None, value: Optional[str] = None
    ) -> LockEvent:
        return LockEvent(kind, "e", session, token, 0, value, 0)

    events = [
        event("snapshot", 3, 9, "a"),
        event("other", 3, 9),
        event("snapshot", 3, 9, "a"),  # a reopened stream's snapshot: nothing changed
        event("value_set", 3, 9, "b"),
        event("released", 3, 9),
        event("snapshot"),
        event("granted", 4, 11, "c"),
    ]
    # An iterator stands in for the watch: LeaderChanges only iterates it.
    changes = LeaderChanges(cast(LockEvents, iter(events)))
    assert list(changes) == [Leader(3, 9, "a"), Leader(3, 9, "b"), None, Leader(4, 11, "c")]


def test_an_observation_is_reopened_after_the_server_restarts(
    palisade_bin: pathlib.Path, tmp_path: pathlib.Path, unique: str
) -> None:
    server = Server(palisade_bin, tmp_path / "data")
    try:
        with palisade.Client([server.endpoint]) as client:
            credential, _ = client.open_session_without_keepalive(60)
            grant = client.acquire(credential, unique, wait=0, value="before")
            observer = Follower(palisade.Election(client, unique).observe())
            try:
                assert observer.next() == Leader(credential.id, grant.token, "before")
                server.stop()
                server = Server(palisade_bin, tmp_path / "data", port=server.port)
                client.proclaim(credential, unique, grant.token, "after")
                # The reopened stream's snapshot repeats no item; the proclaim is the next one.
                assert observer.next() == Leader(credential.id, grant.token, "after")
            finally:
                observer.close()
    finally:
        server.stop()


async def test_async_candidates_lead_in_turn_and_an_observer_sees_them(server: Server, unique: str) -> None:
    async with await aio.Client.connect([server.endpoint]) as client:
        election = aio.Election(client, unique)
        changes = await election.observe()
        try:
            assert await _next(changes) is None
            first = await client.session(10)
            second = await client.session(10)
            async with await election.campaign(first, "a:1") as leading:
                assert await _next(changes) == Leader(first.id, leading.epoch, "a:1")
                successor = asyncio.ensure_future(election.campaign(second, "b:1"))
                await leading.proclaim("a:2")
                assert await _next(changes) == Leader(first.id, leading.epoch, "a:2")
                assert await election.leader() == Leader(first.id, leading.epoch, "a:2")
            after = await asyncio.wait_for(successor, WAIT_S)
            assert after.epoch > leading.epoch
            item = await _next(changes)
            if item is None:  # nobody led for a moment
                item = await _next(changes)
            assert item == Leader(second.id, after.epoch, "b:1")
            with pytest.raises(palisade.NotHolder):
                await leading.proclaim("a:3")
            await after.resign()
            assert await _next(changes) is None
            await first.close()
            await second.close()
        finally:
            await changes.close()


async def _next(changes: aio.LeaderChanges) -> Optional[Leader]:
    return await asyncio.wait_for(changes.__anext__(), WAIT_S)


def _until(condition: Callable[[], bool]) -> None:
    import time

    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.02)
