"""A fence inside the caller's PostgreSQL transaction (psycopg 3).

The same table and statement as the Rust adapter ``palisade_fence::postgres``: a Rust writer and
a Python writer claiming the same scope are ordered by token, whichever runs first.

**Claim first, then read, then write.** :func:`claim` is the first statement of the caller's
transaction, before its reads::

    with conn.transaction():
        postgres.claim(conn, "reports/nightly", sequencer)
        body = conn.execute("SELECT body FROM reports WHERE name = 'nightly'").fetchone()
        conn.execute("UPDATE reports SET body = %s WHERE name = 'nightly'", (new_body,))

:func:`claim` is for a transaction that writes, and refuses a shared grant (a reader of a
read-write lock) as :class:`~palisade.fence.SharedWrite`; a reader's transaction claims with
:func:`claim_read` (and must not write: the fence cannot see what follows).

The claim is one ``INSERT ... ON CONFLICT (scope) DO UPDATE ... WHERE token_max < presented OR
(token_max = presented AND holder_session = presenting session, 0 for a shared grant)`` (an equal token from another
session is refused as :class:`~palisade.fence.TokenReissued`: the lock service issued it twice):
it locks the scope's row until the transaction ends, so concurrent claimers of one scope run one
after another in token order, and an older claimer, re-evaluating the ``WHERE`` against the
committed row under READ COMMITTED, is refused (:class:`~palisade.fence.Stale`). The caller's
writes and the advance commit or roll back together. A read made *before* the claim is not
ordered: claim first. Under REPEATABLE READ or SERIALIZABLE a concurrent claim makes PostgreSQL
abort with a serialization failure, a retryable :class:`~palisade.fence.Storage`.

The table name is not schema-qualified (resolved through ``search_path``): keep it in a schema
only trusted roles can create tables in.
"""

from __future__ import annotations

from typing import Any, Optional

from . import (
    WRITE,
    FenceState,
    Intent,
    OutcomeUnknown,
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
        scope text PRIMARY KEY,
        lock_name text NOT NULL,
        token_max bigint NOT NULL CHECK (token_max >= 1),
        holder_session bigint NOT NULL,
        updated_at timestamptz NOT NULL DEFAULT now()
    )"""

ADVANCE_SQL = """INSERT INTO palisade_fence AS fence (scope, lock_name, token_max, holder_session)
    VALUES (%s, %s, %s, %s)
    ON CONFLICT (scope) DO UPDATE
        SET token_max = EXCLUDED.token_max,
            holder_session = EXCLUDED.holder_session,
            updated_at = now()
        WHERE fence.lock_name = EXCLUDED.lock_name
            AND (fence.token_max < EXCLUDED.token_max
                OR (fence.token_max = EXCLUDED.token_max
                    AND fence.holder_session = EXCLUDED.holder_session))
    RETURNING token_max"""

SELECT_SQL = "SELECT lock_name, token_max, holder_session FROM palisade_fence WHERE scope = %s"


def create_table_sql() -> str:
    """The DDL of the fence table (the Rust adapter's, character for character)."""
    return CREATE_TABLE_SQL


def ensure_schema(conn: Any) -> None:
    """Creates the fence table if it does not exist (in its own transaction if ``conn`` is in
    autocommit mode, else in the caller's); safe to run from many processes at once."""
    import psycopg

    try:
        with conn.transaction():
            conn.execute(CREATE_TABLE_SQL)
    except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable):
        pass  # two concurrent CREATE TABLE IF NOT EXISTS collided; the winner made it
    except psycopg.Error as error:
        raise _storage(error) from None


