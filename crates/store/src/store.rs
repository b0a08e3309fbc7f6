//! [`Store`]: the fenced key/value store itself, without HTTP — one redb file, fenced by
//! [`palisade_fence::RedbFence`].
//!
//! # Scope: the lock, and each key bound to one lock
//!
//! The fence scope of a write is **the sequencer's lock**: the store keeps one accepted maximum
//! per lock, in the fence table, and a write with token `t` of lock `L` is refused as stale if
//! any write of `L` with a larger token was ever accepted — whichever keys that write touched.
//! On top of that, **each key is bound to the lock of its first fenced write**, and a sequencer
//! of any other lock is refused as `wrong_lock` (invariant 4).
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
//! # One write = one transaction
//!
//! A put, a delete and a whole batch are each one redb write transaction: the fence check and
//! advance ([`RedbFence::begin`]), the key-binding checks, the writes and the request-id record
//! commit together with [`redb::Durability::Immediate`] (fsync) before the caller hears "ok",
//! or not at all (invariant 3).
//!
//! # Retries
//!
//! A write may carry a request id. The acknowledgement of an accepted write is stored under
//! (sequencer, request id) in the same transaction; a retry with the same pair gets the stored
//! acknowledgement back (marked `replayed`) and is not applied again, even if a newer grant has
//! written since (invariant 8). The newest [`REQUEST_IDS_RETAINED_MAX`] ids are kept.

use std::path::{Path, PathBuf};

use palisade_fence::{FencedTxn, RedbFence, Verifier};
use palisade_sequencer::{PublicKey, VerifiedSequencer};
use redb::{
    Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition,
    WriteTransaction,
};

use crate::StoreError;
use crate::limits::{
    BATCH_OPS_MAX, KEY_BYTES_MAX, REQUEST_ID_BYTES_MAX, REQUEST_IDS_RETAINED_MAX, VALUE_BYTES_MAX,
};
use crate::types::{BatchOp, Entry, FenceView, OpAck, OpKind, WriteAck};

/// The name of the database file inside the data directory.
pub const DATABASE_FILE_NAME: &str = "store.redb";

/// key → (lock, token, session, live, value). A row with `live == false` is a tombstone.
const KV_TABLE: TableDefinition<'static, &str, (&str, u64, u64, bool, &[u8])> =
    TableDefinition::new("palisade_store_kv");

/// "<sequencer> <request id>" → (serial, request fingerprint, acknowledgement JSON).
const REQUESTS_TABLE: TableDefinition<'static, &str, (u64, u64, &[u8])> =
    TableDefinition::new("palisade_store_requests");

/// serial → "<sequencer> <request id>", oldest first, to forget the oldest request id.
const REQUEST_ORDER_TABLE: TableDefinition<'static, u64, &str> =
    TableDefinition::new("palisade_store_request_order");

/// Benchmark-only: same row shape as [`KV_TABLE`], written by [`Store::put_unfenced`].
const UNFENCED_BENCH_TABLE: TableDefinition<'static, &str, (&str, u64, u64, bool, &[u8])> =
    TableDefinition::new("palisade_store_unfenced_bench");

/// The fenced store: a redb database in a data directory, and the lock service's public key.
///
/// All methods block (on fsync, and while another write transaction runs); call them from a
/// blocking thread in async code.
#[derive(Debug)]
pub struct Store {
    fence: RedbFence,
    path: PathBuf,
    /// Checks sequencers once each; a holder's many writes pay for one signature check.
    verifier: Verifier,
}

