//! A fence inside the caller's MySQL or MariaDB (InnoDB) transaction, through `mysql_async`.
//!
//! **Claim first, then read, then write.** [`claim`] is the first statement of the caller's
//! transaction, before its reads, not just before its writes:
//!
//! ```text
//! START TRANSACTION; claim(scope, sequencer); SELECT ...; UPDATE ...; COMMIT  -- mysql::commit
//! ```
//!
//! Once [`claim`] returns, no older grant can commit to the scope, and this transaction holds
//! the scope's fence row until it ends. A holder that reads in one transaction and writes in a
//! later one claims in both: the later claim is refused as [`FenceError::Stale`] if a newer grant
//! claimed in between.
//!
//! The accepted maximum of each scope is a row of `palisade_fence` ([`create_table_sql`]), an
//! InnoDB table next to the caller's. [`claim`] runs, in the caller's transaction:
//!
//! ```sql
//! INSERT INTO palisade_fence (scope, lock_name, token_max, holder_session) VALUES (?, ?, ?, ?)
//!     ON DUPLICATE KEY UPDATE scope = scope;                    -- lock the row, or create it
//! SELECT lock_name, token_max, holder_session FROM palisade_fence
//!     WHERE scope = ? FOR UPDATE;                               -- the latest committed state
//! UPDATE palisade_fence SET token_max = ?, ... WHERE scope = ?; -- only if the token advances
//! ```
//!
//! and decides between them with the same [`crate::check`] every backend runs (so an equal token
//! from another session than the one that presented it first is refused as
//! [`FenceError::TokenReissued`]).
//!
//! # Why this is atomic in InnoDB
//!
//! - `INSERT ... ON DUPLICATE KEY UPDATE` takes an **exclusive** lock on the scope's row when
//!   the row exists (a plain `INSERT` would take a shared one), and an exclusive lock on the row
//!   it inserts when it does not. Either way the transaction holds the row exclusively until it
//!   commits or rolls back, so claimers of one scope run one after another.
//! - A locking read (`FOR UPDATE`) reads the **latest committed** version of the row, never the
//!   transaction's snapshot, so the check sees the token of every claimer that committed before
//!   the lock was granted, whatever the isolation level.
//! - The caller's writes follow in the same transaction, so they and the advance commit or roll
//!   back together (invariant 3), and since every fenced transaction of the scope holds the row
//!   from its claim to its commit, they are applied in token order.
//!
//! **Reads and REPEATABLE READ** (InnoDB's default): plain `SELECT`s read a snapshot taken at
//! the transaction's first plain read (not at `START TRANSACTION`). When the claim comes first,
//! that snapshot is taken after the claim, which waited for every older claimer's commit, so
//! the reads see their writes. A plain read made *before* the claim fixes the snapshot early,
//! and every later plain read of the transaction keeps returning that old data even after the
//! claim succeeds: a write computed from it loses an update. For the same reason never start a
//! fenced transaction `WITH CONSISTENT SNAPSHOT` (`TxOpts::with_consistent_snapshot`). Under
//! READ COMMITTED each statement reads the latest committed data, as in PostgreSQL.
//!
//! **First claimers of a new scope.** `SELECT ... FOR UPDATE` of a missing row followed by an
//! `INSERT` deadlocks under REPEATABLE READ: both claimers get the (shared) gap lock where the
//! row would be, and each one's insert waits for the other's. The upsert above avoids that: the
//! first claimer inserts the row, the others find it as a duplicate and queue for its exclusive
//! lock, and take the update path once the first commits. InnoDB can still report a deadlock
//! when locks are taken in different orders — a transaction claiming several scopes, the
//! caller's own rows, or a first claimer that rolls back its new row while several wait for it.
//! That is error 1213 (`ER_LOCK_DEADLOCK`): InnoDB has rolled back the whole transaction and
//! nothing was applied, so it is a retryable [`FenceError::Storage`]: run the transaction again
//! from its claim. A wait beyond `innodb_lock_wait_timeout` is error 1205, also
//! [`FenceError::Storage`] (only the statement was rolled back: roll back the transaction).
//! MariaDB with `innodb_snapshot_isolation=ON` (the default from 11.8) refuses a locking read of
//! a row changed after the transaction's snapshot with error 1020 — which only a read before the
//! claim can cause — also [`FenceError::Storage`].
//!
//! Durability is whatever the caller's transaction has (`innodb_flush_log_at_trx_commit`,
//! `sync_binlog`); the accepted maximum is exactly as durable as the data it protects. Commit
//! with [`commit`] to learn whether a failed commit left the outcome unknown.
//!
//! Scopes and lock names are `VARBINARY`, compared byte for byte: a collation would make
//! `"Jobs"` and `"jobs "` the same scope. Tokens and sessions are `BIGINT UNSIGNED`.

