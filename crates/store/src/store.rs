//! [`Store`]: the fenced key/value store itself, without HTTP — one redb file, fenced by
//! [`palisade_fence::RedbFence`].
//!
//! # Scope: the lock, and each key bound to one lock
//!
//! The fence scope of a write is **the sequencer's lock**: the store keeps one accepted maximum
//! per lock, in the fence table, and a write with token `t` of lock `L` is refused as stale if
//! any write of `L` with a larger token was ever accepted — whichever keys that write touched.
//! On top of that, **each key is bound to one lock**, and a sequencer of any other lock is
//! refused as `wrong_lock` (invariant 4): the lock the operator's [`Bindings`] give the key's
//! prefix when the store was opened with bindings (a key they do not cover is refused to
//! everyone as `unbound`), else the lock of the key's first fenced write — whoever holds any
//! lock first can then take a key, which is why bindings exist.
//!
//! Why per lock and not per key: once the store has seen token 9 of `jobs/nightly`, every grant
//! with an older token is known to be over, so anything it sends is a zombie write. With a
//! per-key scope, a holder paused past its lease could still write the keys the next holder
//! has not reached yet (`report.partial`, say); with the per-lock scope it cannot write any.
//! `palisade lock jobs/nightly -- palisade store put report "$(date)"` therefore protects every
//! key the job writes, with no per-key bookkeeping by the user. The price is none: a token of a
//! lock only grows when the previous grant ended, so no live holder is ever refused.
//!
//! Deleting a key leaves a tombstone that keeps its lock binding, and the lock's accepted
//! maximum lives in the fence table, untouched by deletes: deleting and re-writing a key never
//! lets an old token (or another lock) back in.
//!
//! # Reads are fenced too
//!
//! A write fence alone orders writes, not the holder's critical section: a holder paused
//! between its read and its write can still land the write after the next holder has *read*
//! the old value, and one of two increments is lost. So a read that presents a sequencer
//! ([`Store::read`]) is checked like a write and **advances** the lock's accepted token,
//! durably, before the value is returned: from the moment the new holder has looked, nothing of
//! an older grant lands. [`Store::claim`] does the same with no data at all, for a holder that
//! wants to announce itself before it starts. A read without a sequencer ([`Store::get`]) only
//! looks. A fenced read costs a durable write when it advances the token, and nothing more
//! than a read when the holder's token is already the accepted one (its later reads).
//!
//! # Revisions, compares and transactions
//!
//! The store keeps one revision counter. Every request that puts or deletes bumps it once, and
//! each key it wrote carries that revision ([`Entry::revision`]); a key with no value has
//! revision 0. A transaction ([`Store::txn`]) checks [`Compare`]s on revisions, values or
//! existence, then applies puts, deletes and gets in order, all or nothing, under one sequencer
//! check, like etcd's Txn. A put that names a revision (HTTP `If-Match`) is a one-key
//! transaction, so read-modify-write needs no lock-level claim to be safe either.
//!
//! # One commit for many requests
//!
//! Every request that changes the database goes through one writer thread (`writer.rs`),
//! which runs whatever is queued in one redb write transaction: the fence check and advance,
//! the key-binding checks, the writes and the request-id records of all of them commit
//! together with [`redb::Durability::Immediate`] (one fsync) before any caller hears "ok", or
//! not at all (invariant 3). A refused request writes nothing and does not disturb the others.
//!
//! # Retries
//!
//! A write may carry a request id. The acknowledgement of an accepted write is stored under
//! (a SHA-256 of the sequencer, request id) in the same transaction (the hash, so that the file
//! holds no sequencer a reader could write with); a retry with the same pair gets the stored
//! acknowledgement back (marked `replayed`) and is not applied again, even if a newer grant has
//! written since (invariant 8). The newest
//! [`REQUEST_IDS_RETAINED_MAX`](crate::limits::REQUEST_IDS_RETAINED_MAX) ids are kept.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use palisade_fence::{FenceStats, RedbFence, Verifier};
use palisade_sequencer::{KeySet, VerifiedSequencer};
use redb::{Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata};