impl Store {
    /// Opens (or creates) the store in `dir`, verifying sequencers with `public_key`.
    ///
    /// Fails if another process has the store open.
    pub fn open(dir: impl AsRef<Path>, public_key: PublicKey) -> Result<Store, StoreError> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).map_err(|error| StoreError::Storage {
            message: format!("cannot create data directory {}: {error}", dir.display()),
        })?;
        let path = dir.join(DATABASE_FILE_NAME);
        let db = Database::create(&path).map_err(|error| StoreError::Storage {
            message: format!("cannot open {}: {error}", path.display()),
        })?;
        // Create the tables once, so readers never see "table does not exist".
        let mut txn = db.begin_write()?;
        txn.set_durability(Durability::Immediate)?;
        txn.open_table(KV_TABLE)?;
        txn.open_table(REQUESTS_TABLE)?;
        txn.open_table(REQUEST_ORDER_TABLE)?;
        txn.open_table(palisade_fence::redb::FENCE_TABLE)?;
        txn.commit()?;
        Ok(Store {
            fence: RedbFence::new(db),
            verifier: Verifier::new(public_key),
            path,
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The key sequencers are verified with.
    pub fn public_key(&self) -> &PublicKey {
        self.verifier.public_key()
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
        validate_key(key)?;
        validate_value(value)?;
        self.write(sequencer, &[OpRef::Put { key, value }], request_id)
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
        validate_key(key)?;
        self.write(sequencer, &[OpRef::Delete { key }], request_id)
    }

    /// Applies `ops` in order as one fenced unit: one check of the sequencer, and either every
    /// operation is applied, durably, or none is.
    pub fn batch(
        &self,
        sequencer: Option<&str>,
        ops: &[BatchOp],
        request_id: Option<&str>,
    ) -> Result<WriteAck, StoreError> {
        if ops.is_empty() {
            return Err(StoreError::InvalidRequest {
                message: "a batch needs at least one operation".into(),
            });
        }
        if ops.len() > BATCH_OPS_MAX {
            return Err(StoreError::too_large(
                "batch",
                "batch_ops_max",
                Some(ops.len()),
                BATCH_OPS_MAX,
            ));
        }
        let mut refs = Vec::with_capacity(ops.len());
        for op in ops {
            validate_key(op.key())?;
            refs.push(match op {
                BatchOp::Put { key, value } => {
                    validate_value(value)?;
                    OpRef::Put { key, value }
                }
                BatchOp::Delete { key } => OpRef::Delete { key },
            });
        }
        self.write(sequencer, &refs, request_id)
    }

    /// The current value of `key` and the grant that wrote it; `None` if the key was never
    /// written or is deleted. Reads need no sequencer.
    pub fn get(&self, key: &str) -> Result<Option<Entry>, StoreError> {
        validate_key(key)?;
        let txn = self.fence.database().begin_read()?;
        let table = txn.open_table(KV_TABLE)?;
        let Some(row) = table.get(key)? else {
            return Ok(None);
        };
        let (lock, token, session, live, value) = row.value();
        if !live {
            return Ok(None);
        }
        Ok(Some(Entry {
            key: key.to_owned(),
            value: value.to_vec(),
            lock: lock.to_owned(),
            token,
            session,
        }))
    }

    /// What the store has accepted for `lock`.
    pub fn fence_state(&self, lock: &str) -> Result<FenceView, StoreError> {
        let state = self.fence.fence_state(lock)?;
        Ok(FenceView {
            lock: lock.to_owned(),
            token_max: state.as_ref().map(|state| state.token_max),
            holder_session: state.as_ref().map(|state| state.holder_session),
        })
    }

    /// Checks that the database can be read.
    pub fn health(&self) -> Result<(), StoreError> {
        let txn = self.fence.database().begin_read()?;
        txn.open_table(KV_TABLE)?;
        Ok(())
    }

    /// **Benchmark only — never use it to store data.** The write path of [`Store::put`]
    /// without the fence: no sequencer, no check, no advance, no key binding; the same row
    /// shape, durability and transaction, into a separate table that [`Store::get`] never
    /// reads. It exists to measure what the fence costs ("fenced write vs the same write
    /// unfenced", DESIGN.md §6).
    #[doc(hidden)]
    pub fn put_unfenced(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        validate_key(key)?;
        validate_value(value)?;
        let mut txn = self.fence.database().begin_write()?;
        txn.set_durability(Durability::Immediate)?;
        {
            let mut table = txn.open_table(UNFENCED_BENCH_TABLE)?;
            table.insert(key, ("", 0, 0, true, value))?;
        }
        txn.commit()?;
        Ok(())
    }

    fn verify(&self, sequencer: Option<&str>) -> Result<VerifiedSequencer, StoreError> {
        Ok(self.verifier.verify(sequencer)?)
    }

    fn write(
        &self,
        sequencer: Option<&str>,
        ops: &[OpRef<'_>],
        request_id: Option<&str>,
    ) -> Result<WriteAck, StoreError> {
        if let Some(request_id) = request_id {
            validate_request_id(request_id)?;
        }
        let sequencer = self.verify(sequencer)?;
        let fingerprint = fingerprint(ops);
        let request = request_id.map(|request_id| RequestKey {
            key: format!("{} {request_id}", sequencer.as_str()),
            request_id,
            fingerprint,
        });

        // A retry of a committed write: answer with its outcome, even if the fence would now
        // refuse the sequencer.
        if let Some(request) = &request
            && let Some(ack) = self.committed_ack(request)?
        {
            return Ok(ack);
        }
        let fenced = match self.fence.begin(&sequencer, sequencer.lock()) {
            Ok(fenced) => fenced,
            Err(error) => {
                // The original of this retry may have committed after the lookup above.
                if let Some(request) = &request
                    && let Some(ack) = self.committed_ack(request)?
                {
                    return Ok(ack);
                }
                return Err(error.into());
            }
        };
        // Inside the write transaction nothing else commits: this lookup is authoritative.
        if let Some(request) = &request {
            let replay = stored_ack(&fenced.txn().open_table(REQUESTS_TABLE)?, request)?;
            if let Some(ack) = replay {
                fenced.abort()?;
                return Ok(ack);
            }
        }
        assert_eq!(fenced.state().lock, sequencer.lock());
        assert_eq!(fenced.state().token_max, sequencer.token());

        let ack = WriteAck {
            lock: sequencer.lock().to_owned(),
            token: sequencer.token(),
            session: sequencer.session(),
            ops: apply(&fenced, &sequencer, ops)?,
            request_id: request_id.map(str::to_owned),
            replayed: false,
        };
        if let Some(request) = &request {
            record_request(fenced.txn(), request, &ack)?;
        }
        // Dropping `fenced` on an error above aborted everything, the token advance included.
        fenced.commit()?;
        Ok(ack)
    }

    fn committed_ack(&self, request: &RequestKey<'_>) -> Result<Option<WriteAck>, StoreError> {
        let txn = self.fence.database().begin_read()?;
        stored_ack(&txn.open_table(REQUESTS_TABLE)?, request)
    }
}

/// One operation, borrowed from the caller.
enum OpRef<'a> {
    Put { key: &'a str, value: &'a [u8] },
    Delete { key: &'a str },
}

impl OpRef<'_> {
    fn key(&self) -> &str {
        match self {
            OpRef::Put { key, .. } | OpRef::Delete { key } => key,
        }
    }
}

struct RequestKey<'a> {
    key: String,
    request_id: &'a str,
    fingerprint: u64,
}

