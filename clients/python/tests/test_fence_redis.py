"""The Redis fence against a real Redis: the Rust adapter's script and key layout."""

from __future__ import annotations

import pathlib
import uuid
from typing import TYPE_CHECKING, Iterator

import pytest

import palisade
from palisade import fence
from palisade.fence import redis as redis_fence
from palisade.fence.redis import CompareFailed, Condition, Op, RedisFence

from .signing import ServiceKey

if TYPE_CHECKING:
    from redis import Redis

redis_py = pytest.importorskip("redis")


@pytest.fixture
def conn(redis_url: str) -> Iterator[Redis]:
    connection = redis_py.Redis.from_url(redis_url)
    yield connection
    connection.close()


def test_the_script_is_the_rust_adapters_byte_for_byte() -> None:
    rust = (pathlib.Path(__file__).resolve().parents[3] / "crates/fence/src/redis.lua").read_text()
    assert redis_fence.SCRIPT == rust


def test_writes_reads_and_compares_are_fenced(client: palisade.Client, conn: Redis, unique: str) -> None:
    verifier = fence.Verifier(client.public_keys())
    with client.lock(unique, ttl=5) as old:
        pass
    with client.lock(unique, ttl=5) as new:
        pass
    old_seq, new_seq = verifier.verify(old.sequencer), verifier.verify(new.sequencer)
    scope, key = f"py-{uuid.uuid4().hex}", f"py-counter-{uuid.uuid4().hex}"
    store = RedisFence()
    try:
        assert store.write(conn, scope, old_seq, [Op.incr_by(key, 5), Op.get(key)]) == [5, b"5"]
        # The newer holder reads through the fence: from now on the old one is shut out.
        assert store.read(conn, scope, new_seq, [key]) == [b"5"]
        with pytest.raises(fence.Stale) as stale:
            store.write(conn, scope, old_seq, [Op.set(key, "lost update")])
        assert (stale.value.presented, stale.value.accepted, stale.value.holder_session) == (
            old.token,
            new.token,
            new.session_id,
        )
        assert conn.get(key) == b"5"
        # The layout the Rust adapter reads: one hash per scope with lock, token, session.
        assert conn.hgetall(f"palisade:fence:{scope}") == {
            b"lock": unique.encode(),
            b"token": str(new.token).encode(),
            b"session": str(new.session_id).encode(),
        }
        assert store.fence_state(conn, scope) == fence.FenceState(unique, new.token, new.session_id)
        failed = store.write_if(conn, scope, new_seq, [Condition.equals(key, "4")], [Op.set(key, "6")])
        assert failed == CompareFailed(0, b"5")
        assert store.write_if(conn, scope, new_seq, [Condition.equals(key, "5")], [Op.set(key, "6")]) == [True]
        assert conn.get(key) == b"6"
        with pytest.raises(fence.InvalidRequest, match="fence key prefix"):
            store.write(conn, scope, new_seq, [Op.delete(f"palisade:fence:{scope}")])
        conn.rpush(f"{key}-list", "x")
        with pytest.raises(fence.InvalidRequest, match="holds a list"):
            store.write(conn, scope, new_seq, [Op.set(key, "7"), Op.incr_by(f"{key}-list", 1)])
        assert conn.get(key) == b"6", "a request that cannot apply in full applies nothing"
        with pytest.raises(fence.InvalidRequest, match="limit is 64"):
            store.write(conn, scope, new_seq, [Op.get(key)] * 65)
    finally:
        conn.delete(key, f"{key}-list", f"palisade:fence:{scope}")


def test_a_token_issued_twice_is_refused_from_the_second_session_and_the_first_writes_on(conn: Redis) -> None:
    service = ServiceKey()
    scope, key = f"py-{uuid.uuid4().hex}", f"py-value-{uuid.uuid4().hex}"
    store = RedisFence()
    # Sessions are compared as decimal text in the script: the largest ones too.
    first, second = (1 << 64) - 2, 7
    try:
        store.write(conn, scope, service.grant("jobs", 5, first), [Op.set(key, "by the first")])
        before = store.fence_state(conn, scope)
        # A lock service restored from a backup grants token 5 again, to another session: its
        # write and its fenced read are refused alike.
        for presented in (second, (1 << 64) - 1):
            grant = service.grant("jobs", 5, presented)
            for attempt in (
                lambda: store.write(conn, scope, grant, [Op.set(key, "by the second")]),
                lambda: store.read(conn, scope, grant, [key]),
            ):
                with pytest.raises(fence.TokenReissued) as reissued:
                    attempt()
                refusal = reissued.value
                assert (refusal.lock, refusal.token, refusal.first_session, refusal.presented_session) == (
                    "jobs",
                    5,
                    first,
                    presented,
                )
        assert store.fence_state(conn, scope) == before
        assert conn.get(key) == b"by the first"
        # The first session reads and writes on with token 5; a newer token advances as before.
        assert store.read(conn, scope, service.grant("jobs", 5, first), [key]) == [b"by the first"]
        store.write(conn, scope, service.grant("jobs", 5, first), [Op.set(key, "again")])
        store.write(conn, scope, service.grant("jobs", 6, second), [Op.set(key, "by the next")])
        assert store.fence_state(conn, scope) == fence.FenceState("jobs", 6, second)
    finally:
        conn.delete(key, f"palisade:fence:{scope}")


def test_readers_read_never_write_and_a_permit_binds_the_scope_to_its_slot(conn: Redis) -> None:
    service = ServiceKey()
    scope, slot_scope, key = f"py-{uuid.uuid4().hex}", f"py-{uuid.uuid4().hex}", f"py-value-{uuid.uuid4().hex}"
    store = RedisFence()
    try:
        store.write(conn, scope, service.grant("rw", 4, 9), [Op.set(key, "v4")])
        for session in (1, 2):
            assert store.read(conn, scope, service.grant("rw", 5, session, "s"), [key]) == [b"v4"]
        assert store.fence_state(conn, scope) == fence.FenceState("rw", 5, 0)
        reader = service.grant("rw", 5, 1, "s")
        with pytest.raises(fence.SharedWrite):
            store.write(conn, scope, reader, [Op.set(key, "a reader's write")])
        with pytest.raises(fence.SharedWrite):
            store.write_if(conn, scope, reader, [Condition.equals(key, "v4")], [Op.get(key)])
        # The script refuses a reader's write by itself too (a client without the check): only
        # GET ops from a session 's'.
        script = conn.register_script(redis_fence.SCRIPT)
        reply = script(keys=[store.fence_key(scope), key], args=["rw", "5", "s", store.key_prefix, "0", "set", "x"])
        assert reply == [b"shared_write"]
        with pytest.raises(fence.TokenReissued):
            store.write(conn, scope, service.grant("rw", 5, 1), [Op.set(key, "x")])
        store.write(conn, scope, service.grant("rw", 6, 3), [Op.set(key, "v6")])
        with pytest.raises(fence.Stale):
            store.read(conn, scope, service.grant("rw", 5, 2, "s"), [key])
        assert conn.get(key) == b"v6"
        store.write(conn, slot_scope, service.grant("shards", 2, 1, "p3"), [Op.get(key)])
        assert store.fence_state(conn, slot_scope) == fence.FenceState("shards\x1f3", 2, 1)
        with pytest.raises(fence.WrongLock, match=r"'shards \(slot 3\)'"):
            store.write(conn, slot_scope, service.grant("shards", 9, 1, "p4"), [Op.get(key)])
    finally:
        conn.delete(key, f"palisade:fence:{scope}", f"palisade:fence:{slot_scope}")