use crate::StoreError;
use crate::bindings::Bindings;
use crate::limits::{
    BATCH_OPS_MAX, COMPARES_MAX, KEY_BYTES_MAX, REQUEST_ID_BYTES_MAX, VALUE_BYTES_MAX,
};
use crate::quota::{LockQuota, Quotas};
use crate::schema::{
    KV_TABLE, KV_TABLE_V1, META_TABLE, REQUEST_KEY_PREFIX, REQUEST_ORDER_TABLE, REQUESTS_TABLE,
    REVISION_KEY, request_key,
};
use crate::types::{BatchOp, BatchRequest, ClaimAck, Compare, Entry, FenceView, WriteAck};
use crate::writer::{Done, Row, Work, Writer};

/// The name of the database file inside the data directory.
pub const DATABASE_FILE_NAME: &str = "store.redb";

/// What the operator sets when opening a store ([`Store::open_with`]).
#[derive(Debug, Clone, Default)]
pub struct StoreOptions {
    /// The keys each lock may write (see [`Bindings`]); `None`: each key goes to the lock of its
    /// first fenced write.
    pub bindings: Option<Bindings>,
    /// How much each lock's keys may hold (see [`crate::quota`]); no limit by default.
    pub quota: LockQuota,
}

/// The fenced store: a redb database in a data directory, and the lock service's public key.
///
/// The plain methods block (on the group's fsync); call them from a blocking thread in async
/// code, or use the `_async` forms, which wait without holding a thread.
#[derive(Debug)]
pub struct Store {
    // Declared first so it is dropped first: it joins the writer thread, which holds the
    // database, before the rest goes.
    writer: Writer,
    fence: Arc<RedbFence>,
    path: PathBuf,
    /// Checks sequencers once each; a holder's many writes pay for one signature check.
    verifier: Verifier,
    /// What the fence accepted and refused, per lock.
    stats: FenceStats,
}

/// The counter of fenced requests (writes, fenced reads, claims) the store accepted, by `lock`
/// (bounded: see [`FenceStats`]).
pub const FENCE_ACCEPTED_METRIC: &str = "palisade_store_fence_accepted_total";
/// The counter of fenced requests the store refused, by `lock` and `kind` (`stale`,
/// `token_reissued`, `wrong_lock`, `missing`, `malformed`, `forged`).
pub const FENCE_REFUSED_METRIC: &str = "palisade_store_fence_refused_total";

/// Describes the store's metrics to the installed recorder (`palisade store serve
/// --metrics-listen`).
pub fn describe_metrics() {
    metrics::describe_counter!(
        FENCE_ACCEPTED_METRIC,
        "Fenced writes, fenced reads and claims the store's fence accepted, by lock"
    );
    metrics::describe_counter!(
        FENCE_REFUSED_METRIC,
        "Fenced requests the store's fence refused, by lock and kind (stale, token_reissued, wrong_lock, missing, malformed, forged)"
    );
}

impl Store {
    /// Opens (or creates) the store in `dir`, verifying sequencers with `public_keys` (a
    /// [`KeySet`], or one [`palisade_sequencer::PublicKey`]). `dir` is left with mode 0700 and
    /// the database file with 0600, new or found ([`DATA_DIR_MODE`], [`DATABASE_FILE_MODE`]).
    ///
    /// Fails if another process has the store open.
    pub fn open(
        dir: impl AsRef<Path>,
        public_keys: impl Into<KeySet>,
    ) -> Result<Store, StoreError> {
        Store::open_with(dir, public_keys, StoreOptions::default())
    }