/// Applies `ops` inside the fenced transaction, refusing the whole write if any key is bound
/// to another lock.
fn apply(
    fenced: &FencedTxn,
    sequencer: &VerifiedSequencer,
    ops: &[OpRef<'_>],
) -> Result<Vec<OpAck>, StoreError> {
    let mut table = fenced.txn().open_table(KV_TABLE)?;
    let mut acks = Vec::with_capacity(ops.len());
    for op in ops {
        let key = op.key();
        let existing = table.get(key)?.map(|row| {
            let (lock, token, _, live, _) = row.value();
            (lock.to_owned(), token, live)
        });
        if let Some((lock, token, _)) = &existing {
            if lock != sequencer.lock() {
                return Err(StoreError::WrongLock {
                    key: Some(key.to_owned()),
                    expected: lock.clone(),
                    presented: sequencer.lock().to_owned(),
                });
            }
            // Pair of the fence's own assertion: a key's token never exceeds its lock's
            // accepted maximum, which the sequencer's token has just reached.
            assert!(
                *token <= sequencer.token(),
                "store invariant broken: key {key:?} holds token {token}, above the accepted token {} of lock {lock:?}",
                sequencer.token()
            );
        }
        let existed = existing.as_ref().is_some_and(|(_, _, live)| *live);
        let row = (sequencer.lock(), sequencer.token(), sequencer.session());
        match op {
            OpRef::Put { value, .. } => {
                table.insert(key, (row.0, row.1, row.2, true, *value))?;
            }
            // A tombstone keeps the binding; a key that never existed needs none.
            OpRef::Delete { .. } if existing.is_some() => {
                table.insert(key, (row.0, row.1, row.2, false, &[][..]))?;
            }
            OpRef::Delete { .. } => {}
        }
        acks.push(OpAck {
            op: match op {
                OpRef::Put { .. } => OpKind::Put,
                OpRef::Delete { .. } => OpKind::Delete,
            },
            key: key.to_owned(),
            existed,
        });
    }
    Ok(acks)
}

fn stored_ack(
    table: &impl ReadableTable<&'static str, (u64, u64, &'static [u8])>,
    request: &RequestKey<'_>,
) -> Result<Option<WriteAck>, StoreError> {
    let Some(row) = table.get(request.key.as_str())? else {
        return Ok(None);
    };
    let (_, fingerprint, ack) = row.value();
    if fingerprint != request.fingerprint {
        return Err(StoreError::RequestIdReused {
            request_id: request.request_id.to_owned(),
        });
    }
    let mut ack: WriteAck = serde_json::from_slice(ack).map_err(|error| StoreError::Corrupt {
        message: format!(
            "stored outcome of request {:?}: {error}",
            request.request_id
        ),
    })?;
    ack.replayed = true;
    Ok(Some(ack))
}

