"""The S3 fence against a real S3-compatible server (PALISADE_TEST_S3, versitygw in CI): the Rust
adapter's object layout, claims, tombstones and racing writers."""

from __future__ import annotations

import concurrent.futures
import uuid

import pytest

import palisade
from palisade import fence
from palisade.fence.s3 import S3_OBJECT_BYTES_MAX_DEFAULT, S3Config, S3Fence, envelope

from .signing import ServiceKey


@pytest.fixture
def store(s3_endpoint: str) -> S3Fence:
    endpoint, bucket, access_key, secret_key = s3_endpoint.split()
    return S3Fence(S3Config(endpoint, bucket, access_key, secret_key))


def key() -> str:
    return f"py/{uuid.uuid4().hex}"


def test_the_envelope_is_the_rust_adapters_byte_for_byte() -> None:
    # The same bytes crates/fence/src/s3.rs's test expects: one JSON line, then the data.
    state = fence.FenceState("jobs/é", 7, 3)
    assert envelope(state, b"a\nb") == '{"palisade_fence":1,"lock":"jobs/é","token":7,"session":3,"data":true}\na\nb'.encode()
    assert envelope(state, None) == '{"palisade_fence":1,"lock":"jobs/é","token":7,"session":3,"data":false}\n'.encode()


def test_a_claim_shuts_the_superseded_holder_out(client: palisade.Client, store: S3Fence, unique: str) -> None:
    verifier = fence.Verifier(client.public_keys())
    with client.lock(unique, ttl=5) as old:
        pass
    with client.lock(unique, ttl=5) as new:
        pass
    old_seq, new_seq = verifier.verify(old.sequencer), verifier.verify(new.sequencer)
    name = key()
    store.put(name, old_seq, b"5")
    read = store.read(name, new_seq)
    assert (read.data, read.state) == (b"5", fence.FenceState(unique, new.token, new.session_id))
    with pytest.raises(fence.Stale) as stale:
        store.put(name, old_seq, b"lost update")
    assert (stale.value.presented, stale.value.accepted, stale.value.holder_session) == (
        old.token,
        new.token,
        new.session_id,
    )
    with pytest.raises(fence.Stale):
        store.read(name, old_seq)
    store.put(name, new_seq, b"6")
    current = store.get(name)
    assert current is not None and current.data == b"6"
    assert store.fence_state(name) == fence.FenceState(unique, new.token, new.session_id)


def test_tombstones_reissued_tokens_and_bounds(store: S3Fence) -> None:
    service = ServiceKey()
    name = key()
    claimed = store.read(name, service.grant("jobs", 5, 1))
    assert claimed.data is None
    with pytest.raises(fence.Stale):
        store.put(name, service.grant("jobs", 4, 9), b"late")
    with pytest.raises(fence.TokenReissued) as reissued:
        store.put(name, service.grant("jobs", 5, 2), b"second session")
    assert (reissued.value.first_session, reissued.value.presented_session) == (1, 2)
    store.put(name, service.grant("jobs", 6, 2), b"x")
    store.delete(name, service.grant("jobs", 6, 2))
    with pytest.raises(fence.Stale):
        store.put(name, service.grant("jobs", 5, 1), b"zombie")
    tombstone = store.get(name)
    assert tombstone is not None and tombstone.data is None and tombstone.state.token_max == 6
    with pytest.raises(fence.WrongLock):
        store.put(name, service.grant("other", 9, 1), b"y")
    with pytest.raises(fence.InvalidRequest, match="limit of a fenced object"):
        store.put(key(), service.grant("jobs", 1, 1), bytes(S3_OBJECT_BYTES_MAX_DEFAULT + 1))
    for bad in ("", "k" * 1025, "a\nb"):
        with pytest.raises(fence.InvalidScope):
            store.put(bad, service.grant("jobs", 1, 1), b"z")


def test_racing_writers_leave_the_newest_accepted_write(store: S3Fence) -> None:
    service = ServiceKey()
    name, counter = key(), key()
    tokens = [7, 3, 11, 1, 9, 5, 12, 2, 8, 4, 10, 6]

    def increment(token: int) -> int:
        try:
            state, _ = store.update(counter, service.grant("race", token, token), lambda data: str(int(data or b"0") + 1).encode())
            return state.token_max
        except (fence.Stale, fence.Storage):
            return 0

    def write(token: int) -> int:
        try:
            return store.put(name, service.grant("race", token, token), str(token).encode()).token_max
        except fence.Stale:
            return 0
        except fence.Storage:
            return 0

    with concurrent.futures.ThreadPoolExecutor(max_workers=6) as pool:
        accepted = [token for token in pool.map(write, tokens) if token]
    stored = store.get(name)
    assert stored is not None
    assert stored.state.token_max == max(accepted)
    assert stored.data == str(max(accepted)).encode()
    # Read-modify-writes in one conditional PUT each: every acknowledged increment counts.
    with concurrent.futures.ThreadPoolExecutor(max_workers=6) as pool:
        incremented = [token for token in pool.map(increment, tokens) if token]
    stored = store.get(counter)
    assert stored is not None and stored.data == str(len(incremented)).encode()


def test_an_unreachable_server_is_a_retryable_storage_error(s3_endpoint: str) -> None:
    _, bucket, access_key, secret_key = s3_endpoint.split()
    unreachable = S3Fence(S3Config("http://127.0.0.1:9", bucket, access_key, secret_key), timeout=5)
    with pytest.raises(fence.Storage) as error:
        unreachable.put(key(), ServiceKey().grant("jobs", 1, 1), b"z")
    assert error.value.is_retryable


def test_readers_read_never_write_and_a_permit_binds_the_object_to_its_slot(store: S3Fence) -> None:
    service = ServiceKey()
    name = key()
    store.put(name, service.grant("rw", 4, 9), b"v4")
    for session in (1, 2):
        read = store.read(name, service.grant("rw", 5, session, "s"))
        assert (read.data, read.state) == (b"v4", fence.FenceState("rw", 5, 0))
    with pytest.raises(fence.SharedWrite):
        store.put(name, service.grant("rw", 5, 1, "s"), b"a reader's write")
    with pytest.raises(fence.SharedWrite):
        store.delete(name, service.grant("rw", 6, 1, "s"))
    store.put(name, service.grant("rw", 6, 3), b"v6")
    with pytest.raises(fence.Stale):
        store.read(name, service.grant("rw", 5, 2, "s"))
    current = store.get(name)
    assert current is not None and (current.data, current.state) == (b"v6", fence.FenceState("rw", 6, 3))
    slot = key()
    assert store.put(slot, service.grant("shards", 2, 1, "p3"), b"s3") == fence.FenceState("shards\x1f3", 2, 1)
    with pytest.raises(fence.WrongLock):
        store.put(slot, service.grant("shards", 9, 1, "p4"), b"another slot")
    assert store.fence_state(slot) == fence.FenceState("shards\x1f3", 2, 1)
