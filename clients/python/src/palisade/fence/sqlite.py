"""A fence inside the caller's SQLite transaction (the standard library's ``sqlite3``).

The same table and statement as the Rust adapter ``palisade_fence::sqlite``, in the same
database file as the caller's data, so a Rust writer and a Python writer fence the same rows.

**Claim first, then read, then write**, in a transaction begun with ``BEGIN IMMEDIATE``
(:func:`begin`, or :class:`transaction`), which holds SQLite's write lock from its first
statement to its commit: no other connection can change the fence row or the data in between,
and the caller's writes and the advance commit together. A deferred transaction that read before
claiming may be refused with ``SQLITE_BUSY`` (a retryable :class:`~palisade.fence.Storage`).

The connection must be opened with ``isolation_level=None`` (the library then leaves
transactions to the caller), or the helpers refuse it. :func:`claim` is for a transaction that
writes and refuses a shared grant (a reader of a read-write lock) as
:class:`~palisade.fence.SharedWrite`; a reader's transaction claims with :func:`claim_read`. SQLite 3.35 or later (``RETURNING``).
"""

from __future__ import annotations

import sqlite3
from typing import Any, Optional

from . import (
    WRITE,
    Corrupt,
    FenceState,
    Intent,
    InvalidRequest,
    Storage,
    confirm_advanced,
    explain_refusal,
    precheck,
    stored_holder,
    stored_state,
    to_signed,
    validate_scope,
)
from ..sequencer import VerifiedSequencer

CREATE_TABLE_SQL = """CREATE TABLE IF NOT EXISTS palisade_fence (
        scope TEXT PRIMARY KEY NOT NULL,
        lock_name TEXT NOT NULL,
        token_max INTEGER NOT NULL CHECK (token_max >= 1),
        holder_session INTEGER NOT NULL,
        updated_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP
    )"""

ADVANCE_SQL = """INSERT INTO palisade_fence (scope, lock_name, token_max, holder_session)
    VALUES (?1, ?2, ?3, ?4)
    ON CONFLICT (scope) DO UPDATE
        SET token_max = excluded.token_max,
            holder_session = excluded.holder_session,
            updated_at = CURRENT_TIMESTAMP
        WHERE palisade_fence.lock_name = excluded.lock_name
            AND (palisade_fence.token_max < excluded.token_max
                OR (palisade_fence.token_max = excluded.token_max
                    AND palisade_fence.holder_session = excluded.holder_session))
    RETURNING token_max"""

SELECT_SQL = "SELECT lock_name, token_max, holder_session FROM palisade_fence WHERE scope = ?1"


def create_table_sql() -> str:
    return CREATE_TABLE_SQL


def _check_connection(conn: sqlite3.Connection) -> None:
    if conn.isolation_level is not None:
        raise InvalidRequest(
            "invalid fenced request: open the sqlite3 connection with isolation_level=None, so that "
            "the fence's BEGIN IMMEDIATE starts the transaction"
        )


def ensure_schema(conn: sqlite3.Connection) -> None:
    """Creates the fence table if it does not exist."""
    try:
        conn.execute(CREATE_TABLE_SQL)
    except sqlite3.Error as error:
        raise _storage(error) from None


def begin(conn: sqlite3.Connection) -> None:
    """Starts a transaction that holds the write lock from its first statement."""
    _check_connection(conn)
    if conn.in_transaction:
        raise InvalidRequest("invalid fenced request: a transaction is already open; the claim must come first")
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.Error as error:
        raise _storage(error) from None


def claim(
    conn: sqlite3.Connection,
    scope: str,
    sequencer: VerifiedSequencer,
    *,
    expect_lock: Optional[str] = None,
    intent: Intent = WRITE,
) -> None:
    """Claims ``scope`` for ``sequencer`` inside the transaction :func:`begin` started, for a
    transaction that writes (``intent="read"``: one that only reads): advances the accepted token,
    or raises :class:`~palisade.fence.Stale` / :class:`~palisade.fence.WrongLock` /
    :class:`~palisade.fence.SharedWrite`. On an error, roll the transaction back."""
    validate_scope(scope)
    precheck(expect_lock, sequencer, intent)
    _check_connection(conn)
    if not conn.in_transaction:
        raise InvalidRequest("invalid fenced request: claim inside a transaction begun with sqlite.begin(conn)")
    token = sequencer.token
    try:
        row = conn.execute(ADVANCE_SQL, (scope, sequencer.binding, token, to_signed(stored_holder(sequencer)))).fetchone()
        if row is not None:
            confirm_advanced(scope, row[0], token)
            return
        stored = conn.execute(SELECT_SQL, (scope,)).fetchone()
    except sqlite3.Error as error:
        raise _storage(error) from None
    if stored is None:
        raise Corrupt(f"fence state of scope {scope!r} is corrupt: the fence row refused the token but cannot be read")
    raise explain_refusal(scope, stored_state(scope, stored[0], stored[1], stored[2]), sequencer, intent)


def claim_read(
    conn: sqlite3.Connection, scope: str, sequencer: VerifiedSequencer, *, expect_lock: Optional[str] = None
) -> None:
    """:func:`claim` for a transaction that only reads: any grant may, a shared one included."""
    claim(conn, scope, sequencer, expect_lock=expect_lock, intent="read")


def fence_state(conn: sqlite3.Connection, scope: str) -> Optional[FenceState]:
    validate_scope(scope)
    try:
        row = conn.execute(SELECT_SQL, (scope,)).fetchone()
    except sqlite3.Error as error:
        raise _storage(error) from None
    return None if row is None else stored_state(scope, row[0], row[1], row[2])


class transaction:
    """``with sqlite.transaction(conn, scope, sequencer):`` — ``BEGIN IMMEDIATE``, the claim
    (``intent="read"`` for a block that only reads), the block, then ``COMMIT`` (``ROLLBACK`` on
    any exception)."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        scope: str,
        sequencer: VerifiedSequencer,
        *,
        expect_lock: Optional[str] = None,
        intent: Intent = WRITE,
    ):
        self._conn = conn
        self._scope = scope
        self._sequencer = sequencer
        self._expect_lock = expect_lock
        self._intent = intent

    def __enter__(self) -> sqlite3.Connection:
        begin(self._conn)
        try:
            claim(self._conn, self._scope, self._sequencer, expect_lock=self._expect_lock, intent=self._intent)
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        return self._conn

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            return
        try:
            self._conn.execute("COMMIT")
        except sqlite3.Error as error:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            raise _storage(error) from None


def _storage(error: sqlite3.Error) -> Storage:
    return Storage(f"fence storage error: sqlite error: {error}")
