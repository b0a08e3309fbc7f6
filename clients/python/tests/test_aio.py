"""The asyncio client against a real `palisade serve`."""

import asyncio
import contextlib
import logging
from typing import AsyncIterator

import grpc
import pytest

import palisade
from palisade import aio, errors
from palisade._proto import palisade_pb2 as pb

from .conftest import KEEPALIVE_STREAMS_PER_CONNECTION_MAX, Server


async def test_an_async_lock_gives_a_verifiable_grant_and_queues_waiters(server: Server, unique: str) -> None:
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
            assert status.holder is not None and status.holder.session == grant.session_id and status.waiters
            listed = await client.list_locks(unique)
            assert [(s.lock, s.holder.token if s.holder else None) for s in listed] == [(unique, grant.token)]
            assert not grant.lost.is_set()
        assert await asyncio.wait_for(waiter, 10) > grant.token


async def _hold_briefly(client: aio.Client, lock: str) -> int:
    async with client.lock(lock, ttl=5, wait=10) as grant:
        return grant.token


async def test_an_async_session_is_lost_when_the_server_freezes(own_server: Server, unique: str) -> None:
    lost: list[str] = []

    async def on_lost(grant: aio.Grant, reason: str) -> None:
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


async def test_async_calls_for_a_session_need_its_secret(server: Server, unique: str) -> None:
    async with await aio.Client.connect([server.endpoint]) as client:
        credential, _ = await client.open_session_without_keepalive(5)
        with pytest.raises(palisade.Unauthenticated):
            await client.acquire(palisade.SessionCredential(credential.id, bytes(32)), unique, wait=0)
        await client.close_session(credential)
        with pytest.raises(palisade.SessionNotFound):
            await client.renew(credential)


async def test_closing_a_session_returns_even_when_an_ack_arrives_with_it(server: Server) -> None:
    # Before Python 3.12 asyncio.wait_for loses a cancel that lands in the step its inner future
    # finishes in. A keepalive told to stop just as an ack came in ran on, and close() waited for
    # it forever (one close in ten hung with acks every 10 ms).
    async with await aio.Client.connect([server.endpoint]) as client:
        for attempt in range(40):
            session = await client.session(5, keepalive_interval=0.01)
            await asyncio.sleep(0.02 + attempt * 0.00137)  # at every phase of the 10 ms
            closing = asyncio.ensure_future(session.close())
            done, _ = await asyncio.wait({closing}, timeout=10)
            if not done:
                session._task.cancel()
            assert done, f"close() of session {session.id} (attempt {attempt}) did not return"
            closing.result()


@contextlib.asynccontextmanager
async def _no_keepalive_stream_to_spare(client: aio.Client) -> AsyncIterator[None]:
    """Streams that send nothing hold the whole budget of keepalive streams of ``client``'s
    connection: a session on it is renewed by Renew calls."""
    stub = client._endpoints.current().stub
    hogs = [stub.KeepAlive() for _ in range(KEEPALIVE_STREAMS_PER_CONNECTION_MAX)]
    try:
        await asyncio.gather(*(hog.wait_for_connection() for hog in hogs))
        # The server counts a stream when its handler runs, which on a busy machine may come
        # after a later stream's: probe with a stream that is answered when it is let in (a
        # request for no session), until one is refused.
        deadline = asyncio.get_running_loop().time() + 60
        while True:
            probe = stub.KeepAlive()
            try:
                with contextlib.suppress(Exception):  # a refused stream takes no writes
                    await probe.write(pb.KeepAliveRequest())
                await asyncio.wait_for(probe.read(), 10)
            except grpc.RpcError as error:
                if error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED:
                    break
            finally:
                probe.cancel()
            # A probe let in ahead of a hog has the hog refused: such a hog is replaced.
            hogs = [stub.KeepAlive() if hog.done() else hog for hog in hogs]
            assert asyncio.get_running_loop().time() < deadline, "the keepalive streams were never exhausted"
            await asyncio.sleep(0.1)
        yield
    finally:
        for hog in hogs:
            hog.cancel()


async def test_a_session_renews_by_call_when_its_connection_has_no_keepalive_stream_to_spare(
    own_server: Server, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    client = await aio.Client.connect([own_server.endpoint])
    try:
        async with _no_keepalive_stream_to_spare(client):
            # The session outlives its ttl several times over.
            # A ttl of 3 s: a 1 s lease could go unproven on a busy machine through scheduling
            # alone. A stream tried every 50 ms: each refusal must be seen as one. A write to a
            # refused stream used to turn its RESOURCE_EXHAUSTED into INTERNAL
            # (grpc/grpc#36066), seen as a broken stream: the session paused instead of
            # renewing, and now and then lost its lease.
            caplog.set_level(logging.DEBUG, logger="palisade")
            session = await client.session(3, keepalive_interval=0.05)
            grant = await session.acquire(unique)
            await asyncio.sleep(6.5)  # over twice the ttl
            assert not grant.lost.is_set(), grant.lost_reason
            broken = [r.getMessage() for r in caplog.records if r.getMessage().startswith("keepalive stream of session")]
            assert not broken, f"{len(broken)} refused streams were taken for broken ones: {broken[:3]}"
            status = await client.status(unique)
            assert status.holder is not None and status.holder.token == grant.token
            await session.close()
    finally:
        await client.close()


async def test_a_session_renewed_by_call_is_lost_with_its_lease_when_the_server_freezes(
    own_server: Server, unique: str
) -> None:
    client = await aio.Client.connect([own_server.endpoint])
    try:
        async with _no_keepalive_stream_to_spare(client):
            # Renewals back to back, so that a freeze often lands while a Renew is in flight;
            # five freezes.
            for freeze in range(5):
                session = await client.session(1, keepalive_interval=0.01)
                grant = await session.acquire(f"{unique}/{freeze}")
                await asyncio.sleep(0.3)
                own_server.pause()
                try:
                    # Lost when the lease is, within the ttl: not when a Renew stuck on the
                    # frozen server gives up (its timeout is 10 s, and it is retried).
                    await asyncio.wait_for(grant.lost.wait(), 2)
                finally:
                    own_server.resume()
                assert grant.lost_reason == errors.LOST_LEASE_UNPROVEN
                with contextlib.suppress(errors.SessionNotFound):  # it may have expired meanwhile
                    await session.close()
    finally:
        await client.close()
