"""The SQLite fence on real database files."""

import pathlib
import re
import sqlite3
from typing import Iterator

import pytest

import palisade
from palisade import fence
from palisade.fence import sqlite

from .signing import ServiceKey


@pytest.fixture
def conn(tmp_path: pathlib.Path) -> Iterator[sqlite3.Connection]:
    connection = sqlite3.connect(tmp_path / "app.db", isolation_level=None)
    sqlite.ensure_schema(connection)
    connection.execute("CREATE TABLE counter (n INTEGER NOT NULL)")
    connection.execute("INSERT INTO counter VALUES (0)")
    yield connection
    connection.close()


def test_the_fence_table_is_the_rust_adapters() -> None:
    rust = (pathlib.Path(__file__).resolve().parents[3] / "crates/fence/src/sqlite.rs").read_text()
    assert sqlite.CREATE_TABLE_SQL in rust
    assert sqlite.ADVANCE_SQL in rust


def test_a_superseded_holder_cannot_write_back_what_it_read(
    client: palisade.Client, conn: sqlite3.Connection, unique: str, tmp_path: pathlib.Path
) -> None:
    verifier = fence.Verifier(client.public_keys())
    with client.lock(unique, ttl=5) as old:
        pass
    with client.lock(unique, ttl=5) as new:
        pass
    old_seq, new_seq = verifier.verify(old.sequencer), verifier.verify(new.sequencer)
    with sqlite.transaction(conn, "counter", old_seq):
        conn.execute("UPDATE counter SET n = n + 1")
    with sqlite.transaction(conn, "counter", new_seq):
        conn.execute("UPDATE counter SET n = n + 1")
    with pytest.raises(fence.Stale) as stale:
        with sqlite.transaction(conn, "counter", old_seq):
            conn.execute("UPDATE counter SET n = n + 100")
    assert (stale.value.presented, stale.value.accepted, stale.value.holder_session) == (
        old.token,
        new.token,
        new.session_id,
    )
    assert conn.execute("SELECT n FROM counter").fetchone()[0] == 2
    # The accepted token survives closing and reopening the file.
    conn.close()
    reopened = sqlite3.connect(tmp_path / "app.db", isolation_level=None)
    assert sqlite.fence_state(reopened, "counter") == fence.FenceState(unique, new.token, new.session_id)
    with pytest.raises(fence.Stale):
        with sqlite.transaction(reopened, "counter", old_seq):
            pass
    reopened.close()


def test_a_connection_that_manages_transactions_itself_is_refused(
    tmp_path: pathlib.Path, client: palisade.Client, unique: str
) -> None:
    verifier = fence.Verifier(client.public_keys())
    with client.lock(unique, ttl=5) as grant:
        sequencer = verifier.verify(grant.sequencer)
    legacy = sqlite3.connect(tmp_path / "legacy.db")
    sqlite.ensure_schema(legacy)
    with pytest.raises(fence.InvalidRequest, match="isolation_level=None"):
        with sqlite.transaction(legacy, "s", sequencer):
            pass
    legacy.close()


def test_a_token_issued_twice_is_refused_from_the_second_session_and_the_first_writes_on(
    conn: sqlite3.Connection, tmp_path: pathlib.Path
) -> None:
    service = ServiceKey()
    # Sessions above i64::MAX are stored bit for bit as negative integers: compare them too.
    first, second = (1 << 64) - 2, 7
    with sqlite.transaction(conn, "counter", service.grant("jobs", 5, first)):
        conn.execute("UPDATE counter SET n = n + 1")
    before = sqlite.fence_state(conn, "counter")
    # A lock service restored from a backup grants token 5 again, to another session.
    for presented in (second, (1 << 64) - 1):
        with pytest.raises(fence.TokenReissued) as reissued:
            with sqlite.transaction(conn, "counter", service.grant("jobs", 5, presented)):
                conn.execute("UPDATE counter SET n = n + 100")
        refusal = reissued.value
        assert (refusal.lock, refusal.token, refusal.first_session, refusal.presented_session) == (
            "jobs",
            5,
            first,
            presented,
        )
        assert refusal.kind == "token_reissued" and refusal.is_rejection and refusal.is_final
        assert "issued this token twice" in str(refusal)
    assert sqlite.fence_state(conn, "counter") == before
    assert conn.execute("SELECT n FROM counter").fetchone()[0] == 1
    # The pure check agrees with the database.
    with pytest.raises(fence.TokenReissued):
        fence.check(before, None, service.grant("jobs", 5, second), "write")
    # The first session writes on with token 5; a newer token advances as before.
    with sqlite.transaction(conn, "counter", service.grant("jobs", 5, first)):
        conn.execute("UPDATE counter SET n = n + 1")
    assert sqlite.fence_state(conn, "counter") == before
    with sqlite.transaction(conn, "counter", service.grant("jobs", 6, second)):
        conn.execute("UPDATE counter SET n = n + 1")
    assert conn.execute("SELECT n FROM counter").fetchone()[0] == 3
    assert sqlite.fence_state(conn, "counter") == fence.FenceState("jobs", 6, second)


def test_readers_of_a_phase_claim_never_write_and_are_stale_once_a_writer_claimed(conn: sqlite3.Connection) -> None:
    service = ServiceKey()
    for session in (1, 2):
        with sqlite.transaction(conn, "counter", service.grant("rw", 5, session, "s"), intent="read"):
            assert conn.execute("SELECT n FROM counter").fetchone()[0] == 0
    assert sqlite.fence_state(conn, "counter") == fence.FenceState("rw", 5, 0)
    with pytest.raises(fence.SharedWrite) as refused:
        with sqlite.transaction(conn, "counter", service.grant("rw", 5, 1, "s")):
            conn.execute("UPDATE counter SET n = n + 100")
    assert refused.value.kind == "shared_write" and refused.value.is_rejection and refused.value.is_final
    assert "acquire the lock exclusive" in str(refused.value)
    with pytest.raises(fence.TokenReissued, match="the readers of a shared phase"):
        with sqlite.transaction(conn, "counter", service.grant("rw", 5, 1)):
            pass
    with sqlite.transaction(conn, "counter", service.grant("rw", 6, 3)):
        conn.execute("UPDATE counter SET n = n + 1")
    with pytest.raises(fence.Stale):
        with sqlite.transaction(conn, "counter", service.grant("rw", 5, 2, "s"), intent="read"):
            pass
    assert conn.execute("SELECT n FROM counter").fetchone()[0] == 1


def test_each_slot_of_a_semaphore_keeps_a_maximum_of_its_own(conn: sqlite3.Connection) -> None:
    service = ServiceKey()
    with sqlite.transaction(conn, "shard-0", service.grant("shards", 9, 1, "p0")):
        pass
    with sqlite.transaction(conn, "shard-1", service.grant("shards", 3, 2, "p1")):
        pass
    assert sqlite.fence_state(conn, "shard-0") == fence.FenceState("shards\x1f0", 9, 1)
    with pytest.raises(fence.WrongLock, match=re.escape("'shards (slot 0)'")):
        with sqlite.transaction(conn, "shard-0", service.grant("shards", 10, 2, "p1")):
            pass
    with pytest.raises(fence.WrongLock):
        with sqlite.transaction(conn, "shard-0", service.grant("shards", 10, 2)):
            pass
    with pytest.raises(fence.Stale):
        with sqlite.transaction(conn, "shard-0", service.grant("shards", 8, 3, "p0")):
            pass
    with pytest.raises(fence.WrongLock):
        with sqlite.transaction(conn, "shard-2", service.grant("shards", 1, 1, "p2"), expect_lock="shards"):
            pass