def claim(
    conn: Any, scope: str, sequencer: VerifiedSequencer, *, expect_lock: Optional[str] = None, intent: Intent = WRITE
) -> None:
    """Claims ``scope`` for ``sequencer`` inside the connection's current transaction, for a
    transaction that writes (``intent="read"``: one that only reads, as :func:`claim_read`):
    advances the scope's accepted token to it, or raises :class:`~palisade.fence.Stale` /
    :class:`~palisade.fence.WrongLock` / :class:`~palisade.fence.SharedWrite` (a reader's write).
    ``expect_lock`` refuses other bindings' sequencers even for the first claim. On an error, let
    the transaction roll back."""
    import psycopg

    validate_scope(scope)
    precheck(expect_lock, sequencer, intent)  # the binding and a reader's write need no stored state
    token = sequencer.token
    try:
        row = conn.execute(
            ADVANCE_SQL, (scope, sequencer.binding, token, to_signed(stored_holder(sequencer))), prepare=False
        ).fetchone()
        if row is not None:
            confirm_advanced(scope, row[0], token)
            return
        # Refused. The upsert locked the row, so this read sees what refused us.
        stored = conn.execute(SELECT_SQL, (scope,)).fetchone()
    except psycopg.Error as error:
        raise _storage(error) from None
    accepted = stored_state(scope, stored[0], stored[1], stored[2])
    raise explain_refusal(scope, accepted, sequencer, intent)


def claim_read(conn: Any, scope: str, sequencer: VerifiedSequencer, *, expect_lock: Optional[str] = None) -> None:
    """:func:`claim` for a transaction that only reads: any grant may, a shared one (a reader of
    a read-write lock) included. The transaction must not write."""
    claim(conn, scope, sequencer, expect_lock=expect_lock, intent="read")


def fence_state(conn: Any, scope: str) -> Optional[FenceState]:
    """The state of ``scope`` as the connection sees it, if any claim was accepted."""
    import psycopg

    validate_scope(scope)
    try:
        row = conn.execute(SELECT_SQL, (scope,)).fetchone()
    except psycopg.Error as error:
        raise _storage(error) from None
    return None if row is None else stored_state(scope, row[0], row[1], row[2])


def commit(conn: Any) -> None:
    """Commits the connection's transaction (the claim and the caller's writes together).

    A serialization failure, deadlock (class 40) or deferred constraint (class 23) means it
    rolled back: :class:`~palisade.fence.Storage`. Anything else (the connection failed during
    the commit) is :class:`~palisade.fence.OutcomeUnknown`: it may or may not have committed.
    """
    import psycopg

    try:
        conn.commit()
    except psycopg.Error as error:
        state = getattr(error, "sqlstate", None) or ""
        if state.startswith("40") or state.startswith("23"):
            raise _storage(error) from None
        raise OutcomeUnknown(
            f"outcome unknown: postgresql commit failed, it may or may not have committed: {error}; "
            "the write may or may not have been applied, read it back under a claim before retrying"
        ) from None


def _storage(error: Any) -> Storage:
    state = getattr(error, "sqlstate", None)
    prefix = f"postgresql error {state}" if state else "postgresql error"
    return Storage(f"fence storage error: {prefix}: {error}")


class transaction:
    """``with postgres.transaction(conn, scope, sequencer):`` — a transaction that starts with
    the claim and commits with :func:`commit` (so a lost commit answer is
    :class:`~palisade.fence.OutcomeUnknown`), rolling back on any exception.

    ``conn`` must be a psycopg connection outside autocommit mode and idle (no transaction open),
    so that the claim is the transaction's first statement. ``intent="read"`` for a transaction
    that only reads (a reader of a read-write lock may).
    """

    def __init__(
        self,
        conn: Any,
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

    def __enter__(self) -> Any:
        import psycopg

        from . import InvalidRequest

        conn = self._conn
        if conn.autocommit:
            raise InvalidRequest("invalid fenced request: the connection is in autocommit mode; the claim needs a transaction")
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            raise InvalidRequest(
                "invalid fenced request: a transaction is already open on the connection; the claim must be its first statement"
            )
        try:
            claim(conn, self._scope, self._sequencer, expect_lock=self._expect_lock, intent=self._intent)
        except BaseException:
            conn.rollback()
            raise
        return conn

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            self._conn.rollback()
            return
        commit(self._conn)
