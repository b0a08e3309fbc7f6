"""The SQLite fence on real database files."""

import pathlib
import re
import sqlite3

import pytest

from palisade import fence
from palisade.fence import sqlite


@pytest.fixture
def conn(tmp_path):
    connection = sqlite3.connect(tmp_path / "app.db", isolation_level=None)
    sqlite.ensure_schema(connection)
    connection.execute("CREATE TABLE counter (n INTEGER NOT NULL)")
    connection.execute("INSERT INTO counter VALUES (0)")
    yield connection
    connection.close()


def test_the_fence_table_is_the_rust_adapters():
    rust = (pathlib.Path(__file__).resolve().parents[3] / "crates/fence/src/sqlite.rs").read_text()
    assert sqlite.CREATE_TABLE_SQL in rust
    assert sqlite.ADVANCE_SQL in rust


def test_a_superseded_holder_cannot_write_back_what_it_read(client, conn, unique, tmp_path):
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


def test_a_connection_that_manages_transactions_itself_is_refused(tmp_path, client, unique):
    verifier = fence.Verifier(client.public_keys())
    with client.lock(unique, ttl=5) as grant:
        sequencer = verifier.verify(grant.sequencer)
    legacy = sqlite3.connect(tmp_path / "legacy.db")
    sqlite.ensure_schema(legacy)
    with pytest.raises(fence.InvalidRequest, match="isolation_level=None"):
        with sqlite.transaction(legacy, "s", sequencer):
            pass
    legacy.close()