fn record_request(
    txn: &WriteTransaction,
    request: &RequestKey<'_>,
    ack: &WriteAck,
) -> Result<(), StoreError> {
    let ack_json = serde_json::to_vec(ack).map_err(StoreError::storage)?;
    let mut order = txn.open_table(REQUEST_ORDER_TABLE)?;
    let serial = match order.last()? {
        Some((serial, _)) => serial.value() + 1,
        None => 0,
    };
    order.insert(serial, request.key.as_str())?;
    let mut requests = txn.open_table(REQUESTS_TABLE)?;
    requests.insert(
        request.key.as_str(),
        (serial, request.fingerprint, ack_json.as_slice()),
    )?;
    while requests.len()? > REQUEST_IDS_RETAINED_MAX {
        let oldest = order
            .pop_first()?
            .map(|(_, key)| key.value().to_owned())
            .ok_or_else(|| StoreError::Corrupt {
                message: "request-id table is larger than its order table".into(),
            })?;
        requests.remove(oldest.as_str())?;
    }
    Ok(())
}

/// FNV-1a over the operations: tells a retry from a different request reusing its request id.
fn fingerprint(ops: &[OpRef<'_>]) -> u64 {
    fn feed(hash: &mut u64, bytes: &[u8]) {
        for byte in (bytes.len() as u64).to_le_bytes().iter().chain(bytes) {
            *hash ^= u64::from(*byte);
            *hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    let mut hash = 0xcbf2_9ce4_8422_2325;
    for op in ops {
        match op {
            OpRef::Put { key, value } => {
                feed(&mut hash, b"put");
                feed(&mut hash, key.as_bytes());
                feed(&mut hash, value);
            }
            OpRef::Delete { key } => {
                feed(&mut hash, b"delete");
                feed(&mut hash, key.as_bytes());
            }
        }
    }
    hash
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
