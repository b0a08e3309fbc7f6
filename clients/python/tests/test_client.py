"""The blocking client against a real `palisade serve`."""

from __future__ import annotations

import contextlib
import pathlib
import queue
import threading
import time
from typing import Iterator

import grpc
import pytest

import palisade
from palisade import _core, errors
from palisade._core import Endpoints, Failure
from palisade._proto import palisade_pb2 as pb

from .conftest import KEEPALIVE_STREAMS_PER_CONNECTION_MAX, Server, free_port


def test_a_lock_gives_a_token_and_a_verifiable_sequencer_and_is_released_on_exit(
    client: palisade.Client, unique: str
) -> None:
    keys = client.public_keys()
    with client.lock(unique, ttl=5) as grant:
        assert grant.token > 0
        verified = palisade.verify(grant.sequencer, keys)
        assert (verified.lock, verified.token, verified.session) == (unique, grant.token, grant.session_id)
        status = client.status(unique)
        assert status.holder is not None and status.holder.token == grant.token
        assert not grant.lost.is_set()
        listed = client.list_locks(unique)
        assert [(s.lock, s.holder.token if s.holder else None) for s in listed] == [(unique, grant.token)]
    assert client.status(unique).holder is None
    with client.lock(unique, ttl=5) as second:
        assert second.token > grant.token, "tokens only grow"


def test_a_busy_lock_is_not_acquired_and_names_its_holder(client: palisade.Client, unique: str) -> None:
    with client.lock(unique, ttl=5) as grant:
        with pytest.raises(palisade.Busy) as busy:
            with client.lock(unique, ttl=5, wait=0):
                pass
        assert busy.value.error_class is palisade.ErrorClass.NOT_ACQUIRED
        assert isinstance(busy.value, palisade.NotAcquired) and busy.value.retryable
        assert busy.value.kind == "busy"
        assert busy.value.holder_session == grant.session_id
        assert busy.value.holder_token == grant.token
        started = time.monotonic()
        with pytest.raises(palisade.WaitEnded):
            with client.lock(unique, ttl=5, wait=0.3):
                pass
        assert time.monotonic() - started >= 0.25


def test_a_waiter_gets_the_lock_when_the_holder_releases(client: palisade.Client, unique: str) -> None:
    got = {}
    holder = client.session(5)
    first = holder.acquire(unique)

    def wait_for_it() -> None:
        with client.lock(unique, ttl=5, wait=10) as grant:
            got["token"] = grant.token

    waiter = threading.Thread(target=wait_for_it)
    waiter.start()
    time.sleep(0.3)
    assert client.status(unique).waiters, "the second session waits in the queue"
    first.release()
    waiter.join(10)
    assert got["token"] > first.token
    holder.close()


def test_the_session_outlives_its_ttl_while_the_keepalive_runs(client: palisade.Client, unique: str) -> None:
    with client.lock(unique, ttl=1) as grant:
        time.sleep(2.5)
        status = client.status(unique)
        assert status.holder is not None and status.holder.session == grant.session_id
        assert not grant.lost.is_set()


def test_every_call_for_a_session_needs_its_secret(client: palisade.Client, unique: str) -> None:
    credential, _ = client.open_session_without_keepalive(5)
    borrowed = palisade.SessionCredential(credential.id, bytes(32))
    with pytest.raises(palisade.Unauthenticated) as refused:
        client.acquire(borrowed, unique, wait=0)
    assert refused.value.kind == "session_secret_wrong"
    assert refused.value.error_class is palisade.ErrorClass.REFUSED
    with pytest.raises(palisade.Unauthenticated):
        client.renew(borrowed)
    grant = client.acquire(credential, unique, wait=0)
    with pytest.raises(palisade.Unauthenticated):
        client.release(borrowed, unique)
    holder = client.status(unique).holder
    assert holder is not None and holder.token == grant.token, "the owner's grant stands"
    assert client.release(credential, unique) == grant.token
    text = str(credential)
    assert palisade.SessionCredential.parse(text) == credential
    with pytest.raises(palisade.InvalidArgument, match="bare session id"):
        palisade.SessionCredential.parse(str(credential.id))
    client.close_session(credential)
    with pytest.raises(palisade.SessionNotFound):
        client.renew(credential)