    /// [`Store::open`], with the operator's [`StoreOptions`]: bindings and per-lock quotas.
    /// With a quota, every lock's use is counted from the database here, once.
    pub fn open_with(
        dir: impl AsRef<Path>,
        public_keys: impl Into<KeySet>,
        options: StoreOptions,
    ) -> Result<Store, StoreError> {
        let dir = dir.as_ref();
        create_data_dir(dir).map_err(|error| StoreError::Storage {
            message: format!("cannot create data directory {}: {error}", dir.display()),
        })?;
        let path = dir.join(DATABASE_FILE_NAME);
        create_database_file(&path).map_err(|error| StoreError::Storage {
            message: format!("cannot create {}: {error}", path.display()),
        })?;
        let db = Database::create(&path).map_err(|error| StoreError::Storage {
            message: format!("cannot open {}: {error}", path.display()),
        })?;
        // Create the tables once, so readers never see "table does not exist".
        let mut txn = db.begin_write()?;
        txn.set_durability(Durability::Immediate)?;
        txn.open_table(KV_TABLE)?;
        txn.open_table(META_TABLE)?;
        txn.open_table(REQUESTS_TABLE)?;
        txn.open_table(REQUEST_ORDER_TABLE)?;
        txn.open_table(palisade_fence::redb::FENCE_TABLE)?;
        migrate_v1(&txn)?;
        hash_request_keys(&txn)?;
        let quotas = if options.quota.is_limited() {
            Some(Quotas::load(options.quota, &txn)?)
        } else {
            None
        };
        txn.commit()?;
        let fence = Arc::new(RedbFence::new(db));
        Ok(Store {
            writer: Writer::start(fence.clone(), options.bindings.map(Arc::new), quotas)?,
            fence,
            verifier: Verifier::new(public_keys),
            stats: FenceStats::new(),
            path,
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The keys sequencers are verified with.
    pub fn public_keys(&self) -> KeySet {
        self.verifier.keys()
    }

    /// Verifies sequencers with `keys` from now on (see [`Verifier::set_keys`]).
    pub fn set_public_keys(&self, keys: KeySet) {
        self.verifier.set_keys(keys);
    }

    /// Sets `key` to `value` if `sequencer` is the current grant of the key's lock.
    ///
    /// Returns only after the write is durable.
    pub fn put(
        &self,
        sequencer: Option<&str>,
        key: &str,
        value: &[u8],
        request_id: Option<&str>,
    ) -> Result<WriteAck, StoreError> {
        self.txn_owned(
            sequencer,
            BatchRequest {
                compare: Vec::new(),
                ops: vec![BatchOp::Put {
                    key: key.to_owned(),
                    value: value.to_vec(),
                }],
            },
            request_id,
        )
    }

    /// Deletes `key` (leaving a tombstone bound to its lock) if `sequencer` is the current
    /// grant of the key's lock. Deleting a key that does not exist succeeds with
    /// `existed: false`.
    pub fn delete(
        &self,
        sequencer: Option<&str>,
        key: &str,
        request_id: Option<&str>,
    ) -> Result<WriteAck, StoreError> {
        self.txn_owned(
            sequencer,
            BatchRequest {
                compare: Vec::new(),
                ops: vec![BatchOp::Delete {
                    key: key.to_owned(),
                }],
            },
            request_id,
        )
    }

    /// Applies `ops` in order as one fenced unit: one check of the sequencer, and either every
    /// operation is applied, durably, or none is.
    pub fn batch(
        &self,
        sequencer: Option<&str>,
        ops: &[BatchOp],
        request_id: Option<&str>,
    ) -> Result<WriteAck, StoreError> {
        self.txn_owned(
            sequencer,
            BatchRequest {
                compare: Vec::new(),
                ops: ops.to_vec(),
            },
            request_id,
        )
    }

    /// A transaction: if `sequencer` is the current grant and every compare of `request`
    /// holds, applies its operations in order, all or nothing, durably. A compare that does
    /// not hold is [`StoreError::CompareFailed`], and nothing — not even the token — changed.
    pub fn txn(
        &self,
        sequencer: Option<&str>,
        request: &BatchRequest,
        request_id: Option<&str>,
    ) -> Result<WriteAck, StoreError> {
        self.txn_owned(sequencer, request.clone(), request_id)
    }

    /// [`Store::txn`] of a request the caller built for it (a put, a delete, a batch): moved
    /// into the writer's job, not copied.
    fn txn_owned(
        &self,
        sequencer: Option<&str>,
        request: BatchRequest,
        request_id: Option<&str>,
    ) -> Result<WriteAck, StoreError> {
        let outcome = self
            .txn_work(sequencer, request, request_id)
            .and_then(|work| expect_write(self.writer.submit_blocking(work)?));
        self.counted(sequencer, outcome)
    }

    /// [`Store::txn`] for async callers.
    pub async fn txn_async(
        &self,
        sequencer: Option<&str>,
        request: &BatchRequest,
        request_id: Option<&str>,
    ) -> Result<WriteAck, StoreError> {
        let outcome = match self.txn_work(sequencer, request.clone(), request_id) {
            Ok(work) => self.writer.submit(work).await.and_then(expect_write),
            Err(error) => Err(error),
        };
        self.counted(sequencer, outcome)
    }

    /// The current value of `key` and the grant that wrote it; `None` if the key was never
    /// written or is deleted. This read is not fenced: it only looks (see [`Store::read`]).
    pub fn get(&self, key: &str) -> Result<Option<Entry>, StoreError> {
        validate_key(key)?;
        let txn = self.fence.database().begin_read()?;
        let table = txn.open_table(KV_TABLE)?;
        let row = table.get(key)?.map(|row| Row::from_value(row.value()));
        Ok(row.and_then(|row| row.into_entry(key)))
    }

    /// A read of `key` by the holder of `sequencer`'s grant: refused like a write if the
    /// sequencer is stale, and otherwise the lock's accepted token is advanced to it, durably,
    /// before the value is returned — no older grant can write here after this. `None` as the
    /// sequencer only looks, like [`Store::get`].
    pub fn read(&self, sequencer: Option<&str>, key: &str) -> Result<Option<Entry>, StoreError> {
        match self.read_work(sequencer, key) {
            Ok(Some(work)) => {
                let outcome = self.writer.submit_blocking(work).and_then(expect_read);
                self.counted(sequencer, outcome)
            }
            Ok(None) => self.get(key),
            Err(error) => self.counted(sequencer, Err(error)),
        }
    }

    /// [`Store::read`] for async callers. An unfenced read still runs on the calling thread.
    pub async fn read_async(
        &self,
        sequencer: Option<&str>,
        key: &str,
    ) -> Result<Option<Entry>, StoreError> {
        match self.read_work(sequencer, key) {
            Ok(Some(work)) => {
                let outcome = self.writer.submit(work).await.and_then(expect_read);
                self.counted(sequencer, outcome)
            }
            Ok(None) => self.get(key),
            Err(error) => self.counted(sequencer, Err(error)),
        }
    }

    /// Announces `sequencer`'s grant: the lock's accepted token advances to it, durably, and
    /// nothing else changes. `lock`, if given, must be the sequencer's lock. Claiming again with
    /// the accepted token changes nothing (`advanced: false`).
    pub fn claim(
        &self,
        sequencer: Option<&str>,
        lock: Option<&str>,
    ) -> Result<ClaimAck, StoreError> {
        let outcome = self
            .claim_work(sequencer, lock)
            .and_then(|work| expect_claim(self.writer.submit_blocking(work)?));
        self.counted(sequencer, outcome)
    }

    /// [`Store::claim`] for async callers.
    pub async fn claim_async(
        &self,
        sequencer: Option<&str>,
        lock: Option<&str>,
    ) -> Result<ClaimAck, StoreError> {
        let outcome = match self.claim_work(sequencer, lock) {
            Ok(work) => self.writer.submit(work).await.and_then(expect_claim),
            Err(error) => Err(error),
        };
        self.counted(sequencer, outcome)
    }

    /// What the store has accepted for `lock`.
    pub fn fence_state(&self, lock: &str) -> Result<FenceView, StoreError> {
        let state = self.fence.fence_state(lock)?;
        Ok(FenceView {
            lock: lock.to_owned(),
            token_max: state.as_ref().map(|state| state.token_max.get()),
            holder_session: state.as_ref().map(|state| state.holder_session.get()),
        })
    }

    /// The store's revision: that of its latest write (0 for a store never written).
    pub fn revision(&self) -> Result<u64, StoreError> {
        let txn = self.fence.database().begin_read()?;
        let meta = txn.open_table(META_TABLE)?;
        Ok(meta.get(REVISION_KEY)?.map_or(0, |value| value.value()))
    }

    /// Checks that the database can be read.
    pub fn health(&self) -> Result<(), StoreError> {
        let txn = self.fence.database().begin_read()?;
        txn.open_table(KV_TABLE)?;
        Ok(())
    }

    /// **Benchmark only — never use it to store data.** The write path of [`Store::put`]
    /// without the fence: no sequencer, no check, no advance, no key binding; the same row
    /// shape, durability and group commit, into a separate table that [`Store::get`] never
    /// reads. It exists to measure what the fence costs a write, and only with the `bench`
    /// feature (which `palisade-bench` turns on).
    #[cfg(feature = "bench")]
    #[doc(hidden)]
    pub fn put_unfenced(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        validate_key(key)?;
        validate_value(value)?;
        self.writer.submit_blocking(Work::UnfencedPut {
            key: key.to_owned(),
            value: value.to_vec(),
        })?;
        Ok(())
    }

    /// [`Store::put_unfenced`] for async callers. **Benchmark only.**
    #[cfg(feature = "bench")]
    #[doc(hidden)]
    pub async fn put_unfenced_async(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        validate_key(key)?;
        validate_value(value)?;
        self.writer
            .submit(Work::UnfencedPut {
                key: key.to_owned(),
                value: value.to_vec(),
            })
            .await?;
        Ok(())
    }

    /// Checks that `sequencer` (a write's `palisade-sequencer` header) is one the store
    /// accepts the form, key id and signature of, without looking at the fence: what the HTTP
    /// server checks before it reads a write's body. A write checks it again (from memory).
    pub fn check_sequencer(&self, sequencer: Option<&str>) -> Result<(), StoreError> {
        match self.verify(sequencer) {
            Ok(_) => Ok(()),
            // Refused here, the write never reaches the counting below: count it now.
            Err(refusal) => self.counted(sequencer, Err(refusal)),
        }
    }

    /// What the store's fence accepted and refused, per lock (also the metrics
    /// [`FENCE_ACCEPTED_METRIC`] and [`FENCE_REFUSED_METRIC`]). A key bound to no lock
    /// (`unbound`) is the operator's bindings refusing, not the fence, and is not counted.
    pub fn fence_stats(&self) -> &FenceStats {
        &self.stats
    }

    /// Counts the outcome of a fenced request presenting `sequencer`, and passes it on.
    fn counted<T>(
        &self,
        sequencer: Option<&str>,
        outcome: Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let fence_outcome = match &outcome {
            Ok(_) => Ok(()),
            Err(error) => match error.fence_refusal() {
                Some(refusal) => Err(refusal),
                None => return outcome,
            },
        };
        // A sequencer that verified is remembered: naming its lock costs a lookup.
        let verified = self.verifier.verify_shared(sequencer).ok();
        let lock = verified.as_ref().map(|sequencer| sequencer.lock());
        match (self.stats.record(lock, &fence_outcome), &fence_outcome) {
            (Some(label), Ok(())) => {
                metrics::counter!(FENCE_ACCEPTED_METRIC, "lock" => label.to_owned()).increment(1);
            }
            (Some(label), Err(refusal)) => {
                metrics::counter!(
                    FENCE_REFUSED_METRIC,
                    "lock" => label.to_owned(),
                    "kind" => refusal.kind()
                )
                .increment(1);
            }
            (None, _) => {}
        }
        outcome
    }

    fn verify(&self, sequencer: Option<&str>) -> Result<Arc<VerifiedSequencer>, StoreError> {
        Ok(self.verifier.verify_shared(sequencer)?)
    }

    fn txn_work(
        &self,
        sequencer: Option<&str>,
        request: BatchRequest,
        request_id: Option<&str>,
    ) -> Result<Work, StoreError> {
        validate_txn(&request)?;
        if let Some(request_id) = request_id {
            validate_request_id(request_id)?;
        }
        Ok(Work::Txn {
            sequencer: self.verify(sequencer)?,
            compare: request.compare,
            ops: request.ops,
            request_id: request_id.map(str::to_owned),
        })
    }

    fn read_work(&self, sequencer: Option<&str>, key: &str) -> Result<Option<Work>, StoreError> {
        validate_key(key)?;
        let Some(sequencer) = sequencer else {
            return Ok(None);
        };
        Ok(Some(Work::Read {
            sequencer: self.verify(Some(sequencer))?,
            key: key.to_owned(),
        }))
    }

    fn claim_work(&self, sequencer: Option<&str>, lock: Option<&str>) -> Result<Work, StoreError> {
        Ok(Work::Claim {
            sequencer: self.verify(sequencer)?,
            lock: lock.map(str::to_owned),
        })
    }
}

fn expect_write(done: Done) -> Result<WriteAck, StoreError> {
    match done {
        Done::Write(ack) => Ok(ack),
        other => unreachable!("a write answered {other:?}"),
    }
}

fn expect_claim(done: Done) -> Result<ClaimAck, StoreError> {
    match done {
        Done::Claim(ack) => Ok(ack),
        other => unreachable!("a claim answered {other:?}"),
    }
}

fn expect_read(done: Done) -> Result<Option<Entry>, StoreError> {
    match done {
        Done::Read(entry) => Ok(entry),
        other => unreachable!("a read answered {other:?}"),
    }
}

/// Moves the rows of a store written before revisions existed into [`KV_TABLE`], in key order,
/// each with a revision of its own, inside the caller's transaction (so the move is atomic).
fn migrate_v1(txn: &redb::WriteTransaction) -> Result<(), StoreError> {
    let rows = {
        let old = txn.open_table(KV_TABLE_V1)?;
        if old.is_empty()? {
            Vec::new()
        } else {
            let mut rows = Vec::new();
            for row in old.iter()? {
                let (key, value) = row?;
                let (lock, token, session, live, data) = value.value();
                rows.push((
                    key.value().to_owned(),
                    (lock.to_owned(), token, session, live, data.to_vec()),
                ));
            }
            rows
        }
    };
    if rows.is_empty() {
        txn.delete_table(KV_TABLE_V1)?;
        return Ok(());
    }
    let mut meta = txn.open_table(META_TABLE)?;
    let mut revision = meta.get(REVISION_KEY)?.map_or(0, |value| value.value());
    let mut table = txn.open_table(KV_TABLE)?;
    for (key, (lock, token, session, live, data)) in &rows {
        revision += 1;
        table.insert(
            key.as_str(),
            (
                lock.as_str(),
                *token,
                *session,
                *live,
                revision,
                data.as_slice(),
            ),
        )?;
    }
    meta.insert(REVISION_KEY, revision)?;
    drop((table, meta));
    txn.delete_table(KV_TABLE_V1)?;
    Ok(())
}

/// Permissions of the store's data directory: owner only, as the lock service's own.
pub const DATA_DIR_MODE: u32 = 0o700;

/// Permissions of `store.redb`: owner only. It holds every value, and a reader must not learn
/// more than the store's HTTP API shows.
pub const DATABASE_FILE_MODE: u32 = 0o600;

/// Creates `dir` if needed and leaves it, new or found, with [`DATA_DIR_MODE`], whatever the
/// umask.
fn create_data_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    #[cfg(unix)]
    restrict(dir, DATA_DIR_MODE)?;
    Ok(())
}

/// Creates the database file empty with [`DATABASE_FILE_MODE`] if it does not exist (redb fills
/// an empty file), and narrows the mode of one that does.
fn create_database_file(path: &Path) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(false);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, DATABASE_FILE_MODE);
    drop(options.open(path)?);
    #[cfg(unix)]
    restrict(path, DATABASE_FILE_MODE)?;
    Ok(())
}

