//! A fence for an embedded redb database: the accepted maximum lives in a table of the same
//! database as the caller's data.
//!
//! Atomicity: redb runs one write transaction at a time. [`RedbFence::begin`] opens a write
//! transaction, reads the scope's [`FenceState`], checks the sequencer and writes the advanced
//! state, then hands the same transaction to the caller for its own writes. The check, the
//! caller's writes and the advance become visible and durable together at
//! [`FencedTxn::commit`]; dropping the [`FencedTxn`] aborts all of them. No other writer can run
//! between the check and the commit, so no older token can slip in between.
//!
//! Durability: every fenced transaction commits with [`redb::Durability::Immediate`] (fsync before
//! `commit` returns), so the accepted maximum survives a crash exactly when the data does.
//!
//! **Architecture Invariant:** callers never write [`FENCE_TABLE`] themselves.

use std::path::Path;

use palisade_sequencer::VerifiedSequencer;
use redb::{
    Database, Durability, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction,
};

use crate::FenceError;
use crate::fence::{
    FenceState, Intent, LockBinding, assert_advance, check, stored_state, validate_scope,
};

/// The table holding each scope's state: scope → (token_max, holder_session, lock).
pub const FENCE_TABLE: TableDefinition<'static, &str, (u64, u64, &str)> =
    TableDefinition::new("palisade_fence");

/// [`FENCE_TABLE`] opened in a write transaction.
pub type FenceTable<'txn> = redb::Table<'txn, &'static str, (u64, u64, &'static str)>;

/// Fences writes to a redb database, per scope.
#[derive(Debug)]
pub struct RedbFence {
    db: Database,
    expected_lock: Option<String>,
}

impl RedbFence {
    /// Fences `db`; each scope is bound to the lock of its first accepted writer.
    pub fn new(db: Database) -> RedbFence {
        RedbFence {
            db,
            expected_lock: None,
        }
    }

    /// Creates or opens the database file at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<RedbFence, FenceError> {
        Ok(RedbFence::new(
            Database::create(path).map_err(FenceError::storage)?,
        ))
    }

    /// Accepts sequencers of `lock` only, in every scope.
    pub fn expecting_lock(mut self, lock: impl Into<String>) -> RedbFence {
        self.expected_lock = Some(lock.into());
        self
    }

    /// The database, for unfenced reads.
    pub fn database(&self) -> &Database {
        &self.db
    }

    /// Opens a write transaction, checks `sequencer` against `scope` and advances the scope's
    /// accepted token inside it, and returns the transaction for the caller's writes.
    ///
    /// Blocks while another write transaction of this database is open. On a rejection the
    /// transaction is aborted and nothing was written. A shared grant (a reader) is refused as
    /// [`FenceError::SharedWrite`]: a reader claims with [`RedbFence::begin_read`].
    pub fn begin(
        &self,
        sequencer: &VerifiedSequencer,
        scope: &str,
    ) -> Result<FencedTxn, FenceError> {
        self.begin_with(sequencer, scope, Intent::Write)
    }

    /// [`RedbFence::begin`] for a claim before reads: any grant may, a shared one included. The
    /// caller must only read in the returned transaction; the fence cannot see what follows.
    pub fn begin_read(
        &self,
        sequencer: &VerifiedSequencer,
        scope: &str,
    ) -> Result<FencedTxn, FenceError> {
        self.begin_with(sequencer, scope, Intent::Read)
    }

    /// [`RedbFence::begin`] with the intent said: [`Intent::Write`] as `begin`,
    /// [`Intent::Read`] as `begin_read`.
    pub fn begin_with(
        &self,
        sequencer: &VerifiedSequencer,
        scope: &str,
        intent: Intent,
    ) -> Result<FencedTxn, FenceError> {
        let mut txn = self.db.begin_write().map_err(FenceError::storage)?;
        txn.set_durability(Durability::Immediate)
            .map_err(FenceError::storage)?;
        let advance = self.check_in(&txn, sequencer, scope, intent)?;
        advance.write(&txn)?;
        Ok(FencedTxn {
            txn,
            previous: advance.previous,
            state: advance.next,
        })
    }

    /// Checks `sequencer` against `scope` for `intent` inside the caller's own write transaction,
    /// and writes nothing: the caller validates the rest of its request, then applies the
    /// returned [`Advance`] with [`Advance::write`] in the same transaction, before or after
    /// its own writes, and commits them together. A refusal leaves `txn` untouched.
    ///
    /// This is how several fenced requests share one commit (group commit): each is checked
    /// against the state the earlier ones left in the transaction.
    pub fn check_in(
        &self,
        txn: &WriteTransaction,
        sequencer: &VerifiedSequencer,
        scope: &str,
        intent: Intent,
    ) -> Result<Advance, FenceError> {
        validate_scope(scope)?;
        let table = txn.open_table(FENCE_TABLE).map_err(FenceError::storage)?;
        self.check_in_table(&table, sequencer, scope, intent)
    }

    /// [`RedbFence::check_in`] against [`FENCE_TABLE`] as already opened in the caller's write
    /// transaction: a caller checking many sequencers in one transaction (the store's group
    /// commit) opens the table once, not once per sequencer. Pair it with
    /// [`Advance::write_to`] on the same table.
    pub fn check_in_table(
        &self,
        table: &FenceTable<'_>,
        sequencer: &VerifiedSequencer,
        scope: &str,
        intent: Intent,
    ) -> Result<Advance, FenceError> {
        validate_scope(scope)?;
        let previous = match table.get(scope).map_err(FenceError::storage)? {
            Some(stored) => Some(decode(scope, stored.value())?),
            None => None,
        };
        let binding = match &self.expected_lock {
            Some(lock) => LockBinding::Expect(lock),
            None => LockBinding::BindOnFirstWrite,
        };
        let next = check(previous.as_ref(), binding, sequencer, intent)?;
        assert_advance(previous.as_ref(), &next);
        Ok(Advance {
            scope: scope.to_owned(),
            previous,
            next,
        })
    }

    /// The state of `scope` as last committed, if any write was accepted.
    pub fn fence_state(&self, scope: &str) -> Result<Option<FenceState>, FenceError> {
        validate_scope(scope)?;
        let txn = self.db.begin_read().map_err(FenceError::storage)?;
        let table = match txn.open_table(FENCE_TABLE) {
            Ok(table) => table,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(error) => return Err(FenceError::storage(error)),
        };
        match table.get(scope).map_err(FenceError::storage)? {
            Some(stored) => Ok(Some(decode(scope, stored.value())?)),
            None => Ok(None),
        }
    }
}