def test_release_by_a_session_that_does_not_hold_the_lock_is_refused(client: palisade.Client, unique: str) -> None:
    owner, _ = client.open_session_without_keepalive(5)
    other, _ = client.open_session_without_keepalive(5)
    client.acquire(owner, unique, wait=0)
    with pytest.raises(palisade.NotHolder) as refused:
        client.release(other, unique)
    assert refused.value.detail.holder_session == owner.id
    client.close_session(owner)
    client.close_session(other)


def test_bad_input_is_refused_before_it_is_sent(client: palisade.Client) -> None:
    with pytest.raises(palisade.InvalidArgument, match="empty"):
        client.status("")
    with pytest.raises(palisade.InvalidArgument, match="257 bytes, the limit is 256"):
        client.status("x" * 257)
    with pytest.raises(palisade.InvalidArgument, match="control character"):
        client.status("a\nb")
    with pytest.raises(palisade.InvalidArgument, match="outside the allowed range"):
        client.session(0.5)
    with pytest.raises(palisade.InvalidArgument, match="keepalive_interval"):
        client.session(5, keepalive_interval=0)
    with pytest.raises(palisade.InvalidArgument, match="wait"):
        client.acquire(palisade.SessionCredential(1, bytes(32)), "a", wait=-1)
    for bad, says in [
        ([], "no endpoint"),
        (["a:1", ""], "endpoint 2 of 2 is empty"),
        (["x"] * 17, "17 endpoints given, at most 16"),
        (["https://a:443"], "https:// needs TLS settings"),
        (["a:0"], "not host:port"),
        (["a b:1"], "not host:port"),
    ]:
        with pytest.raises(palisade.errors.InvalidEndpoint, match=says):
            palisade.Client(bad)


def test_no_reachable_endpoint_is_reported_with_every_address() -> None:
    dead = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    with pytest.raises(palisade.errors.Unreachable) as unreachable:
        palisade.Client(dead, connect_timeout=0.3)
    assert all(address in str(unreachable.value) for address in dead)
    assert unreachable.value.error_class is palisade.ErrorClass.UNAVAILABLE
    # With gRPC's reason for each: nothing listens there.
    assert str(unreachable.value).count("Connection refused") == 2, unreachable.value


def test_a_client_given_a_dead_member_first_moves_on_to_a_live_one(server: Server, unique: str) -> None:
    with palisade.Client([f"127.0.0.1:{free_port()}", server.endpoint], connect_timeout=0.5) as client:
        assert client.endpoint == server.endpoint
        with client.lock(unique, ttl=5) as grant:
            assert grant.token > 0


def test_a_session_is_lost_when_its_lease_cannot_be_proven(own_server: Server, unique: str) -> None:
    lost_calls = []
    with palisade.Client([own_server.endpoint]) as client:
        session = client.session(1)
        grant = session.acquire(unique, on_lost=lambda g, reason: lost_calls.append((g.token, reason)))
        own_server.pause()
        try:
            assert grant.lost.wait(3), "the grant is lost within the lease once renewals go unanswered"
            assert grant.lost_reason == errors.LOST_LEASE_UNPROVEN
            assert lost_calls == [(grant.token, errors.LOST_LEASE_UNPROVEN)]
            assert session.lease_remaining() is None
        finally:
            own_server.resume()
        with pytest.raises(palisade.SessionLost):
            grant.release()
        with pytest.raises(palisade.SessionLost):
            session.acquire(unique)
        session.close()
        # After the close the lock is free for the next holder.
        with client.lock(unique, ttl=5, wait=5) as next_grant:
            assert next_grant.token > grant.token