/// Sets `path`'s permission bits to `mode` if they differ, saying so.
#[cfg(unix)]
fn restrict(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let found = std::fs::metadata(path)?.permissions().mode() & 0o777;
    if found != mode {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
        tracing::info!(path = %path.display(), "made owner-only (mode {mode:o}, was {found:o})");
    }
    Ok(())
}

/// Rewrites the request-id keys of a store written before they were hashed: each
/// "<sequencer> <request id>" becomes [`crate::schema::request_key`]'s form, with its serial,
/// fingerprint and acknowledgement unchanged, so a retry after the upgrade is still answered
/// with its first outcome. At most [`crate::limits::REQUEST_IDS_RETAINED_MAX`] keys.
fn hash_request_keys(txn: &redb::WriteTransaction) -> Result<(), StoreError> {
    let legacy: Vec<(u64, String)> = {
        let order = txn.open_table(REQUEST_ORDER_TABLE)?;
        let mut legacy = Vec::new();
        for row in order.iter()? {
            let (serial, key) = row?;
            if !key.value().starts_with(REQUEST_KEY_PREFIX) {
                legacy.push((serial.value(), key.value().to_owned()));
            }
        }
        legacy
    };
    if legacy.is_empty() {
        return Ok(());
    }
    let mut order = txn.open_table(REQUEST_ORDER_TABLE)?;
    let mut requests = txn.open_table(REQUESTS_TABLE)?;
    for (serial, old_key) in &legacy {
        let Some((sequencer, request_id)) = old_key.split_once(' ') else {
            return Err(StoreError::Corrupt {
                message: format!("request-id key {old_key:?} names no request id"),
            });
        };
        let new_key = request_key(sequencer, request_id);
        let Some(row) = requests.remove(old_key.as_str())? else {
            return Err(StoreError::Corrupt {
                message: "the request-id order table names a request the request-id table lacks"
                    .into(),
            });
        };
        let (row_serial, fingerprint, ack) = row.value();
        let ack = ack.to_vec();
        drop(row);
        requests.insert(new_key.as_str(), (row_serial, fingerprint, ack.as_slice()))?;
        order.insert(*serial, new_key.as_str())?;
    }
    tracing::info!(
        keys = legacy.len(),
        "request ids now keyed by a hash of the sequencer instead of the sequencer"
    );
    Ok(())
}

