"""Handoffs from Python (``Grant.release_then_acquire``), sync and asyncio, against a real
server: one call gives a lock up and takes the next one, or the same one again behind its
waiters with a newer token; an acquire that fails leaves the release done, and a refused release
changes nothing."""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

import pytest

import palisade
from palisade import aio, errors

from .conftest import Server


def until(check: Callable[[], bool], what: str, *pending: Future[Any]) -> None:
    """Waits (10 s at most) until ``check()``; a call of ``pending`` that fails meanwhile fails
    the test with its own error."""
    deadline = time.monotonic() + 10
    while not check():
        for call in pending:
            if call.done():
                call.result()
        assert time.monotonic() < deadline, f"not seen within 10 s: {what}"
        time.sleep(0.02)


def test_a_handoff_to_the_same_lock_takes_it_again_with_a_newer_token(client: palisade.Client, unique: str) -> None:
    with client.session(10) as session:
        old = session.acquire(unique, wait=0)
        new = old.release_then_acquire(unique, wait=0)
        assert new.token > old.token
        assert (new.lock, new.session_id) == (unique, session.id)
        verified = palisade.verify(new.sequencer, client.public_keys())
        assert (verified.lock, verified.token, verified.session) == (unique, new.token, session.id)
        holder = client.status(unique).holder
        assert holder is not None and (holder.session, holder.token) == (session.id, new.token)

        # The old grant is finished: releasing it sends nothing, and a second handoff is refused
        # before anything is sent; the new grant stays held through both.
        assert old.released
        old.release()
        with pytest.raises(errors.NotHolder, match="released already"):
            old.release_then_acquire(unique, wait=0)
        holder = client.status(unique).holder
        assert holder is not None and (holder.session, holder.token) == (session.id, new.token)

        new.release()
        assert client.status(unique).holder is None


def test_a_handoff_to_the_same_lock_waits_behind_the_lock_s_waiters(client: palisade.Client, unique: str) -> None:
    ours, theirs = client.session(10), client.session(10)
    pool = ThreadPoolExecutor(2)
    try:
        old = ours.acquire(unique, wait=0)
        waiter = pool.submit(theirs.acquire, unique, wait=20)
        until(lambda: client.status(unique).waiters == (theirs.id,), "the other session waiting", waiter)

        handoff = pool.submit(old.release_then_acquire, unique, wait=20)
        # The waiter is granted first; our session queues behind it.
        until(waiter.done, "the other session granted", handoff)
        theirs_grant = waiter.result()
        assert theirs_grant.token > old.token
        until(lambda: client.status(unique).waiters == (ours.id,), "our session waiting", handoff)
        status = client.status(unique)
        assert status.holder is not None
        assert (status.holder.session, status.holder.token) == (theirs.id, theirs_grant.token)
        assert not handoff.done()

        theirs_grant.release()
        new = handoff.result(timeout=10)
        assert new.token > theirs_grant.token
        status = client.status(unique)
        assert status.holder is not None and (status.holder.session, status.holder.token) == (ours.id, new.token)
        assert status.waiters == ()
    finally:
        ours.close()  # ends the waits of a failed test at once
        theirs.close()
        pool.shutdown()


def test_a_handoff_to_another_lock_frees_the_first_and_holds_the_second(client: palisade.Client, unique: str) -> None:
    first_lock, second_lock, third_lock = f"{unique}/a", f"{unique}/b", f"{unique}/c"
    with client.session(10) as session:
        first = session.acquire(first_lock, wait=0)
        # Invalid arguments are refused before anything is sent: the grant goes on.
        with pytest.raises(errors.InvalidArgument):
            first.release_then_acquire(second_lock, wait=0, value="")
        holder = client.status(first_lock).holder
        assert not first.released and holder is not None and holder.token == first.token

        second = first.release_then_acquire(second_lock, wait=0, value="next")
        assert client.status(first_lock).holder is None
        holder = client.status(second_lock).holder
        assert holder is not None
        assert (holder.session, holder.token, holder.value) == (session.id, second.token, "next")
        assert palisade.verify(second.sequencer, client.public_keys()).lock == second_lock

        # The acquire's options come along: here one permit of a semaphore.
        third = second.release_then_acquire(third_lock, wait=0, permits=2)
        assert client.status(second_lock).holder is None
        status = client.status(third_lock)
        assert third.slot == 0 and status.permits == 2
        assert [(h.session, h.token) for h in status.sharers] == [(session.id, third.token)]


def test_a_try_handoff_to_a_busy_lock_is_busy_and_still_releases(client: palisade.Client, unique: str) -> None:
    held_lock, busy_lock = f"{unique}/held", f"{unique}/busy"
    ours, theirs = client.session(10), client.session(10)
    try:
        theirs_grant = theirs.acquire(busy_lock, wait=0)
        held = ours.acquire(held_lock, wait=0)
        with pytest.raises(palisade.Busy) as busy:
            held.release_then_acquire(busy_lock, wait=0)
        assert busy.value.holder_session == theirs.id and busy.value.holder_token == theirs_grant.token
        assert held.released
        assert client.status(held_lock).holder is None
        status = client.status(busy_lock)
        assert status.holder is not None and status.holder.session == theirs.id and status.waiters == ()
    finally:
        ours.close()
        theirs.close()


def test_a_refused_release_changes_nothing(client: palisade.Client, unique: str) -> None:
    held_lock, next_lock = f"{unique}/held", f"{unique}/next"
    with client.session(10) as session:
        grant = session.acquire(held_lock, wait=0)
        client.release(session.credential, held_lock)  # behind the grant's back
        with pytest.raises(errors.NotHolder):
            grant.release_then_acquire(next_lock, wait=0)
        assert client.status(next_lock).holder is None

    credential, _ = client.open_session_without_keepalive(5)
    client.acquire(credential, held_lock, wait=0)
    client.close_session(credential)
    with pytest.raises(errors.SessionNotFound):
        client.release_then_acquire(credential, held_lock, next_lock, wait=0)
    assert client.status(next_lock).holder is None


async def test_an_async_handoff_to_the_same_lock_takes_it_again_with_a_newer_token(server: Server, unique: str) -> None:
    async with await aio.Client.connect([server.endpoint]) as client:
        session = await client.session(10)
        try:
            old = await session.acquire(unique, wait=0)
            new = await old.release_then_acquire(unique, wait=0)
            assert new.token > old.token
            assert (new.lock, new.session_id) == (unique, session.id)
            verified = palisade.verify(new.sequencer, await client.public_keys())
            assert (verified.lock, verified.token, verified.session) == (unique, new.token, session.id)
            holder = (await client.status(unique)).holder
            assert holder is not None and (holder.session, holder.token) == (session.id, new.token)

            assert old.released
            await old.release()
            with pytest.raises(errors.NotHolder, match="released already"):
                await old.release_then_acquire(unique, wait=0)
            holder = (await client.status(unique)).holder
            assert holder is not None and (holder.session, holder.token) == (session.id, new.token)

            await new.release()
            assert (await client.status(unique)).holder is None
        finally:
            await session.close()
