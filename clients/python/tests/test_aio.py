"""The asyncio client against a real `palisade serve`."""

import asyncio

import pytest

import palisade
from palisade import aio, errors


async def test_an_async_lock_gives_a_verifiable_grant_and_queues_waiters(server, unique):
    async with await aio.Client.connect([server.endpoint]) as client:
        keys = await client.public_keys()
        async with client.lock(unique, ttl=1) as grant:
            assert palisade.verify(grant.sequencer, keys).token == grant.token
            with pytest.raises(palisade.Busy) as busy:
                async with client.lock(unique, ttl=5, wait=0):
                    pass
            assert busy.value.holder_token == grant.token
            waiter = asyncio.ensure_future(_hold_briefly(client, unique))
            await asyncio.sleep(2.0)  # past the ttl: the keepalive task renews the lease
            status = await client.status(unique)
            assert status.holder.session == grant.session_id and status.waiters
            assert not grant.lost.is_set()
        assert await asyncio.wait_for(waiter, 10) > grant.token


async def _hold_briefly(client, lock):
    async with client.lock(lock, ttl=5, wait=10) as grant:
        return grant.token


async def test_an_async_session_is_lost_when_the_server_freezes(own_server, unique):
    lost = []

    async def on_lost(grant, reason):
        lost.append(reason)

    client = await aio.Client.connect([own_server.endpoint])
    session = await client.session(1)
    grant = await session.acquire(unique, on_lost=on_lost)
    own_server.pause()
    try:
        await asyncio.wait_for(grant.lost.wait(), 3)
    finally:
        own_server.resume()
    assert grant.lost_reason == errors.LOST_LEASE_UNPROVEN and lost == [errors.LOST_LEASE_UNPROVEN]
    await session.close()
    async with client.lock(unique, ttl=5, wait=5) as next_grant:
        assert next_grant.token > grant.token
    await client.close()


async def test_async_calls_for_a_session_need_its_secret(server, unique):
    async with await aio.Client.connect([server.endpoint]) as client:
        credential, _ = await client.open_session_without_keepalive(5)
        with pytest.raises(palisade.Unauthenticated):
            await client.acquire(palisade.SessionCredential(credential.id, bytes(32)), unique, wait=0)
        await client.close_session(credential)
        with pytest.raises(palisade.SessionNotFound):
            await client.renew(credential)