use mysql_async::prelude::Queryable;
use mysql_async::{Row, Transaction};
use palisade_core::limits::LOCK_NAME_BYTES_MAX;
use palisade_sequencer::VerifiedSequencer;

use crate::FenceError;
use crate::fence::{
    FenceState, Intent, LockBinding, SCOPE_BYTES_MAX, assert_advance, check, precheck,
    stored_holder, stored_state, validate_scope,
};

// The column widths of `create_table_sql` are these limits.
const _: () = assert!(SCOPE_BYTES_MAX == 512 && LOCK_NAME_BYTES_MAX == 256);

/// The DDL of the fence table.
pub fn create_table_sql() -> &'static str {
    "CREATE TABLE IF NOT EXISTS palisade_fence (
        scope VARBINARY(512) NOT NULL PRIMARY KEY,
        lock_name VARBINARY(256) NOT NULL,
        token_max BIGINT UNSIGNED NOT NULL CHECK (token_max >= 1),
        holder_session BIGINT UNSIGNED NOT NULL,
        updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
    ) ENGINE = InnoDB"
}

/// Creates the fence table if it does not exist; safe to run from many processes at once.
///
/// Run it outside a transaction: MySQL commits the open transaction before any DDL.
pub async fn ensure_schema(conn: &mut impl Queryable) -> Result<(), FenceError> {
    conn.query_drop(create_table_sql()).await.map_err(storage)
}

const LOCK_ROW_SQL: &str =
    "INSERT INTO palisade_fence (scope, lock_name, token_max, holder_session) VALUES (?, ?, ?, ?)
    ON DUPLICATE KEY UPDATE scope = scope";

const SELECT_FOR_UPDATE_SQL: &str =
    "SELECT lock_name, token_max, holder_session FROM palisade_fence WHERE scope = ? FOR UPDATE";

const SELECT_SQL: &str =
    "SELECT lock_name, token_max, holder_session FROM palisade_fence WHERE scope = ?";

const ADVANCE_SQL: &str = "UPDATE palisade_fence
    SET token_max = ?, holder_session = ?, updated_at = CURRENT_TIMESTAMP(6) WHERE scope = ?";

/// Claims `scope` for `sequencer` inside `txn`, for a transaction that writes: checks the
/// sequencer and advances the scope's accepted token to it, or refuses it ([`FenceError::Stale`],
/// [`FenceError::WrongLock`], and a shared grant as [`FenceError::SharedWrite`]; a reader's
/// transaction claims with [`claim_read`]).
///
/// Call it first in the transaction, before its reads (see the module docs): once it returns,
/// no older grant can commit to the scope, and the scope's row stays locked until `txn` ends.
/// On `Err`, roll the transaction back. Claiming again with the same sequencer is accepted, so
/// a claim-only transaction (claim, read, commit) orders a read on its own.
pub async fn claim(
    txn: &mut Transaction<'_>,
    scope: &str,
    sequencer: &VerifiedSequencer,
) -> Result<(), FenceError> {
    claim_expecting(txn, scope, sequencer, LockBinding::BindOnFirstWrite).await
}

/// [`claim`] for a transaction that only reads: any grant may, a shared one (a reader of a
/// read-write lock) included. The transaction must not write: the fence cannot see what follows.
pub async fn claim_read(
    txn: &mut Transaction<'_>,
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
    .await
}

/// [`claim`], refusing sequencers of any lock but the one `binding` names.
pub async fn claim_expecting(
    txn: &mut Transaction<'_>,
    scope: &str,
    sequencer: &VerifiedSequencer,
    binding: LockBinding<'_>,
) -> Result<(), FenceError> {
    claim_with(txn, scope, sequencer, binding, Intent::Write).await
}

