//! A fence inside the caller's SQLite transaction.
//!
//! **Claim first, then read, then write.** Start the transaction with [`begin`] and call
//! [`claim`] before its reads, not just before its writes. Once [`claim`] returns, no older
//! grant can commit to the scope. A holder that reads in one transaction and writes in a later
//! one claims in both: the later claim is refused as [`FenceError::Stale`] if a newer grant
//! claimed in between, so a decision made on data the newer holder may have changed is never
//! written.
//!
//! The accepted maximum of each scope is a row of `palisade_fence` ([`create_table_sql`]) in the
//! same database file as the caller's data. [`claim`] runs one `INSERT ... ON CONFLICT DO UPDATE
//! ... WHERE ... RETURNING` statement inside the caller's transaction; its `WHERE` accepts a larger
//! token, or the accepted one from the session that presented it first (another session's is
//! refused as [`FenceError::TokenReissued`]: the lock service issued that token twice).
//!
//! Atomicity: SQLite admits one writer per database at a time. A transaction begun with
//! `BEGIN IMMEDIATE` ([`begin`]) holds the write lock from its first statement to its commit or
//! rollback, so no other connection or process can change the fence row or the caller's data
//! in between, and its reads see every committed write; the caller's writes and the advance
//! commit together (invariant 3). A deferred transaction that read before claiming may find,
//! when the claim tries to become the writer, that another connection has written since its
//! read: SQLite then refuses the claim with `SQLITE_BUSY` (a retryable [`FenceError::Storage`])
//! rather than let it write from a stale read. That is safe but spurious; use [`begin`].
//!
//! Durability is the connection's (`journal_mode`, `synchronous`): the accepted maximum is
//! exactly as durable as the data it protects. `holder_session` is a `u64` stored bit-for-bit in
//! an `INTEGER`.

use palisade_sequencer::VerifiedSequencer;
use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior};

use crate::FenceError;
use crate::fence::{
    FenceState, Intent, LockBinding, confirm_advanced, explain_refusal, precheck, stored_holder,
    stored_state, validate_scope,
};

/// The DDL of the fence table.
pub fn create_table_sql() -> &'static str {
    "CREATE TABLE IF NOT EXISTS palisade_fence (
        scope TEXT PRIMARY KEY NOT NULL,
        lock_name TEXT NOT NULL,
        token_max INTEGER NOT NULL CHECK (token_max >= 1),
        holder_session INTEGER NOT NULL,
        updated_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP
    )"
}

/// Creates the fence table if it does not exist.
pub fn ensure_schema(conn: &Connection) -> Result<(), FenceError> {
    conn.execute_batch(create_table_sql()).map_err(storage)
}

/// Starts a transaction that holds the write lock from its first statement (`BEGIN IMMEDIATE`).
pub fn begin(conn: &mut Connection) -> Result<Transaction<'_>, FenceError> {
    conn.transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(storage)
}

const ADVANCE_SQL: &str = "INSERT INTO palisade_fence (scope, lock_name, token_max, holder_session)
    VALUES (?1, ?2, ?3, ?4)
    ON CONFLICT (scope) DO UPDATE
        SET token_max = excluded.token_max,
            holder_session = excluded.holder_session,
            updated_at = CURRENT_TIMESTAMP
        WHERE palisade_fence.lock_name = excluded.lock_name
            AND (palisade_fence.token_max < excluded.token_max
                OR (palisade_fence.token_max = excluded.token_max
                    AND palisade_fence.holder_session = excluded.holder_session))
    RETURNING token_max";

const SELECT_SQL: &str =
    "SELECT lock_name, token_max, holder_session FROM palisade_fence WHERE scope = ?1";

/// Claims `scope` for `sequencer` inside `txn`, for a transaction that writes: checks the
/// sequencer and advances the scope's accepted token to it, or refuses it ([`FenceError::Stale`],
/// [`FenceError::WrongLock`], and a shared grant as [`FenceError::SharedWrite`]; a reader's
/// transaction claims with [`claim_read`]).
///
/// Call it first in a transaction begun with [`begin`], before its reads (see the module docs).
/// On `Err`, roll the transaction back (drop it). Claiming again with the same sequencer is
/// accepted, so a claim-only transaction (claim, read, commit) orders a read on its own.
pub fn claim(
    txn: &Transaction<'_>,
    scope: &str,
    sequencer: &VerifiedSequencer,
) -> Result<(), FenceError> {
    claim_expecting(txn, scope, sequencer, LockBinding::BindOnFirstWrite)
}

/// [`claim`] for a transaction that only reads: any grant may, a shared one (a reader of a
/// read-write lock) included. The transaction must not write: the fence cannot see what follows.
pub fn claim_read(
    txn: &Transaction<'_>,
    scope: &str,
    sequencer: &VerifiedSequencer,
) -> Result<(), FenceError> {
    claim_with(
        txn,
        scope,
        sequencer,
        LockBinding::BindOnFirstWrite,
        Intent::Read,
    )
}

/// [`claim`], refusing sequencers of any lock but the one `binding` names.
pub fn claim_expecting(
    txn: &Transaction<'_>,
    scope: &str,
    sequencer: &VerifiedSequencer,
    binding: LockBinding<'_>,
) -> Result<(), FenceError> {
    claim_with(txn, scope, sequencer, binding, Intent::Write)
}

/// The claim with everything said: the binding the scope must have and what the transaction
/// does ([`Intent::Write`] refuses a shared grant as [`FenceError::SharedWrite`]).
pub fn claim_with(
    txn: &Transaction<'_>,
    scope: &str,
    sequencer: &VerifiedSequencer,
    binding: LockBinding<'_>,
    intent: Intent,
) -> Result<(), FenceError> {
    validate_scope(scope)?;
    // The expected binding and a shared write do not depend on stored state: refuse before
    // touching the database.
    precheck(binding, sequencer, intent)?;
    let lock = sequencer.binding();
    let token =
        i64::try_from(sequencer.token().get()).expect("verified tokens are at most i64::MAX");
    let session = stored_holder(sequencer).get() as i64; // bit-for-bit, see module docs
    let advanced: Option<i64> = txn
        .query_row(ADVANCE_SQL, (scope, lock.as_ref(), token, session), |row| {
            row.get(0)
        })
        .optional()
        .map_err(storage)?;
    if let Some(stored) = advanced {
        return confirm_advanced(scope, stored, token);
    }
    // Refused; we hold the write lock, so this read sees what refused us.
    let accepted = read_state(txn, scope)?.ok_or_else(|| FenceError::Corrupt {
        scope: scope.to_owned(),
        message: "the fence row refused the token but cannot be read".into(),
    })?;
    Err(explain_refusal(scope, &accepted, sequencer, intent))
}

/// The state of `scope` as visible to `conn`, if any write was accepted.
pub fn fence_state(conn: &Connection, scope: &str) -> Result<Option<FenceState>, FenceError> {
    validate_scope(scope)?;
    read_state(conn, scope)
}

fn read_state(conn: &Connection, scope: &str) -> Result<Option<FenceState>, FenceError> {
    let row: Option<(String, i64, i64)> = conn
        .query_row(SELECT_SQL, [scope], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?))
        })
        .optional()
        .map_err(storage)?;
    let Some((lock, token_max, holder_session)) = row else {
        return Ok(None);
    };
    // `holder_session` is stored bit-for-bit (see the module docs).
    stored_state(scope, lock, token_max.into(), holder_session as u64).map(Some)
}

fn storage(error: rusqlite::Error) -> FenceError {
    FenceError::Storage {
        message: format!("sqlite error: {error}"),
    }
}