def test_a_call_in_flight_to_a_frozen_server_fails_within_seconds_as_unknown(own_server: Server, unique: str) -> None:
    """HTTP/2 pings every second: a member that freezes with its socket open does not hang a call
    that has no deadline of its own (an acquire waiting forever)."""
    with palisade.Client([own_server.endpoint], retry_budget=0.5) as client:
        holder, _ = client.open_session_without_keepalive(30)
        waiter, _ = client.open_session_without_keepalive(30)
        client.acquire(holder, unique, wait=0)
        own_server.pause()
        started = time.monotonic()
        try:
            with pytest.raises(palisade.OutcomeUnknown) as unknown:
                client.acquire(waiter, unique)  # waits forever: no deadline of its own
        finally:
            own_server.resume()
        assert time.monotonic() - started < 5, "noticed by the connection's pings, not a timeout"
        assert "ping" in str(unknown.value)


def test_a_session_closed_elsewhere_is_lost_as_not_found(client: palisade.Client, unique: str) -> None:
    session = client.session(3, keepalive_interval=0.1)
    grant = session.acquire(unique)
    client.close_session(session.credential)
    assert grant.lost.wait(3)
    assert grant.lost_reason == errors.LOST_NOT_FOUND
    with pytest.raises(palisade.SessionNotFound):
        session.close()


def test_endpoints_follow_leader_hints_and_rotate_on_failures() -> None:
    # The same rules as the Rust client's `Endpoints` tests.
    endpoints = Endpoints(["10.0.0.1:7457", "10.0.0.2:7457", "10.0.0.3:7457"], 0, lambda target: target)

    def hint(leader: str) -> Failure:
        return Failure(Failure.NOT_LEADER, "not the leader", leader=leader)

    endpoints.after_failure(0, hint("10.0.0.3:7457"))
    current = endpoints.current()
    assert (current.target, current.index, current.generation) == ("10.0.0.3:7457", 2, 1)
    # A leader outside the list (N14): not followed, since nothing proves it a member and every
    # call carries the token and secrets; the next configured endpoint instead.
    endpoints.after_failure(1, hint("10.0.0.9:7457"))
    assert endpoints.current().target == "10.0.0.1:7457"
    assert endpoints.current().generation == 2
    endpoints.after_failure(2, Failure(Failure.NOT_APPLIED, "connection refused"))
    assert endpoints.current().target == "10.0.0.2:7457"
    endpoints.after_failure(1, Failure(Failure.NOT_APPLIED, "late"))
    assert endpoints.current().generation == 3, "a failure on an endpoint no longer current moves nothing"
    endpoints.after_failure(3, Failure(Failure.CORE, "busy"))
    assert endpoints.current().generation == 3, "a refusal moves nothing"
    endpoints.after_failure(3, Failure(Failure.UNKNOWN, "reset"))
    assert endpoints.current().target == "10.0.0.3:7457"


def test_an_endpoint_that_just_failed_is_passed_over_for_a_while() -> None:
    # The same steps as the Rust client's `a_member_that_just_failed_is_passed_over_for_a_while`.
    now = [100.0]
    endpoints = Endpoints(
        ["10.0.0.1:7457", "10.0.0.2:7457", "10.0.0.3:7457"], 0, lambda target: target, clock=lambda: now[0]
    )
    endpoints.after_failure(0, Failure(Failure.UNKNOWN, "connect timed out"))
    assert endpoints.current().target == "10.0.0.2:7457"
    endpoints.after_failure(1, Failure(Failure.NOT_LEADER, "not the leader", leader="10.0.0.3:7457"))
    assert endpoints.current().target == "10.0.0.3:7457"
    now[0] += 2
    # The leader fails: the next in order is the first, which failed a moment ago.
    endpoints.after_failure(2, Failure(Failure.NOT_APPLIED, "election"))
    assert endpoints.current().target == "10.0.0.2:7457"
    # All three have failed within the period: the one that failed longest ago.
    endpoints.after_failure(3, Failure(Failure.NOT_APPLIED, "no leader yet"))
    assert endpoints.current().target == "10.0.0.1:7457"
    # Once the period is over, a failed endpoint is next in order again.
    now[0] += _core.FAILED_ENDPOINT_PASSED_OVER_FOR
    endpoints.after_failure(4, Failure(Failure.UNKNOWN, "connect timed out"))
    assert endpoints.current().target == "10.0.0.2:7457"