/// The claim with everything said: the binding the scope must have and what the transaction
/// does ([`Intent::Write`] refuses a shared grant as [`FenceError::SharedWrite`]).
pub async fn claim_with(
    txn: &mut Transaction<'_>,
    scope: &str,
    sequencer: &VerifiedSequencer,
    binding: LockBinding<'_>,
    intent: Intent,
) -> Result<(), FenceError> {
    validate_scope(scope)?;
    // The expected binding and a shared write do not depend on stored state: refuse before
    // touching the database.
    precheck(binding, sequencer, intent)?;
    if sequencer.binding().len() > LOCK_NAME_BYTES_MAX {
        return Err(FenceError::invalid_request(format!(
            "the binding of {} of lock {:?} is {} bytes, more than the {LOCK_NAME_BYTES_MAX} of \
             the lock_name column: use a lock name of at most {} bytes for a semaphore fenced \
             in MySQL",
            sequencer.access(),
            sequencer.lock(),
            sequencer.binding().len(),
            LOCK_NAME_BYTES_MAX - 5
        )));
    }
    // Lock the scope's row exclusively, creating it with this sequencer's state if it is new
    // (a first claim is always accepted).
    txn.exec_drop(
        LOCK_ROW_SQL,
        (
            scope.as_bytes(),
            sequencer.binding().as_bytes(),
            sequencer.token().get(),
            stored_holder(sequencer).get(),
        ),
    )
    .await
    .map_err(storage)?;
    let row: Option<Row> = txn
        .exec_first(SELECT_FOR_UPDATE_SQL, (scope.as_bytes(),))
        .await
        .map_err(storage)?;
    let Some(row) = row else {
        return Err(FenceError::Corrupt {
            scope: scope.to_owned(),
            message: "the fence row was locked but cannot be read".into(),
        });
    };
    let stored = decode(scope, row)?;
    let next = check(Some(&stored), binding, sequencer, intent)?;
    if next == stored {
        return Ok(());
    }
    // Pair of the check's assertion, where the state is persisted: never backwards.
    assert_advance(Some(&stored), &next);
    txn.exec_drop(
        ADVANCE_SQL,
        (
            next.token_max.get(),
            next.holder_session.get(),
            scope.as_bytes(),
        ),
    )
    .await
    .map_err(storage)?;
    match txn.affected_rows() {
        1 => Ok(()),
        rows => Err(FenceError::Corrupt {
            scope: scope.to_owned(),
            message: format!("advancing the locked fence row changed {rows} rows, not 1"),
        }),
    }
}

/// Commits `txn`, the claim and the caller's writes together.
///
/// Only server errors that mean the transaction rolled back are [`FenceError::Storage`]: a
/// deadlock (1213), a lock wait timeout (1205), and a failed binary-log write that rolled it
/// back (1180, 1181). Anything else — the connection failed, or the server killed the query
/// during the commit — is [`FenceError::OutcomeUnknown`]: it may or may not have committed.
pub async fn commit(txn: Transaction<'_>) -> Result<(), FenceError> {
    txn.commit().await.map_err(|error| match error {
        mysql_async::Error::Server(ref server) if ROLLED_BACK.contains(&server.code) => {
            storage(error)
        }
        other => FenceError::OutcomeUnknown {
            message: format!("mysql commit failed, it may or may not have committed: {other}"),
        },
    })
}

/// Server errors of a COMMIT after which the transaction is known to have rolled back.
const ROLLED_BACK: [u16; 4] = [1213, 1205, 1180, 1181];

/// The state of `scope` as a plain read of `conn` sees it (its snapshot, inside a
/// transaction), if any sequencer was accepted.
pub async fn fence_state(
    conn: &mut impl Queryable,
    scope: &str,
) -> Result<Option<FenceState>, FenceError> {
    validate_scope(scope)?;
    let row: Option<Row> = conn
        .exec_first(SELECT_SQL, (scope.as_bytes(),))
        .await
        .map_err(storage)?;
    row.map(|row| decode(scope, row)).transpose()
}

fn decode(scope: &str, mut row: Row) -> Result<FenceState, FenceError> {
    let corrupt = |message: String| FenceError::Corrupt {
        scope: scope.to_owned(),
        message,
    };
    let lock: Vec<u8> = take(&mut row, 0).map_err(corrupt)?;
    let token_max: u64 = take(&mut row, 1).map_err(corrupt)?;
    let holder_session: u64 = take(&mut row, 2).map_err(corrupt)?;
    let lock =
        String::from_utf8(lock).map_err(|_| corrupt("the stored lock name is not UTF-8".into()))?;
    stored_state(scope, lock, token_max.into(), holder_session)
}

fn take<T: mysql_async::prelude::FromValue>(row: &mut Row, index: usize) -> Result<T, String> {
    match row.take_opt::<T, usize>(index) {
        Some(Ok(value)) => Ok(value),
        Some(Err(error)) => Err(format!("column {index} has an unexpected value: {error}")),
        None => Err(format!("column {index} is missing")),
    }
}

fn storage(error: mysql_async::Error) -> FenceError {
    let message = match &error {
        mysql_async::Error::Server(server) => format!(
            "mysql error {} ({}): {}",
            server.code, server.state, server.message
        ),
        other => format!("mysql error: {other}"),
    };
    FenceError::Storage { message }
}
