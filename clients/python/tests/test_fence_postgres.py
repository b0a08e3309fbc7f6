"""The PostgreSQL fence against a real PostgreSQL, with grants of a real `palisade serve`; a
Rust writer (palisade-fence's `protect_postgres` example) and a Python writer fencing one row;
and a holder process frozen past its lease."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import uuid
from typing import TYPE_CHECKING, Any, Iterator

import pytest

import palisade
from palisade import fence
from palisade.fence import postgres

from .conftest import Server, cargo_binary
from .signing import ServiceKey

if TYPE_CHECKING:
    from psycopg import Connection

psycopg = pytest.importorskip("psycopg")

HERE = pathlib.Path(__file__).resolve().parent
# The scope and row the Rust example `protect_postgres` writes.
SCOPE = "reports/nightly"


def append_line(conn: Connection[Any], verifier: fence.Verifier, sequencer_text: str, line: str) -> None:
    """What `protect_postgres` does, in Python: claim, read the report, write it back."""
    with postgres.transaction(conn, SCOPE, verifier.verify(sequencer_text)):
        row = conn.execute("SELECT body FROM reports WHERE name = 'nightly'").fetchone()
        body = line if row is None else f"{row[0]}\n{line}"
        conn.execute(
            "INSERT INTO reports (name, body) VALUES ('nightly', %s) "
            "ON CONFLICT (name) DO UPDATE SET body = EXCLUDED.body",
            (body,),
        )


def scalar(conn: Connection[Any], sql: str) -> Any:
    """The first column of the one row ``sql`` returns."""
    row = conn.execute(sql).fetchone()
    assert row is not None, f"no row from {sql}"
    return row[0]


def report(conn: Connection[Any]) -> list[str]:
    row = conn.execute("SELECT body FROM reports WHERE name = 'nightly'").fetchone()
    conn.rollback()
    return [] if row is None else row[0].split("\n")


@pytest.fixture
def db(schema_dsn: str) -> Iterator[Connection[Any]]:
    with psycopg.connect(schema_dsn) as conn:
        postgres.ensure_schema(conn)
        conn.execute("CREATE TABLE IF NOT EXISTS reports (name text PRIMARY KEY, body text NOT NULL)")
        conn.commit()
        yield conn


def test_the_fence_table_is_the_rust_adapters(db: Connection[Any]) -> None:
    import re

    rust = (pathlib.Path(__file__).resolve().parents[3] / "crates/fence/src/postgres.rs").read_text()
    for sql in (postgres.CREATE_TABLE_SQL, postgres.ADVANCE_SQL.replace("%s", "$N")):
        # Same statement, up to the placeholders ($1 in Rust, %s in psycopg).
        rust_text = re.sub(r"\$\d", "$N", rust)
        assert sql.replace("%s", "$N") in rust_text, sql


def test_an_older_grant_is_refused_after_a_newer_one_claimed(
    client: palisade.Client, db: Connection[Any], unique: str
) -> None:
    verifier = fence.Verifier(client.public_keys())
    with client.lock(unique, ttl=5) as old:
        pass
    with client.lock(unique, ttl=5) as new:
        with postgres.transaction(db, "orders", verifier.verify(new.sequencer)):
            db.execute("CREATE TABLE orders (n int)")
            db.execute("INSERT INTO orders VALUES (1)")
    with pytest.raises(fence.Stale) as stale:
        with postgres.transaction(db, "orders", verifier.verify(old.sequencer)):
            db.execute("INSERT INTO orders VALUES (2)")
    assert (stale.value.presented, stale.value.accepted) == (old.token, new.token)
    assert stale.value.holder_session == new.session_id
    assert stale.value.is_rejection and stale.value.is_final
    assert scalar(db, "SELECT array_agg(n) FROM orders") == [1], "nothing of the old holder landed"
    db.rollback()
    state = postgres.fence_state(db, "orders")
    assert state == fence.FenceState(unique, new.token, new.session_id)
    db.rollback()
    # A sequencer of another lock is refused for this scope, and a forged one before any SQL.
    with client.lock(unique + "/other", ttl=5) as other:
        with pytest.raises(fence.WrongLock):
            with postgres.transaction(db, "orders", verifier.verify(other.sequencer)):
                pass
    with pytest.raises(fence.Forged):
        verifier.verify(new.sequencer[:-2] + ("AA" if not new.sequencer.endswith("AA") else "BA"))
    with pytest.raises(fence.Missing):
        verifier.verify("  ")
    with pytest.raises(fence.InvalidScope):
        postgres.claim(db, "x" * 513, verifier.verify(new.sequencer))


def test_a_token_issued_twice_is_refused_from_the_second_session_and_the_first_writes_on(db: Connection[Any]) -> None:
    service = ServiceKey()
    db.execute("CREATE TABLE tally (n int NOT NULL)")
    db.execute("INSERT INTO tally VALUES (0)")
    db.commit()
    # Sessions above i64::MAX are stored bit for bit as negative bigints: compare them too.
    first, second = (1 << 64) - 2, 7
    with postgres.transaction(db, "tally", service.grant("jobs", 5, first)):
        db.execute("UPDATE tally SET n = n + 1")
    before = postgres.fence_state(db, "tally")
    db.rollback()
    # A lock service restored from a backup grants token 5 again, to another session.
    for presented in (second, (1 << 64) - 1):
        with pytest.raises(fence.TokenReissued) as reissued:
            with postgres.transaction(db, "tally", service.grant("jobs", 5, presented)):
                db.execute("UPDATE tally SET n = n + 100")
        refusal = reissued.value
        assert (refusal.lock, refusal.token, refusal.first_session, refusal.presented_session) == (
            "jobs",
            5,
            first,
            presented,
        )
        assert refusal.is_rejection and refusal.is_final
    assert postgres.fence_state(db, "tally") == before
    assert scalar(db, "SELECT n FROM tally") == 1
    db.rollback()
    # The first session writes on with token 5; a newer token advances as before.
    with postgres.transaction(db, "tally", service.grant("jobs", 5, first)):
        db.execute("UPDATE tally SET n = n + 1")
    with postgres.transaction(db, "tally", service.grant("jobs", 6, second)):
        db.execute("UPDATE tally SET n = n + 1")
    assert scalar(db, "SELECT n FROM tally") == 3
    assert postgres.fence_state(db, "tally") == fence.FenceState("jobs", 6, second)
    db.rollback()


def test_a_claim_must_start_its_transaction(client: palisade.Client, db: Connection[Any], unique: str) -> None:
    verifier = fence.Verifier(client.public_keys())
    with client.lock(unique, ttl=5) as grant:
        sequencer = verifier.verify(grant.sequencer)
    db.execute("SELECT 1")
    with pytest.raises(fence.InvalidRequest, match="already open"):
        with postgres.transaction(db, "orders", sequencer):
            pass
    db.rollback()


@pytest.fixture(scope="module")
def protect_postgres() -> pathlib.Path:
    return cargo_binary(
        "examples/protect_postgres",
        ["-p", "palisade-fence", "--example", "protect_postgres"],
        "PALISADE_PROTECT_POSTGRES_BIN",
    )


def run_rust_writer(
    binary: pathlib.Path, schema_dsn: str, public_key: str, sequencer: str, line: str
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PALISADE_PUBLIC_KEY=public_key, DATABASE_URL=schema_dsn, PALISADE_SEQUENCER=sequencer)
    return subprocess.run([str(binary), line], env=env, capture_output=True, text=True, timeout=60)


def test_a_rust_writer_and_a_python_writer_fence_the_same_row(
    client: palisade.Client, db: Connection[Any], schema_dsn: str, protect_postgres: pathlib.Path
) -> None:
    keys = client.public_keys()
    verifier = fence.Verifier(keys)
    public_key = str(keys.keys[-1])
    with client.lock(SCOPE, ttl=5) as first:
        pass
    with client.lock(SCOPE, ttl=5) as second:
        pass
    with client.lock(SCOPE, ttl=5) as third:
        pass

    # Rust writes with the second grant: the Python writer's older first grant is refused.
    rust = run_rust_writer(protect_postgres, schema_dsn, public_key, second.sequencer, "rust, second grant")
    assert rust.returncode == 0, rust.stderr
    with pytest.raises(fence.Stale) as stale:
        append_line(db, verifier, first.sequencer, "python, first grant")
    assert (stale.value.presented, stale.value.accepted) == (first.token, second.token)

    # Python writes with the third grant: the Rust writer's second grant is now refused (exit 3).
    append_line(db, verifier, third.sequencer, "python, third grant")
    rust = run_rust_writer(protect_postgres, schema_dsn, public_key, second.sequencer, "rust, late")
    assert rust.returncode == 3, (rust.returncode, rust.stdout, rust.stderr)
    assert f"token {second.token} is older than the accepted token {third.token}" in rust.stderr
    assert report(db) == ["rust, second grant", "python, third grant"]


def test_a_holder_frozen_past_its_lease_is_refused_after_a_newer_holder_wrote(
    server: Server, client: palisade.Client, db: Connection[Any], schema_dsn: str
) -> None:
    """SIGSTOP a holder process past its lease; another process takes the lock and writes; on
    SIGCONT the first believes it still holds the lock and writes: the fence refuses it."""
    verifier = fence.Verifier(client.public_keys())
    holder = subprocess.Popen(
        [sys.executable, str(HERE / "holder.py"), server.endpoint, SCOPE, schema_dsn],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stderr is not None
    try:
        granted = holder.stdout.readline().split()
        assert granted[:1] == ["granted"], (granted, holder.stderr.read() if holder.poll() is not None else "")
        old_token = int(granted[1])
        holder.send_signal(signal.SIGSTOP)
        # The frozen holder's session expires (ttl 1 s); the next holder gets the lock and writes.
        with client.lock(SCOPE, ttl=5, wait=10) as newer:
            assert newer.token > old_token
            append_line(db, verifier, newer.sequencer, f"newer holder, token {newer.token}")
        holder.send_signal(signal.SIGCONT)
        out, err = holder.communicate("write\n", timeout=30)
    finally:
        if holder.poll() is None:
            holder.send_signal(signal.SIGCONT)
            holder.kill()
    assert holder.returncode == 3, (holder.returncode, out, err)
    assert f"token {old_token} is older than the accepted token {newer.token}" in err
    assert report(db) == [f"newer holder, token {newer.token}"], "the frozen holder's write never landed"


def test_readers_of_a_phase_claim_never_write_and_each_slot_keeps_its_own_maximum(db: Connection[Any]) -> None:
    from palisade.fence import stream

    service = ServiceKey()
    for session in (1, 2):
        postgres.claim_read(db, "phase", service.grant("rw", 5, session, "s"))
        db.commit()
    assert postgres.fence_state(db, "phase") == fence.FenceState("rw", 5, 0)
    db.rollback()
    with pytest.raises(fence.SharedWrite):
        with postgres.transaction(db, "phase", service.grant("rw", 5, 1, "s")):
            db.execute("INSERT INTO reports VALUES ('phase', 'a reader wrote')")
    with pytest.raises(fence.TokenReissued):
        with postgres.transaction(db, "phase", service.grant("rw", 5, 1)):
            pass
    with postgres.transaction(db, "phase", service.grant("rw", 6, 3)):
        pass
    with pytest.raises(fence.Stale):
        with postgres.transaction(db, "phase", service.grant("rw", 5, 2, "s"), intent="read"):
            pass
    assert scalar(db, "SELECT count(*) FROM reports WHERE name = 'phase'") == 0
    db.rollback()
    # A producer's message is a write: a reader's is dropped by the consumer's filter.
    verifier = fence.Verifier(service.public)
    admission = stream.admit_postgres(db, "phase-stream", service.grant("rw", 9, 1, "s").text, verifier)
    assert not admission.process and admission.refusal is not None and admission.refusal.kind == "shared_write"
    db.rollback()
    # Slots: two scopes, two maxima; a permit of another slot is another binding.
    with postgres.transaction(db, "shard-0", service.grant("shards", 9, 1, "p0")):
        pass
    with postgres.transaction(db, "shard-1", service.grant("shards", 3, 2, "p1")):
        pass
    assert postgres.fence_state(db, "shard-0") == fence.FenceState("shards\x1f0", 9, 1)
    db.rollback()
    with pytest.raises(fence.WrongLock, match=r"'shards \(slot 0\)'"):
        with postgres.transaction(db, "shard-0", service.grant("shards", 10, 2, "p1")):
            pass
    with pytest.raises(fence.Stale):
        with postgres.transaction(db, "shard-0", service.grant("shards", 8, 3, "p0")):
            pass