def test_request_ids_and_open_keys_are_random() -> None:
    assert len({_core.request_id() for _ in range(256)}) == 256
    keys = {_core.open_key() for _ in range(256)}
    assert len(keys) == 256 and all(len(k) == 16 for k in keys)


@contextlib.contextmanager
def _no_keepalive_stream_to_spare(client: palisade.Client) -> Iterator[None]:
    """Streams that send nothing hold the whole budget of keepalive streams of ``client``'s
    connection: a session on it is renewed by Renew calls."""
    stub = client._endpoints.current().stub
    # Only the sentinel "never" is ever put: it ends the hogs' request iterators.
    silence: "queue.Queue[str]" = queue.Queue()
    hogs = [stub.KeepAlive(iter(silence.get, "never")) for _ in range(KEEPALIVE_STREAMS_PER_CONNECTION_MAX)]
    threads = KEEPALIVE_STREAMS_PER_CONNECTION_MAX
    try:
        # 1000 streams take a thread each in grpc's blocking API: seconds on a busy machine.
        deadline = time.monotonic() + 60
        while True:  # until the connection's budget is taken: a further stream is refused
            probe = stub.KeepAlive(iter([pb.KeepAliveRequest()]))
            try:
                next(probe)
            except grpc.RpcError as error:
                if error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED:
                    break
            # The server counts a stream when its handler runs, which on a busy machine may
            # come after a later stream's: a probe let in ahead of a hog has the hog refused.
            # Such a hog is replaced (its thread still waits on `silence`).
            refused = [hog for hog in hogs if hog.done()]
            hogs = [hog for hog in hogs if not hog.done()]
            threads += len(refused)
            hogs += [stub.KeepAlive(iter(silence.get, "never")) for _ in refused]
            assert time.monotonic() < deadline, "the keepalive streams were never exhausted"
            time.sleep(0.1)
        yield
    finally:
        for hog in hogs:
            hog.cancel()
        for _ in range(threads):
            silence.put("never")


def test_a_session_renews_by_call_when_its_connection_has_no_keepalive_stream_to_spare(
    own_server: Server, unique: str
) -> None:
    with palisade.Client([own_server.endpoint]) as client, _no_keepalive_stream_to_spare(client):
        # A ttl of 3 s: with 1000 idle streams' threads, a 1 s lease could go unproven on a
        # busy machine through scheduling alone.
        with client.lock(unique, ttl=3) as grant:
            time.sleep(6.5)  # over twice the ttl
            assert not grant.lost.is_set(), grant.lost_reason
            holder = client.status(unique).holder
            assert holder is not None and holder.token == grant.token


def test_a_session_renewed_by_call_is_lost_with_its_lease_when_the_server_freezes(
    own_server: Server, unique: str
) -> None:
    with palisade.Client([own_server.endpoint]) as client, _no_keepalive_stream_to_spare(client):
        # Renewals back to back, so that a freeze often lands while a Renew is in flight; five
        # freezes.
        for freeze in range(5):
            session = client.session(1, keepalive_interval=0.01)
            grant = session.acquire(f"{unique}/{freeze}")
            time.sleep(0.3)
            own_server.pause()
            try:
                # Lost when the lease is, within the ttl: not when a Renew stuck on the frozen
                # server gives up (its timeout is 10 s, and it is retried).
                assert grant.lost.wait(2), f"freeze {freeze}: the session was not lost with its lease"
            finally:
                own_server.resume()
            assert grant.lost_reason == errors.LOST_LEASE_UNPROVEN
            with contextlib.suppress(errors.SessionNotFound):  # it may have expired meanwhile
                session.close()


def test_list_locks_follows_the_pages(client: palisade.Client, unique: str) -> None:
    # More locks than one page holds (the server's LIST_PAGE_LOCKS_MAX is 128).
    credential, _ = client.open_session_without_keepalive(30)
    names = [f"{unique}/{i:03}" for i in range(130)]
    for name in names:
        client.acquire(credential, name, wait=0)
    listed = client.list_locks(unique + "/")
    assert [s.lock for s in listed] == names
    assert all(s.holder is not None and s.holder.session == credential.id for s in listed)
    client.close_session(credential)
    assert all(s.holder is None for s in client.list_locks(unique + "/"))
