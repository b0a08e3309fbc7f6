//! A fence inside the caller's PostgreSQL transaction.
//!
//! **Claim first, then read, then write.** [`claim`] is the first statement of the caller's
//! transaction, before its reads, not just before its writes:
//!
//! ```text
//! BEGIN; claim(scope, sequencer); SELECT ...; UPDATE ...; COMMIT  -- claim::commit, below
//! ```
//!
//! Once [`claim`] returns, no older grant can commit to the scope, and this transaction holds
//! the scope's fence row until it ends, so every read that follows sees the last write of every
//! older grant and nothing an older grant writes later. A read made *before* the claim is not
//! ordered: under READ COMMITTED it can return a value that an older holder, still inside its
//! own transaction, is about to overwrite, and the write computed from it then loses that
//! update even though the claim succeeds. A holder that reads in one transaction and writes in a
//! later one claims in both: the later claim is refused as [`FenceError::Stale`] if a newer grant
//! claimed in between, so a decision made on data the newer holder may have changed is never
//! written.
//!
//! The accepted maximum of each scope is a row of `palisade_fence` ([`create_table_sql`]).
//! [`claim`] runs one statement in the caller's transaction:
//!
//! ```sql
//! INSERT INTO palisade_fence AS fence (scope, lock_name, token_max, holder_session)
//! VALUES ($1, $2, $3, $4)
//! ON CONFLICT (scope) DO UPDATE SET token_max = EXCLUDED.token_max, ...
//!   WHERE fence.lock_name = EXCLUDED.lock_name
//!     AND (fence.token_max < EXCLUDED.token_max
//!       OR (fence.token_max = EXCLUDED.token_max AND fence.holder_session = EXCLUDED.holder_session))
//! RETURNING token_max
//! ```
//!
//! An equal token is accepted only from the session that presented it first: the same token from
//! another session means the lock service issued it twice, and is refused as
//! [`FenceError::TokenReissued`].
//!
//! Atomicity: `ON CONFLICT DO UPDATE` locks the scope's row whether or not its `WHERE` holds, and
//! the lock is held until the caller's transaction ends. A concurrent claimer of the same scope
//! blocks on that row until then, and under READ COMMITTED it re-evaluates the `WHERE` against the
//! committed row — so it sees our advanced token and is refused if older. Two first claimers of
//! a new scope race on the primary key: the second waits for the first's commit and takes the
//! conflict path (no duplicate-key error under READ COMMITTED). The caller's reads and writes
//! follow in the same transaction, so its writes and the advance commit or roll back together
//! (invariant 3), and since every fenced transaction of the scope holds the row lock from its
//! claim to its commit, transactions of one scope run one after another, in token order.
//! Under REPEATABLE READ or SERIALIZABLE the snapshot is taken at the transaction's first
//! statement, the claim; a concurrent update of the fence row makes PostgreSQL abort with a
//! serialization failure instead, which surfaces as a retryable [`FenceError::Storage`].
//!
//! Durability is whatever the caller's transaction has (`synchronous_commit`); the accepted
//! maximum is exactly as durable as the data it protects. Commit with [`commit`] to learn
//! whether a failed commit left the outcome unknown.
//!
//! `holder_session` is a `u64` stored bit-for-bit in a `bigint`.
//!
//! The table name is not schema-qualified, so PostgreSQL resolves `palisade_fence` through the
//! session's `search_path`, which lets a deployment keep it in the schema of its choice. It
//! also means that a role able to create tables in a schema that comes earlier in the
//! `search_path` than the real table's (`"$user"`, or `public` where every role may create in
//! it, as before PostgreSQL 15) can put a `palisade_fence` of its own in front of it and decide
//! what the fence accepts. Keep the fence table in a schema only trusted roles can create in:
//! `REVOKE CREATE ON SCHEMA public FROM PUBLIC` (the default since PostgreSQL 15), or give the
//! writers' roles a fixed `search_path` (`ALTER ROLE ... SET search_path = app`) with no schema
//! others can write to before it.

use palisade_sequencer::VerifiedSequencer;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;
use tokio_postgres::{GenericClient, Row, Transaction};

use crate::FenceError;
use crate::fence::{
    FenceState, Intent, LockBinding, confirm_advanced, explain_refusal, precheck, stored_holder,
    stored_state, validate_scope,
};

/// The DDL of the fence table.
pub fn create_table_sql() -> &'static str {
    "CREATE TABLE IF NOT EXISTS palisade_fence (
        scope text PRIMARY KEY,
        lock_name text NOT NULL,
        token_max bigint NOT NULL CHECK (token_max >= 1),
        holder_session bigint NOT NULL,
        updated_at timestamptz NOT NULL DEFAULT now()
    )"
}

/// Creates the fence table if it does not exist; safe to run from many processes at once.
pub async fn ensure_schema(client: &impl GenericClient) -> Result<(), FenceError> {
    match client.batch_execute(create_table_sql()).await {
        Ok(()) => Ok(()),
        // Two concurrent `CREATE TABLE IF NOT EXISTS` can collide on the catalog; the loser
        // finds the table created by the winner.
        Err(error)
            if error.code() == Some(&SqlState::UNIQUE_VIOLATION)
                || error.code() == Some(&SqlState::DUPLICATE_TABLE) =>
        {
            Ok(())
        }
        Err(error) => Err(storage(error)),
    }
}

