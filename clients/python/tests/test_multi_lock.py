"""Multi-locks from Python (docs/locks.md), sync and asyncio, against a real server: several
locks granted at once or not at all, each with its own token and sequencer, each released on its
own, and the refusals of a repeated or held lock."""

import threading

import pytest

import palisade
from palisade import LockPart, aio, errors
from palisade.sequencer import SHARED, Access

from .conftest import Server


def test_a_multi_lock_grants_each_lock_its_own_sequencer_and_releases_them_one_by_one(
    client: palisade.Client, unique: str
) -> None:
    keys = client.public_keys()
    a, b = f"{unique}/a", f"{unique}/b"
    first, second = client.session(10), client.session(10)
    try:
        held = first.acquire_all([a, LockPart(b, shared=True)], wait=0)
        assert [g.lock for g in held] == [a, b]
        assert [g.access for g in held] == [Access(), SHARED]
        assert held[0].token != held[1].token
        for grant in held:
            verified = palisade.verify(grant.sequencer, keys)
            assert (verified.lock, verified.token, verified.session) == (grant.lock, grant.token, first.id)

        # All or none: a try of {c, a} finds a busy and leaves c free.
        c = f"{unique}/c"
        with pytest.raises(palisade.Busy):
            second.acquire_all([c, a], wait=0)
        assert client.status(c).holder is None

        # A waiter for {c, a} is granted both once a alone is released; b stays held.
        granted: list[palisade.Grant] = []
        waiter = threading.Thread(target=lambda: granted.extend(second.acquire_all([c, a], wait=20)))
        waiter.start()
        for _ in range(400):
            if client.status(c).waiters:
                break
            threading.Event().wait(0.025)
        assert client.status(c).holder is None
        held[0].release()
        waiter.join(30)
        assert [g.lock for g in granted] == [c, a] and granted[1].token > held[0].token
        assert [(h.session, h.token) for h in client.status(b).sharers] == [(first.id, held[1].token)]

        with pytest.raises(errors.InvalidArgument, match="twice"):
            first.acquire_all([f"{unique}/d", f"{unique}/d"], wait=0)
        with pytest.raises(errors.InvalidArgument, match="already holds or waits for"):
            first.acquire_all([f"{unique}/d", b], wait=0)
        with pytest.raises(errors.InvalidArgument):
            first.acquire_all([], wait=0)
    finally:
        first.close()
        second.close()


async def test_asyncio_takes_several_locks_at_once_too(server: Server, unique: str) -> None:
    async with await aio.Client.connect([server.endpoint]) as client:
        session = await client.session(10)
        try:
            grants = await session.acquire_all([f"{unique}/x", LockPart(f"{unique}/y", permits=2)], wait=0)
            assert [g.lock for g in grants] == [f"{unique}/x", f"{unique}/y"]
            assert grants[1].slot == 0 and grants[0].token != grants[1].token
            await grants[0].release()
            assert (await client.status(f"{unique}/x")).holder is None
            assert (await client.status(f"{unique}/y")).sharers[0].session == session.id
        finally:
            await session.close()