fn decode(
    scope: &str,
    (token_max, holder_session, lock): (u64, u64, &str),
) -> Result<FenceState, FenceError> {
    stored_state(scope, lock.to_owned(), token_max.into(), holder_session)
}

/// An accepted sequencer's effect on its scope, not yet written: see [`RedbFence::check_in`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "an accepted sequencer advances the scope only once the advance is written"]
pub struct Advance {
    scope: String,
    previous: Option<FenceState>,
    next: FenceState,
}

impl Advance {
    /// The scope's state before, if any sequencer was accepted before.
    pub fn previous(&self) -> Option<&FenceState> {
        self.previous.as_ref()
    }

    /// The scope's state once the advance is written.
    pub fn state(&self) -> &FenceState {
        &self.next
    }

    /// Whether writing it changes the stored state (false when the token was already the
    /// accepted maximum, of the same session).
    pub fn changes(&self) -> bool {
        self.previous.as_ref() != Some(&self.next)
    }

    /// Writes the advanced state into `txn`, the transaction it was checked in. Returns
    /// whether anything was written.
    pub fn write(&self, txn: &WriteTransaction) -> Result<bool, FenceError> {
        if !self.changes() {
            return Ok(false);
        }
        let mut table = txn.open_table(FENCE_TABLE).map_err(FenceError::storage)?;
        self.write_to(&mut table)
    }

    /// [`Advance::write`] into [`FENCE_TABLE`] as opened in the transaction it was checked in
    /// (see [`RedbFence::check_in_table`]).
    pub fn write_to(&self, table: &mut FenceTable<'_>) -> Result<bool, FenceError> {
        if !self.changes() {
            return Ok(false);
        }
        // Pair of the check's assertion, where the state is persisted: never backwards.
        assert_advance(self.previous.as_ref(), &self.next);
        table
            .insert(
                self.scope.as_str(),
                (
                    self.next.token_max.get(),
                    self.next.holder_session.get(),
                    self.next.lock.as_str(),
                ),
            )
            .map_err(FenceError::storage)?;
        Ok(true)
    }
}

/// A write transaction in which the sequencer was accepted and the scope's token advanced.
///
/// Do the fenced writes through [`FencedTxn::txn`], then [`FencedTxn::commit`]. Dropping it
/// aborts the writes and the advance together.
pub struct FencedTxn {
    txn: WriteTransaction,
    previous: Option<FenceState>,
    state: FenceState,
}

impl std::fmt::Debug for FencedTxn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FencedTxn")
            .field("previous", &self.previous)
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl FencedTxn {
    /// The transaction, for the caller's own tables.
    pub fn txn(&self) -> &WriteTransaction {
        &self.txn
    }

    /// The scope's state as it will be after commit.
    pub fn state(&self) -> &FenceState {
        &self.state
    }

    /// The scope's state before this transaction, if any write was accepted before.
    pub fn previous(&self) -> Option<&FenceState> {
        self.previous.as_ref()
    }

    /// Commits the caller's writes and the advanced token, durably.
    ///
    /// A failed commit is [`FenceError::OutcomeUnknown`]: redb may have failed in its final
    /// fsync, after which the write may or may not be durable.
    pub fn commit(self) -> Result<(), FenceError> {
        self.txn
            .commit()
            .map_err(|error| FenceError::OutcomeUnknown {
                message: format!("redb commit failed: {error}"),
            })
    }

    /// Discards the caller's writes and the advance.
    pub fn abort(self) -> Result<(), FenceError> {
        self.txn.abort().map_err(FenceError::storage)
    }
}