const ADVANCE_SQL: &str =
    "INSERT INTO palisade_fence AS fence (scope, lock_name, token_max, holder_session)
    VALUES ($1, $2, $3, $4)
    ON CONFLICT (scope) DO UPDATE
        SET token_max = EXCLUDED.token_max,
            holder_session = EXCLUDED.holder_session,
            updated_at = now()
        WHERE fence.lock_name = EXCLUDED.lock_name
            AND (fence.token_max < EXCLUDED.token_max
                OR (fence.token_max = EXCLUDED.token_max
                    AND fence.holder_session = EXCLUDED.holder_session))
    RETURNING token_max";

const SELECT_SQL: &str =
    "SELECT lock_name, token_max, holder_session FROM palisade_fence WHERE scope = $1";

/// Claims `scope` for `sequencer` inside `txn`, for a transaction that writes: checks the
/// sequencer and advances the scope's accepted token to it, or refuses it ([`FenceError::Stale`],
/// [`FenceError::WrongLock`], and a shared grant as [`FenceError::SharedWrite`]; a reader's
/// transaction claims with [`claim_read`]).
///
/// Call it first in the transaction, before its reads (see the module docs): once it returns,
/// no older grant can commit to the scope, and the scope's row stays locked until `txn` ends.
/// On `Err`, roll the transaction back (drop it). Claiming again with the same sequencer is
/// accepted, so a claim-only transaction (claim, read, commit) orders a read on its own.
pub async fn claim(
    txn: &Transaction<'_>,
    scope: &str,
    sequencer: &VerifiedSequencer,
) -> Result<(), FenceError> {
    claim_expecting(txn, scope, sequencer, LockBinding::BindOnFirstWrite).await
}

/// [`claim`] for a transaction that only reads: any grant may, a shared one (a reader of a
/// read-write lock) included. The transaction must not write: the fence cannot see what follows.
pub async fn claim_read(
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
    .await
}

/// [`claim`], refusing sequencers of any lock but the one `binding` names.
pub async fn claim_expecting(
    txn: &Transaction<'_>,
    scope: &str,
    sequencer: &VerifiedSequencer,
    binding: LockBinding<'_>,
) -> Result<(), FenceError> {
    claim_with(txn, scope, sequencer, binding, Intent::Write).await
}

/// The claim with everything said: the binding the scope must have and what the transaction
/// does ([`Intent::Write`] refuses a shared grant as [`FenceError::SharedWrite`]).
pub async fn claim_with(
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
    // `query_typed_opt` sends parse, bind and execute together: one round trip, no separate
    // prepare, which keeps the fence's cost to a fraction of the caller's own transaction.
    let advanced = txn
        .query_typed_opt(
            ADVANCE_SQL,
            &[
                (&scope, Type::TEXT),
                (&lock.as_ref(), Type::TEXT),
                (&token, Type::INT8),
                (&session, Type::INT8),
            ],
        )
        .await
        .map_err(storage)?;
    if let Some(row) = advanced {
        let stored: i64 = row.try_get(0).map_err(storage)?;
        return confirm_advanced(scope, stored, token);
    }
    // Refused. The row is locked by the upsert above, so this read sees what refused us.
    let row = txn
        .query_one(SELECT_SQL, &[&scope])
        .await
        .map_err(storage)?;
    let accepted = decode(scope, &row)?;
    Err(explain_refusal(scope, &accepted, sequencer, intent))
}

/// The committed state of `scope` (as visible to `client`'s snapshot), if any write was accepted.
pub async fn fence_state(
    client: &impl GenericClient,
    scope: &str,
) -> Result<Option<FenceState>, FenceError> {
    validate_scope(scope)?;
    match client
        .query_opt(SELECT_SQL, &[&scope])
        .await
        .map_err(storage)?
    {
        Some(row) => Ok(Some(decode(scope, &row)?)),
        None => Ok(None),
    }
}

/// Commits `txn`, the claim and the caller's writes together.
///
/// Only errors that mean the transaction rolled back are [`FenceError::Storage`]: a
/// serialization failure or deadlock (class 40) and a deferred constraint (class 23). Anything
/// else — the connection failed, or the server ended it during the commit (which, with
/// synchronous replication, can happen after the commit was already durable locally) — is
/// [`FenceError::OutcomeUnknown`]: it may or may not have committed.
pub async fn commit(txn: Transaction<'_>) -> Result<(), FenceError> {
    txn.commit().await.map_err(|error| {
        let rolled_back = error.as_db_error().is_some_and(|db| {
            let code = db.code().code();
            code.starts_with("40") || code.starts_with("23")
        });
        if rolled_back {
            storage(error)
        } else {
            FenceError::OutcomeUnknown {
                message: format!(
                    "postgresql commit failed, it may or may not have committed: {error}"
                ),
            }
        }
    })
}

fn decode(scope: &str, row: &Row) -> Result<FenceState, FenceError> {
    let lock: String = row.try_get(0).map_err(storage)?;
    let token_max: i64 = row.try_get(1).map_err(storage)?;
    let holder_session: i64 = row.try_get(2).map_err(storage)?;
    // `holder_session` is stored bit-for-bit (see the module docs).
    stored_state(scope, lock, token_max.into(), holder_session as u64)
}

fn storage(error: tokio_postgres::Error) -> FenceError {
    let message = match error.as_db_error() {
        Some(db) => format!("postgresql error {}: {}", db.code().code(), db.message()),
        None => format!("postgresql error: {error}"),
    };
    FenceError::Storage { message }
}
