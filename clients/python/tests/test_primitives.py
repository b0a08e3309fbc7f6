"""Read-write locks and semaphores from Python (docs/locks.md), sync and asyncio, against a real
server: readers share their phase's token and cannot write, a writer waits for them, permits
get slots of their own, and the fence applies each rule to the grant's sequencer."""

import pytest

import palisade
from palisade import aio, errors
from palisade.sequencer import SHARED, Access

from .conftest import Server


def test_readers_share_a_phase_token_and_a_writer_waits_for_them(client: palisade.Client, unique: str) -> None:
    keys = client.public_keys()
    first, second = client.session(10), client.session(10)
    try:
        reader = first.acquire(unique, shared=True)
        other = second.acquire(unique, shared=True)
        assert reader.access == SHARED and reader.slot is None
        assert other.token == reader.token, "readers of one phase share its token"
        verified = palisade.verify(reader.sequencer, keys)
        assert verified.access == SHARED and verified.binding == unique
        status = client.status(unique)
        assert status.holder is None and [h.session for h in status.sharers] == sorted(
            [reader.session_id, other.session_id]
        )
        with pytest.raises(palisade.Busy):
            with client.lock(unique, ttl=5, wait=0):
                pass
        # No upgrade: the reader's session cannot take the lock exclusive as well.
        with pytest.raises(errors.InvalidArgument, match="release it before"):
            first.acquire(unique, wait=0)
        reader.release()
        other.release()
    finally:
        first.close()
        second.close()
    with client.lock(unique, ttl=5, wait=0) as writer:
        assert writer.access == Access() and writer.token > reader.token


def test_permits_get_slots_of_their_own_and_a_size_is_fixed_while_in_use(client: palisade.Client, unique: str) -> None:
    a, b, c = client.session(10), client.session(10), client.session(10)
    try:
        first = a.acquire(unique, permits=2)
        second = b.acquire(unique, permits=2)
        assert {first.slot, second.slot} == {0, 1} and first.token != second.token
        assert palisade.verify(first.sequencer, client.public_keys()).binding == f"{unique}\x1f{first.slot}"
        with pytest.raises(palisade.Busy):
            c.acquire(unique, permits=2, wait=0)
        with pytest.raises(errors.InvalidArgument, match="semaphore of 2 permits, not 3"):
            c.acquire(unique, permits=3, wait=0)
        status = client.status(unique)
        assert status.permits == 2 and sorted(s.access.slot or 0 for s in status.sharers) == [0, 1]
        first.release()
        third = c.acquire(unique, permits=2, wait=0)
        assert third.slot == first.slot and third.token > max(first.token, second.token)
    finally:
        for session in (a, b, c):
            session.close()


@pytest.mark.parametrize("shared, permits", [(True, 2), (False, 0), (False, 4097)])
def test_a_bad_mode_is_refused_before_anything_is_sent(
    client: palisade.Client, unique: str, shared: bool, permits: int
) -> None:
    with pytest.raises(errors.InvalidArgument):
        with client.lock(unique, ttl=5, shared=shared, permits=permits):
            pass


async def test_asyncio_takes_readers_and_permits_too(server: Server, unique: str) -> None:
    async with await aio.Client.connect([server.endpoint]) as client:
        async with client.lock(unique, ttl=5, shared=True) as reader:
            async with client.lock(unique, ttl=5, shared=True) as other:
                assert reader.access == SHARED and other.token == reader.token
        async with client.lock(unique + "/s", ttl=5, permits=3) as permit:
            assert permit.slot == 0
            status = await client.status(unique + "/s")
            assert status.permits == 3 and status.sharers[0].access == Access("slot", 0)
