"""The fenced publish to NATS JetStream against a real server (``$PALISADE_TEST_NATS``), and the
consumer-side filter with its high-water mark in PostgreSQL (``$PALISADE_TEST_POSTGRES``)."""

from __future__ import annotations

import uuid
from typing import Any, AsyncIterator, Optional

import pytest

from palisade import fence
from palisade.fence import stream
from palisade.fence.jetstream import SEQUENCER_HEADER, JetStreamFence

from .signing import ServiceKey

nats = pytest.importorskip("nats")

LOCK = "invoices"


@pytest.fixture
async def js_stream(nats_url: str) -> AsyncIterator[tuple[Any, str]]:
    """A JetStream context and a fresh stream of one test (subjects ``<name>.>``), deleted after."""
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    name = f"pytest_{uuid.uuid4().hex[:12]}"
    await js.add_stream(name=name, subjects=[f"{name}.>"])
    try:
        yield js, name
    finally:
        await js.delete_stream(name)
        await nc.close()


async def stored(js: Any, name: str, key: ServiceKey) -> list[tuple[str, Optional[int]]]:
    """Every message of the stream in order: payload and the verified token of its header."""
    info = await js.stream_info(name)
    messages = []
    for seq in range(1, info.state.last_seq + 1):
        message = await js.get_msg(name, seq)
        text = (message.headers or {}).get(SEQUENCER_HEADER)
        token: Optional[int] = None
        if text is not None:
            try:
                token = fence.verify_presented(text, key.public).token
            except fence.FenceError:
                token = None
        messages.append(((message.data or b"").decode(), token))
    return messages


async def test_a_newer_holders_message_shuts_the_older_holder_out(js_stream: tuple[Any, str]) -> None:
    js, name = js_stream
    key = ServiceKey()
    fenced = JetStreamFence(js, name, fence.Verifier(key.public))
    subject = f"{name}.events"
    a, b = key.grant(LOCK, 5, 1), key.grant(LOCK, 6, 2)
    await fenced.publish(subject, a, b"a1")
    await fenced.publish(subject, b, b"b1")
    with pytest.raises(fence.Stale) as refused:
        await fenced.publish(subject, a, b"a2")
    assert (refused.value.presented, refused.value.accepted, refused.value.holder_session) == (5, 6, 2)
    with pytest.raises(fence.TokenReissued):
        await fenced.publish(subject, key.grant(LOCK, 6, 9), b"x")
    assert await stored(js, name, key) == [("a1", 5), ("b1", 6)]


async def test_the_broker_refuses_a_publish_when_the_subject_moved_since_the_read(js_stream: tuple[Any, str]) -> None:
    js, name = js_stream
    key = ServiceKey()
    fenced = JetStreamFence(js, name, fence.Verifier(key.public))
    subject = f"{name}.events"
    a, b = key.grant(LOCK, 5, 1), key.grant(LOCK, 6, 2)
    read_by_a = await fenced.last(subject)
    assert read_by_a is None
    await fenced.publish_after(subject, b, None, b"b1")
    with pytest.raises(fence.Stale):
        await fenced.publish_after(subject, a, read_by_a, b"a1")
    read_by_b = await fenced.last(subject)
    assert read_by_b is not None and read_by_b.payload == b"b1"
    await fenced.publish_after(subject, b, read_by_b, b"b2")
    with pytest.raises(fence.Storage, match="changed since it was read"):
        await fenced.publish_after(subject, b, read_by_b, b"b2 again")
    assert await stored(js, name, key) == [("b1", 6), ("b2", 6)]


async def test_a_forged_sequencer_on_the_last_message_is_corrupt(js_stream: tuple[Any, str]) -> None:
    js, name = js_stream
    key, attacker = ServiceKey(), ServiceKey()
    subject = f"{name}.events"
    await js.publish(subject, b"planted", headers={SEQUENCER_HEADER: attacker.grant(LOCK, 10**6, 666).text})
    fenced = JetStreamFence(js, name, fence.Verifier(key.public))
    with pytest.raises(fence.Corrupt, match="does not verify"):
        await fenced.publish(subject, key.grant(LOCK, 5, 1), b"a1")
    assert len(await stored(js, name, key)) == 1


def test_the_consumer_filter_keeps_its_mark_in_the_same_commit_as_its_output(schema_dsn: str) -> None:
    psycopg = pytest.importorskip("psycopg")
    from palisade.fence import postgres

    key = ServiceKey()
    verifier = fence.Verifier(key.public)
    a, b = key.grant(LOCK, 5, 1), key.grant(LOCK, 6, 2)
    # The stream as the consumer reads it: B's first message, then A's late one.
    delivered = [("a1", a.text), ("b1", b.text), ("a2", a.text), (
        "forged", ServiceKey().grant(LOCK, 99, 9).text), ("none", None), ("b2", b.text)]

    def consume(conn: Any, payload: str, header: Optional[str]) -> stream.Admission:
        with conn.transaction():
            admission = stream.admit_postgres(conn, "consumer/invoices", header, verifier)
            if admission.process:
                conn.execute("INSERT INTO output (payload) VALUES (%s)", (payload,))
        return admission

    with psycopg.connect(schema_dsn, autocommit=True) as conn:
        postgres.ensure_schema(conn)
        conn.execute("CREATE TABLE output (id bigserial PRIMARY KEY, payload text NOT NULL)")
        kinds = []
        for payload, header in delivered:
            admission = consume(conn, payload, header)
            kinds.append("process" if admission.process else admission.refusal.kind if admission.refusal else "?")
        assert kinds == ["process", "process", "stale", "forged", "missing", "process"]
        # A rolled-back output rolls back the mark: a newer grant's message whose processing
        # failed leaves B's messages acceptable.
        with pytest.raises(RuntimeError):
            with conn.transaction():
                assert stream.admit_postgres(conn, "consumer/invoices", key.grant(LOCK, 7, 3).text, verifier).process
                raise RuntimeError("the consumer crashed before its commit")
    # A restarted consumer (a new connection) still refuses A and still accepts B.
    with psycopg.connect(schema_dsn, autocommit=True) as conn:
        assert consume(conn, "a3", a.text).refusal is not None
        assert consume(conn, "b3", b.text).process
        rows = conn.execute("SELECT payload FROM output ORDER BY id").fetchall()
        assert [row[0] for row in rows] == ["a1", "b1", "b2", "b3"]


async def test_a_readers_publish_is_refused_and_a_permits_subject_is_bound_to_its_slot(js_stream: tuple[Any, str]) -> None:
    js, name = js_stream
    key = ServiceKey()
    fenced = JetStreamFence(js, name, fence.Verifier(key.public))
    subject = f"{name}.events"
    with pytest.raises(fence.SharedWrite):
        await fenced.publish(subject, key.grant(LOCK, 5, 1, "s"), b"a reader's message")
    await fenced.publish(subject, key.grant(LOCK, 6, 2, "p1"), b"slot 1")
    last = await fenced.last(subject)
    assert last is not None and last.accepted == fence.FenceState(f"{LOCK}\x1f1", 6, 2)
    with pytest.raises(fence.WrongLock):
        await fenced.publish(subject, key.grant(LOCK, 7, 3, "p0"), b"slot 0")
    with pytest.raises(fence.Stale):
        await fenced.publish(subject, key.grant(LOCK, 5, 3, "p1"), b"slot 1, superseded")
    assert await stored(js, name, key) == [("slot 1", 6)]