fn validate_txn(request: &BatchRequest) -> Result<(), StoreError> {
    if request.ops.is_empty() && request.compare.is_empty() {
        return Err(StoreError::InvalidRequest {
            message: "a transaction needs at least one operation".into(),
        });
    }
    if request.ops.len() > BATCH_OPS_MAX {
        return Err(StoreError::too_large(
            "batch",
            "batch_ops_max",
            Some(request.ops.len()),
            BATCH_OPS_MAX,
        ));
    }
    if request.compare.len() > COMPARES_MAX {
        return Err(StoreError::too_large(
            "compare list",
            "compares_max",
            Some(request.compare.len()),
            COMPARES_MAX,
        ));
    }
    for condition in &request.compare {
        validate_key(condition.key())?;
        if let Compare::Value { value, .. } = condition {
            validate_value(value)?;
        }
    }
    for op in &request.ops {
        validate_key(op.key())?;
        if let BatchOp::Put { value, .. } = op {
            validate_value(value)?;
        }
    }
    Ok(())
}

/// A key is 1..=[`KEY_BYTES_MAX`] bytes of UTF-8 without control characters.
pub fn validate_key(key: &str) -> Result<(), StoreError> {
    if key.is_empty() {
        return Err(StoreError::InvalidKey {
            message: "key is empty".into(),
        });
    }
    if key.len() > KEY_BYTES_MAX {
        return Err(StoreError::too_large(
            "key",
            "key_bytes_max",
            Some(key.len()),
            KEY_BYTES_MAX,
        ));
    }
    if key.chars().any(char::is_control) {
        return Err(StoreError::InvalidKey {
            message: "key contains a control character".into(),
        });
    }
    Ok(())
}

fn validate_value(value: &[u8]) -> Result<(), StoreError> {
    if value.len() > VALUE_BYTES_MAX {
        return Err(StoreError::too_large(
            "value",
            "value_bytes_max",
            Some(value.len()),
            VALUE_BYTES_MAX,
        ));
    }
    Ok(())
}

/// A request id is 1..=[`REQUEST_ID_BYTES_MAX`] bytes of printable ASCII without spaces.
pub fn validate_request_id(request_id: &str) -> Result<(), StoreError> {
    if request_id.is_empty() {
        return Err(StoreError::InvalidRequest {
            message: "request id is empty".into(),
        });
    }
    if request_id.len() > REQUEST_ID_BYTES_MAX {
        return Err(StoreError::too_large(
            "request id",
            "request_id_bytes_max",
            Some(request_id.len()),
            REQUEST_ID_BYTES_MAX,
        ));
    }
    if !request_id.bytes().all(|byte| (0x21..=0x7e).contains(&byte)) {
        return Err(StoreError::InvalidRequest {
            message: "request id must be printable ASCII without spaces".into(),
        });
    }
    Ok(())
}
